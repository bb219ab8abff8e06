"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def mirror_dir() -> Path:
    """The local mirror of benchmark splits (hub row schema): env CONTAMRAY_MIRROR_DIR, else the
    ``shared/benchmarks`` folder beside the repository (as in CI's checkout)."""
    default = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
    path = Path(os.environ.get("CONTAMRAY_MIRROR_DIR") or default)
    if not path.is_dir():
        pytest.fail(
            f"benchmark mirror not found at {path}; set CONTAMRAY_MIRROR_DIR to the folder holding "
            "<hub org>/<name>/<config>/<split>.jsonl (shared/benchmarks)"
        )
    return path
