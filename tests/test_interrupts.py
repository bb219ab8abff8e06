"""SIGTERM (``ray job stop``, a scheduler, ``kill``) lets a driver finish its clean-up and exit with its own status.

Once Ray is up, its core worker's failure-signal handler (Abseil's) stands in front of the Python one and arms a
3 s alarm that aborts the process: a run stopped by SIGTERM ended by SIGABRT 3 s after the signal, whether or not
its deployments were deleted (``contamray/interrupts.py``: ``take_sigterm``); and ``contamray serve``'s own
handler (SIGTERM as Ctrl-C: Serve shut down) was replaced by ``ray.init``'s. Real local Rays in subprocesses.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from ray._private.ray_constants import DEFAULT_DASHBOARD_PORT

from tests.ray_head import free_ports

REPO = Path(__file__).resolve().parents[1]
CLEAN_UP_S = 6  # longer than Ray's 3 s alarm

DRIVER = f"""
import os, signal, sys, time
from contamray.run import init_ray

init_ray({{"num_cpus": 1}})
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(120)
except SystemExit as stop:
    time.sleep({CLEAN_UP_S})  # a clean-up as a stopped run's: deployments deleted, progress written
    print("cleaned up after", stop.code, flush=True)
    sys.exit(128 + stop.code)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("RAY_ADDRESS", None)
    return env


def test_a_driver_stopped_by_sigterm_finishes_its_clean_up_and_exits_143():
    proc = subprocess.run([sys.executable, "-c", DRIVER], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert "cleaned up after 15" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.returncode == 143, (proc.returncode, proc.stderr[-4000:])  # was -6: SIGABRT mid clean-up


@contextmanager
def ray_dashboard_port_taken() -> Iterator[None]:
    """127.0.0.1:8265 (Ray's default dashboard port) held, as by another Ray on this machine - or already held."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", DEFAULT_DASHBOARD_PORT))
        sock.listen()
    except OSError:
        pass  # another Ray (a test in the other worker) has it: taken either way
    try:
        yield
    finally:
        sock.close()


@pytest.mark.slow
def test_the_api_stopped_by_sigterm_shuts_serve_down_and_exits_0(tmp_path: Path):
    (port,) = free_ports(1)
    args = [sys.executable, "-m", "contamray.cli", "serve", "--insecure-local", "--port", str(port), "ray.num_cpus=2",
            f"jobs.output_root={tmp_path}"]  # fmt: skip
    lines: list[str] = []
    with ray_dashboard_port_taken():  # was: "Failed to bind to 127.0.0.1:8265 because it's already occupied"
        proc = subprocess.Popen(args, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)  # fmt: skip
        _stop_when_up(proc, lines)
    # was 15: ray.init had replaced the command's handler (SIGTERM as Ctrl-C) with its own sys.exit, so Serve was not
    # shut down; with that mended, Ray's 3 s abort cut the shutdown (about 5 s) short
    assert proc.returncode == 0, (proc.returncode, "".join(lines)[-4000:])
    dashboards = [line for line in lines if line.startswith("local Ray dashboard (Jobs API) at")]
    assert dashboards and not dashboards[0].rstrip().endswith(f":{DEFAULT_DASHBOARD_PORT}"), "".join(lines)[-4000:]


def _stop_when_up(proc: subprocess.Popen, lines: list[str]) -> None:
    """Read the API's output until it is up, then SIGTERM it and wait for its exit."""
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("contamray API at"):
                break
        assert lines and lines[-1].startswith("contamray API at"), "".join(lines)[-4000:]
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines.append(out)
    print(f"stopped {time.monotonic() - sent:.1f} s after SIGTERM")
