"""What stops a run from outside, and how the parts of a run say they stopped.

``STOPPED``: the exceptions a stop raises in the driver's main thread - ``KeyboardInterrupt`` (Ctrl-C) and
``SystemExit`` (SIGTERM: ``ray job stop``, a scheduler, ``kill``; the handler ``ray.init`` installs in a driver
turns it into ``sys.exit(15)``). The driver then sets its ``EnginePools.stopping`` event, and every part that
waits on the cluster in another thread - a stage's batches (``pipeline/engine_pool.py``), a deployment coming up
(``serve/hosting.py``), an injected model's fine-tune (``pipeline/injections.py``) - stops waiting and raises
``RunInterrupted``, keeping what it finished.

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
from typing import Any

STOPPED = (KeyboardInterrupt, SystemExit)


def exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """What ``ray.init`` installs in a driver: SIGTERM raises ``SystemExit(15)`` in the main thread."""
    sys.exit(signum)


def take_sigterm(handler: Callable[[int, FrameType | None], Any] = exit_on_sigterm) -> None:
    """Make ``handler`` SIGTERM's only handler (call it after ``ray.init``; see the module's docstring). Signal
    handlers belong to the main thread: from another one (a multirun job's) nothing is changed."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


class RunInterrupted(Exception):
    """The run was told to stop (Ctrl-C, SIGTERM) while this part of it waited on the cluster."""
