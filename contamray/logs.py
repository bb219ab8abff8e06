"""How contamray's log lines look and where they go: one format for every command and worker.

``configure`` is a command's set-up (``python -m contamray.run``, ``contamray inject / validate / calibrate``):
the root logger at ``$CONTAMRAY_LOG`` (default INFO) in ``FORMAT``. ``log_to_stderr`` is a Ray task's or actor's:
a worker process configures no handler, so its INFO lines (progress among them) were dropped, while Ray forwards
a worker's stderr to the driver's output (prefixed with the task's name) and keeps it in the task's log
(``ray logs``, the state API's ``get_log``).
"""

from __future__ import annotations

import logging
import os
import sys

FORMAT = "%(asctime)s %(levelname)s %(message)s"


def configure() -> None:
    """A command's logging: the root logger at ``$CONTAMRAY_LOG`` (default INFO), lines in ``FORMAT``."""
    logging.basicConfig(level=os.environ.get("CONTAMRAY_LOG", "INFO"), format=FORMAT)


def log_to_stderr() -> None:
    """contamray's log lines of this process (a Ray worker's) to stderr at INFO, once."""
    logger = logging.getLogger("contamray")
    if any(getattr(h, "contamray_stderr", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.contamray_stderr = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # a handler Ray or a library set on the root would print every line twice
