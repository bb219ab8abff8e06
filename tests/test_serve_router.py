"""Serve's driver-side router loop (``contamray/serve/router_loop.py``), on a real local Ray and Serve.

A handle call starts Serve's router thread in this process. Across Ray sessions (this suite's ``ray.shutdown()``
stops the router first, ``tests/conftest.py``) no router thread of an old session survives, and a handle in the
next session starts a new one and is answered; ``stop_driver_router`` ends that thread too.
"""

from __future__ import annotations

import threading

import pytest
import ray
from ray import serve

from contamray.serve.router_loop import stop_driver_router

pytestmark = pytest.mark.slow


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
class Echo:
    def __call__(self, x: int) -> int:
        return x


def router_threads() -> list[threading.Thread]:
    """Serve's router threads alive in this process (Python names a thread after its target function)."""
    return [t for t in threading.enumerate() if "_run_router_event_loop" in t.name and t.is_alive()]


def start_ray() -> None:
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)


@pytest.fixture(scope="module")
def local_ray():
    start_ray()
    yield
    serve.shutdown()
    ray.shutdown()


def test_no_router_thread_outlives_its_ray_session_and_the_next_session_is_served(local_ray):
    handle = serve.run(Echo.bind(), name="echo", route_prefix=None)
    assert handle.remote(5).result(timeout_s=120) == 5
    assert len(router_threads()) == 1
    serve.shutdown()
    ray.shutdown()  # this suite's ray.shutdown stops the router first (tests/conftest.py)
    assert router_threads() == []
    start_ray()
    handle = serve.run(Echo.bind(), name="echo", route_prefix=None)
    assert handle.remote(6).result(timeout_s=120) == 6  # a new router loop, following the new controller
    (thread,) = router_threads()
    assert stop_driver_router() is True
    thread.join(timeout=10)
    assert not thread.is_alive() and router_threads() == []
    assert stop_driver_router() is False  # nothing left to stop
