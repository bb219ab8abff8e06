"""What stops a run from outside, and how the parts of a run say they stopped.

``STOPPED``: the exceptions a stop raises in the driver's main thread - ``KeyboardInterrupt`` (Ctrl-C) and
``SystemExit`` (SIGTERM: ``ray job stop``, a scheduler, ``kill``; the handler ``ray.init`` installs in a driver
turns it into ``sys.exit(15)``). The driver then sets its ``EnginePools.stopping`` event, and every part that
waits on the cluster in another thread - a stage's batches (``pipeline/engine_pool.py``), a deployment coming up
(``serve/hosting.py``), an injected model's fine-tune (``pipeline/injections.py``) - stops waiting and raises
``RunInterrupted``, keeping what it finished.

A multirun sweep runs its jobs in threads of one driver (``hydra_plugins/contamray_launcher``), so the stop
reaches the launcher's main thread, not the jobs: it calls ``stop_all``, which sets the stop event of every run's
``EnginePools`` open now or opened later in the sweep (``watch``) and answers ``stop_requested`` for the parts
that wait on no model (a corpus scan's stream of matches); each job then ends as a stopped single run does.

``take_sigterm``: once Ray is up, SIGTERM goes to a Python handler alone. Ray's core worker installs Abseil's
failure-signal handler in front of ``ray.init``'s: it logs the signal, chains to the Python handler, and arms a 3 s
alarm that aborts the process (SIGABRT) whatever the clean-up is doing - deleting the deployments, writing what is
stored, exiting with 143.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

STOPPED = (KeyboardInterrupt, SystemExit)

_SWEEP_STOPPED = threading.Event()  # set by stop_all, cleared when a sweep starts (reset)
_OPEN: set[threading.Event] = set()  # the stop events of the runs' EnginePools open now
_OPEN_LOCK = threading.Lock()


def watch(event: threading.Event) -> None:
    """``event`` (a run's ``EnginePools.stopping``, while the pools are open) is set by ``stop_all`` - at once if the
    sweep was stopped before."""
    with _OPEN_LOCK:
        _OPEN.add(event)
        if _SWEEP_STOPPED.is_set():
            event.set()


def unwatch(event: threading.Event) -> None:
    with _OPEN_LOCK:
        _OPEN.discard(event)


def stop_all() -> None:
    """Stop every run of this process (a sweep's jobs): see the module's docstring."""
    with _OPEN_LOCK:
        _SWEEP_STOPPED.set()
        for event in _OPEN:
            event.set()


def stop_requested() -> bool:
    return _SWEEP_STOPPED.is_set()


def reset() -> None:
    """A sweep starts: nothing is stopped."""
    _SWEEP_STOPPED.clear()


def exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """What ``ray.init`` installs in a driver: SIGTERM raises ``SystemExit(15)`` in the main thread."""
    sys.exit(signum)


def take_sigterm(handler: Callable[[int, FrameType | None], Any] = exit_on_sigterm) -> None:
    """Make ``handler`` SIGTERM's only handler (call it after ``ray.init``; see the module's docstring). Signal
    handlers belong to the main thread: from another one (a multirun job's) nothing is changed."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def exit_stopped(stop: BaseException, kept: str) -> NoReturn:
    """Say on stderr how the driver was stopped and what it ``kept``, then exit as a stopped process does: 130 for
    Ctrl-C, 143 (128 + SIGTERM) for SIGTERM's ``SystemExit``."""
    if isinstance(stop, KeyboardInterrupt):
        print(f"interrupted: {kept}", file=sys.stderr)
        sys.exit(130)
    print(f"stopped (SIGTERM): {kept}", file=sys.stderr)
    sys.exit(128 + signal.SIGTERM)


class RunInterrupted(Exception):
    """The run was told to stop (Ctrl-C, SIGTERM) while this part of it waited on the cluster."""
