"""``contamray serve [--host H] [--port P] [--insecure-local] [overrides...]``: start the on-demand API and block.

Joins the cluster at ``ray.address`` / ``RAY_ADDRESS``, or starts a local Ray with its dashboard (the
Jobs API behind ``POST /v1/jobs`` lives there); starts Serve's HTTP proxy on ``host:port``, runs the
application (``serve/api.py``) and waits until interrupted. Overrides are keys of
``conf/api/server.yaml`` (``limits.max_items=8 'allow.models=[smollm2_135m_fp32]'``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any

from contamray.interrupts import take_sigterm


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="contamray serve",
        description="Serve contamination checks over HTTP (POST /v1/check, POST /v1/jobs, GET /v1/methods, "
        "GET /v1/benchmarks, /docs). Tokens: CONTAMRAY_API_TOKENS (comma-separated) or CONTAMRAY_API_TOKENS_FILE.",
    )
    p.add_argument("--host", default=None, help="interface to listen on (default: host in conf/api/server.yaml, "
                   "127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="TCP port (default 8000)")
    p.add_argument("--insecure-local", action="store_true",
                   help="serve without tokens; allowed only on 127.0.0.1")
    p.add_argument("overrides", nargs="*", help="key=value overrides of conf/api/server.yaml")
    return p


def start(settings: Any, app: Any) -> str:
    """Ray (joined or local), Serve's proxy on the settings' host and port, the app; returns its URL."""
    import ray
    from ray import serve

    from contamray.serve.api import APP_NAME

    if not ray.is_initialized():
        address = settings.ray.get("address") or None
        if address:
            ray.init(address=address)
        else:
            # "local": a Ray of our own, never a cluster someone else started on this machine
            kwargs: dict[str, Any] = {"address": "local", "include_dashboard": True, "dashboard_host": "127.0.0.1"}
            if settings.ray.get("num_cpus"):
                kwargs["num_cpus"] = int(settings.ray["num_cpus"])
            if settings.ray.get("dashboard_port"):
                kwargs["dashboard_port"] = int(settings.ray["dashboard_port"])
            context = ray.init(**kwargs)
            print(f"local Ray dashboard (Jobs API) at http://{context.dashboard_url}", flush=True)
        take_sigterm(_interrupt)  # `kill` stops it as Ctrl-C does, not cut short by Ray's 3 s abort
    serve.start(http_options={"host": settings.host, "port": settings.port})
    check_proxy()
    serve.run(app, name=APP_NAME, route_prefix="/")
    return f"http://{settings.host}:{settings.port}"


class NoProxyError(RuntimeError):
    """The cluster's Serve runs without an HTTP proxy, so the API could not be reached."""


def check_proxy() -> None:
    """Refuse to serve the API through a Serve instance without an HTTP proxy. Serve keeps the options it was
    first started with: on a cluster where a contamray run started it (runs reach their deployments through handles
    and start none), the API's ``serve.start`` joins that instance and its port is never opened."""
    from ray import serve

    if not serve.status().proxies:
        raise NoProxyError(
            "Serve already runs on this Ray cluster without an HTTP proxy (a contamray run started it: runs need "
            "none), and Serve keeps the options it was first started with, so the API could not be reached. Start "
            "the API before runs on a shared cluster (runs then share its Serve instance and deployments), or, "
            "with no run going, shut Serve down (`serve shutdown -y`) and start the API again"
        )


def main(argv: list[str]) -> int:
    from contamray.serve.api import build_app
    from contamray.serve.config import SettingsError, load_settings
    from contamray.serve.security import SecurityError

    args = parser().parse_args(argv)
    overrides = list(args.overrides)
    if args.host is not None:
        overrides.append(f"host={args.host}")
    if args.port is not None:
        overrides.append(f"port={args.port}")
    if args.insecure_local:
        overrides.append("insecure_local=true")
    try:
        settings = load_settings(overrides)
        app = build_app(settings)
    except (SettingsError, SecurityError) as err:
        print(f"contamray serve: {err}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops it as Ctrl-C does: Serve shut down, Ray too
    try:  # a stop at any point from here - Ray still starting, or the line below just printed - shuts down what is up
        try:
            url = start(settings, app)
        except NoProxyError as err:
            print(f"contamray serve: {err}", file=sys.stderr)
            return 2
        print(f"contamray API at {url} (OpenAPI docs: {url}/docs); Ctrl-C stops it", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        import ray
        from ray import serve

        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
