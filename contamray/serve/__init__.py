"""The on-demand HTTP API of contamray on Ray Serve (``contamray serve``; README "On-demand API").

``app`` is the Serve application, built when first read, so ``serve run contamray.serve:app`` works and
importing this package stays cheap: settings from ``conf/api/server.yaml`` with the overrides in
``CONTAMRAY_SERVE_OVERRIDES`` (space-separated ``key=value``), tokens from ``CONTAMRAY_API_TOKENS`` /
``CONTAMRAY_API_TOKENS_FILE``. ``app_builder`` takes the overrides as Serve builder arguments instead:
``serve run contamray.serve:app_builder port=8001 insecure_local=true``.

Modules: ``api`` (routes, the deployment), ``check`` (per-item checks through the pipeline's code),
``jobs`` (Ray Jobs), ``security`` (tokens, limits, errors), ``config`` (settings), ``catalog`` (method
and benchmark descriptions), ``command`` (the CLI).
"""

from __future__ import annotations

import os
import shlex
from typing import Any

OVERRIDES_ENV = "CONTAMRAY_SERVE_OVERRIDES"


def app_builder(args: dict[str, Any]) -> Any:
    """The application with ``args`` as server settings: ``serve run contamray.serve:app_builder k=v``, or a
    Serve config's ``args`` mapping (``deploy/serve_config.yaml``)."""
    from contamray.serve.api import build_app
    from contamray.serve.config import load_settings

    return build_app(load_settings(values=dict(args)))


def __getattr__(name: str) -> Any:
    if name == "app":
        from contamray.serve.api import build_app

        return build_app(overrides=shlex.split(os.environ.get(OVERRIDES_ENV, "")))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
