"""Serve's driver-side router loop (``contamray/serve/router_loop.py``), on a real local Ray and Serve.

A handle call starts Serve's router thread in this process. Across Ray sessions (this suite's ``ray.shutdown()``
stops the router first, ``tests/conftest.py``) no router thread of an old session survives, and a handle in the
next session starts a new one and is answered; ``stop_driver_router`` ends that thread too.

The sessions run in a Python process of their own, with the suite's guarded ``ray.shutdown``: the subject is one
process's threads across sessions, so the process starts with none (an xdist worker carries what earlier modules
left), and a Ray crash in it fails this test with its output instead of ending the worker (CI lost a worker once
in this module's teardown, with no output to tell why).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

SESSIONS = """
import json, threading
import ray
from ray import serve
from contamray.serve.router_loop import stop_driver_router
from tests.conftest import _stop_serve_router_before_ray_shutdown

_stop_serve_router_before_ray_shutdown()  # as in every process of this suite


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
class Echo:
    def __call__(self, x: int) -> int:
        return x


def router_threads():
    # Serve's router threads alive in this process (Python names a thread after its target function)
    return [t for t in threading.enumerate() if "_run_router_event_loop" in t.name and t.is_alive()]


def report(**facts):
    print("FACTS " + json.dumps(facts), flush=True)


ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
serve.start(proxy_location="Disabled")  # handles only: no proxy on port 8000, which another process may hold
handle = serve.run(Echo.bind(), name="echo", route_prefix=None)
report(first_answer=handle.remote(5).result(timeout_s=120), threads_in_first_session=len(router_threads()))
serve.shutdown()
ray.shutdown()  # guarded: the router stops first
report(threads_after_first_session=len(router_threads()))
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
serve.start(proxy_location="Disabled")  # handles only: no proxy on port 8000, which another process may hold
handle = serve.run(Echo.bind(), name="echo", route_prefix=None)
report(second_answer=handle.remote(6).result(timeout_s=120))  # a new router loop, following the new controller
threads = router_threads()
report(threads_in_second_session=len(threads), stopped=stop_driver_router())
for thread in threads:
    thread.join(timeout=10)
report(threads_after_stop=len(router_threads()), stopped_again=stop_driver_router())
serve.shutdown()
ray.shutdown()
report(done=True)
"""


def test_no_router_thread_outlives_its_ray_session_and_the_next_session_is_served():
    ray_tmp = tempfile.mkdtemp(prefix="cr-router-", dir="/tmp")  # its own Ray temp dir: short (socket paths)
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_TMPDIR=ray_tmp)
    env.pop("RAY_ADDRESS", None)
    try:
        proc = subprocess.run([sys.executable, "-c", SESSIONS], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=600)  # fmt: skip
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    facts: dict[str, object] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("FACTS "):
            facts.update(json.loads(line[len("FACTS "):]))
    output = f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert facts.get("done") is True and proc.returncode == 0, output
    assert facts["first_answer"] == 5 and facts["threads_in_first_session"] == 1, facts
    assert facts["threads_after_first_session"] == 0, facts  # the suite's ray.shutdown stopped it
    assert facts["second_answer"] == 6 and facts["threads_in_second_session"] == 1, facts
    assert facts["stopped"] is True and facts["threads_after_stop"] == 0, facts
    assert facts["stopped_again"] is False, facts  # nothing left to stop
