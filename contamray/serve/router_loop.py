"""Serve's request router in a driver process, stopped when the process leaves its Ray session.

A driver that calls a Serve deployment through a ``DeploymentHandle`` (contamray's hosted engines do) starts
Serve's process-wide router: an asyncio loop on a daemon thread (``SingletonThreadRouter``), running the
long-poll clients that follow the Serve controller, the router's metrics and a loop monitor. Ray does not stop
it on ``serve.shutdown()`` or ``ray.shutdown()``: the thread lives as long as the process. A process that runs
one Ray session (``python -m contamray.run``) never notices; one that shuts Ray down and starts another (a test
suite, a notebook) keeps the old loop and its periodic work alive through later sessions. Seen once in this
project's suite: an xdist worker lost as a later module shut Ray down, Ray's driver log naming a thread born
during the Serve module minutes before ("The core worker has already been shutdown. This happens when the
language frontend accesses the Ray's worker after it is shutdown. The process will exit").

``stop_driver_router`` shuts down the handles Serve's client caches, then stops that loop and its clients; a
later handle starts a new one (Serve creates the loop when none is set). Handles held elsewhere stop working:
call it when the process leaves its Ray session, not in the middle of one. Private Ray API (Ray 2.60): when it
has moved, nothing is stopped and False is returned.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time

log = logging.getLogger(__name__)


def stop_driver_router(timeout_s: float = 5.0) -> bool:
    """Stop this process's Serve router loop (its thread ends) and the long-poll clients on it; forget Serve's
    cache of shared long-poll clients. True when a running loop was stopped. Cheap when Serve's router was never
    imported (nothing to stop). Call it before ``ray.shutdown()`` in a process that starts another session."""
    router = sys.modules.get("ray.serve._private.router")
    if router is None:
        return False
    _shutdown_cached_handles()  # while their loop runs: a later serve.shutdown() finds none to shut down
    try:
        from ray.serve._private.long_poll import LongPollClient

        cls = router.SingletonThreadRouter
        with cls._asyncio_loop_creation_lock:
            loop, monitor = cls._asyncio_loop, cls._event_loop_monitor
            cls._asyncio_loop, cls._event_loop_monitor = None, None
    except AttributeError as err:  # pragma: no cover - a Ray whose router moved
        log.debug("Serve's router loop not found (%s); nothing stopped", err)
        return False
    forget_shared_clients()  # they are bound to the loop stopped below
    if loop is None or loop.is_closed():
        return False
    for obj in gc.get_objects():  # every client polling on this loop: no further poll is sent
        if type(obj) is LongPollClient and obj.event_loop is loop:  # type(): no attribute of a stranger read
            obj.stop()

    def cancel_all() -> None:
        if monitor is not None:
            monitor.stop()
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.call_soon(loop.stop)  # after the cancellations have run

    if not loop.is_running():
        return False
    loop.call_soon_threadsafe(cancel_all)
    deadline = time.monotonic() + timeout_s
    while loop.is_running() and time.monotonic() < deadline:
        time.sleep(0.01)
    if loop.is_running():
        log.warning("Serve's router loop did not stop within %.0f s; left running", timeout_s)
        return False
    return True


def forget_shared_clients() -> None:
    """Clear Serve's process-wide cache of controller long-poll clients (keyed by the controller's actor handle,
    whose id a new cluster can repeat: a cached client would route a new session's requests by the old
    controller's replica table, where they wait forever). Nothing to clear when Serve's router was never
    imported; skipped if the cache moved."""
    router = sys.modules.get("ray.serve._private.router")
    if router is None:
        return
    try:
        router.SharedRouterLongPollClient.get_or_create.cache_clear()
    except AttributeError:  # pragma: no cover - a Ray without that cache
        log.debug("no Serve long-poll client cache to clear")


def _shutdown_cached_handles() -> None:
    """Shut down the handles the Serve client of this process holds (each one's router, on the loop)."""
    context = sys.modules.get("ray.serve.context")
    client = getattr(context, "_global_client", None) if context is not None else None
    if client is None:
        return
    try:
        client.shutdown_cached_handles()
    except Exception as err:  # noqa: BLE001 - a handle of a session already gone: the loop is stopped anyway
        log.debug("Serve's cached handles not shut down (%s: %s)", type(err).__name__, err)
