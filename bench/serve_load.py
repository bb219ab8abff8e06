"""Load on the on-demand API: ``POST /v1/check`` with the embedded model at 1, 4 and 16 concurrent clients.

Starts a local Ray and the API on 127.0.0.1 only (a random bearer token, rate limit lifted), then:

(a) the baseline: the same check computed in this process without HTTP (``serve.check.Checker``, the
    same hosted model), ``--baseline`` times one after another;
(b) ``/v1/check`` over HTTP from 1, 4 and 16 client threads, each level bounded by ``--requests``
    requests and ``--seconds`` seconds, whichever ends first.

Each check scores ``--items`` short ``synthetic_facts`` rows with ``--method`` (default perplexity) and
reduces the partition verdict. Per level it prints the requests done and failed, p50 / p99 latency and
requests/s, and the ratios against the baseline: ``p50_ratio_vs_inprocess`` (HTTP p50 latency over the
in-process p50: the cost of the API, auth, validation and the proxy; > 1 under load is queueing on the
one model replica) and ``throughput_ratio_vs_inprocess`` (HTTP requests/s over the in-process sequential
rate). The last lines are ``failed_requests: <n>`` and the ratio at each concurrency.

Usage: ``python bench/serve_load.py --mirror ../shared/benchmarks [--requests 48] [--seconds 60]``.
Timings are wall clock on whatever else the machine is doing; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import requests

CONCURRENCY = (1, 4, 16)
MODEL = "smollm2_135m_fp32"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] if ordered else float("nan")


def load(url: str, token: str, body: dict, clients: int, max_requests: int, seconds: float) -> dict[str, float]:
    """``clients`` threads posting ``body`` until ``max_requests`` are sent or ``seconds`` have passed."""
    latencies: list[float] = []
    failed = 0
    sent = 0
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def client() -> None:
        nonlocal failed, sent
        session = requests.Session()
        headers = {"Authorization": f"Bearer {token}"}
        while True:
            with lock:
                if sent >= max_requests or time.perf_counter() > deadline:
                    return
                sent += 1
            started = time.perf_counter()
            try:
                ok = session.post(f"{url}/v1/check", json=body, headers=headers, timeout=max(seconds, 60)).ok
            except requests.RequestException:
                ok = False
            with lock:
                if ok:
                    latencies.append(time.perf_counter() - started)
                else:
                    failed += 1

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    return {"done": len(latencies), "failed": failed, "p50": percentile(latencies, 0.5),
            "p99": percentile(latencies, 0.99), "rps": len(latencies) / wall if wall else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", default=os.environ.get("CONTAMRAY_MIRROR_DIR", "../shared/benchmarks"))
    parser.add_argument("--method", default="perplexity")
    parser.add_argument("--items", type=int, default=4, help="items per check")
    parser.add_argument("--baseline", type=int, default=10, help="in-process checks for the baseline")
    parser.add_argument("--requests", type=int, default=48, help="at most this many requests per concurrency level")
    parser.add_argument("--seconds", type=float, default=60.0, help="at most this long per concurrency level")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    args = parser.parse_args()

    import ray
    from ray import serve

    from contamray.benchmarks import load_records
    from contamray.serve.api import APP_NAME, build_app
    from contamray.serve.check import Checker, Item
    from contamray.serve.config import load_settings

    mirror = str(Path(args.mirror).resolve())
    rows = load_records("synthetic_facts", n=args.items, seed=0, mirror_dir=mirror).records
    items = [Item(text=r.input, label=r.label, id=r.id) for r in rows]
    body = {"model": MODEL, "methods": [args.method],
            "items": [{"text": i.text, "label": i.label, "id": i.id} for i in items]}
    token = secrets.token_urlsafe(32)
    port = free_port()
    settings = load_settings([f"port={port}", f"data.mirror_dir={mirror}", "limits.requests_per_minute=1000000",
                              "limits.burst=1000000", f"deployment.max_ongoing_requests={max(CONCURRENCY) * 2}"])
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(settings, environ={"CONTAMRAY_API_TOKENS": token}), name=APP_NAME, route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        print(f"API at {url}; model {MODEL}; {args.items} items x {args.method} per check", flush=True)

        checker = Checker(settings)
        started = time.perf_counter()
        checker.check(MODEL, [args.method], items)  # the model's first load, and the plan, outside the timing
        print(f"first in-process check (model load, plan): {time.perf_counter() - started:.1f} s", flush=True)
        base: list[float] = []
        for _ in range(args.baseline):
            started = time.perf_counter()
            checker.check(MODEL, [args.method], items)
            base.append(time.perf_counter() - started)
        base_p50 = statistics.median(base)
        base_rps = len(base) / sum(base)
        print(f"{'in-process (no HTTP)':<22} n={len(base):<4} p50={base_p50 * 1000:8.1f} ms "
              f"p99={percentile(base, 0.99) * 1000:8.1f} ms {base_rps:6.2f} checks/s", flush=True)
        warm = load(url, token, body, 1, 2, args.seconds)  # the replica's plan and catalog caches
        failed = warm["failed"]
        ratios = {}
        for clients in CONCURRENCY:
            r = load(url, token, body, clients, args.requests, args.seconds)
            failed += r["failed"]
            ratios[clients] = (r["p50"] / base_p50, r["rps"] / base_rps)
            print(f"{f'HTTP, {clients} client(s)':<22} n={int(r['done']):<4} p50={r['p50'] * 1000:8.1f} ms "
                  f"p99={r['p99'] * 1000:8.1f} ms {r['rps']:6.2f} req/s  failed={int(r['failed'])}  "
                  f"p50_ratio_vs_inprocess={ratios[clients][0]:.2f}x "
                  f"throughput_ratio_vs_inprocess={ratios[clients][1]:.2f}x", flush=True)
        checker.close()
    finally:
        serve.shutdown()
        ray.shutdown()
    print(f"failed_requests: {failed}")
    for clients, (latency, throughput) in ratios.items():
        print(f"ratio_at_{clients}_clients: p50 {latency:.2f}x, throughput {throughput:.2f}x (vs in-process)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
