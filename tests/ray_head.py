"""A throwaway local Ray head for tests that need a real cluster address (the Jobs API, Serve's HTTP
proxy): ``ray start --head --block`` on free ports (its dashboard and Jobs agent among them: a machine
may run other Ray instances) and its own temp dir, stopped by its pid afterwards."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 right now."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass(frozen=True)
class RayHead:
    gcs: str  # "127.0.0.1:<port>", for ray.init(address=...)
    dashboard: str  # "http://127.0.0.1:<port>", for the Jobs API and RAY_ADDRESS
    temp: Path


@contextmanager
def ray_head(num_cpus: int, *extra: str, prefix: str = "crray") -> Iterator[RayHead]:
    ray_bin = shutil.which("ray")
    assert ray_bin, "the ray CLI is not on PATH"
    gcs, dash, client, agent, agent_grpc, env_agent, metrics, node_manager = free_ports(8)
    temp = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # short: Ray's socket paths have a limit
    env = dict(os.environ, RAY_AUTH_MODE="disabled")  # a throwaway local cluster: no token to hand out
    env.pop("RAY_ADDRESS", None)
    cmd = [
        ray_bin, "start", "--head", "--block", f"--port={gcs}", f"--dashboard-port={dash}",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--ray-client-server-port={client}",
        f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--runtime-env-agent-port={env_agent}", f"--metrics-export-port={metrics}",
        f"--node-manager-port={node_manager}", f"--num-cpus={num_cpus}", *extra, f"--temp-dir={temp}",
        "--disable-usage-stats",
    ]  # fmt: skip
    log = open(temp / "start.log", "w")  # noqa: SIM115 - closed at teardown
    # SIGINT stops it at teardown; a pytest-xdist worker ignores SIGINT and a child inherits that (Python then
    # installs no KeyboardInterrupt handler), which left every teardown waiting out the 60 s below: restored here
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=_default_sigint)  # fmt: skip
    dashboard = f"http://127.0.0.1:{dash}"
    deadline = time.time() + 180
    while True:
        try:
            with urllib.request.urlopen(f"{dashboard}/api/version", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            pytest.fail(f"local Ray head did not start: {(temp / 'start.log').read_text()[-3000:]}")
        time.sleep(1)
    try:
        yield RayHead(gcs=f"127.0.0.1:{gcs}", dashboard=dashboard, temp=temp)
    finally:
        proc.send_signal(signal.SIGINT)  # `ray start --block` stops the processes it started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the session we created for it, nothing else
            proc.wait(timeout=30)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)
