"""Where results live: one folder per finished cell, then the run's merged tables.

Each cell is written as soon as it is reduced (``cells/<hash>/examples.parquet`` + ``verdict.json``,
renamed into place atomically), so an interrupted run keeps everything it finished and a re-run with
the same config hash reuses it. The merged outputs are what a user reads:

- ``examples.parquet``: one row per example × method (model, partition, method, record_id, error and
  the method's own columns);
- ``partitions.parquet`` and ``summary.json``: one row per model × partition × method (the Verdict);
- ``report.md``: the readable table plus the resolved config (written by ``contamray.report``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from contamray.pipeline.plan import Cell


class ResultStore:
    def __init__(self, output_dir: str | os.PathLike[str]) -> None:
        self.root = Path(output_dir)
        self.cells_dir = self.root / "cells"
        self.cells_dir.mkdir(parents=True, exist_ok=True)

    def has(self, cell_hash: str) -> bool:
        return (self.cells_dir / cell_hash / "verdict.json").exists()

    def put(self, cell: Cell, cell_hash: str, examples: pd.DataFrame, verdict: dict[str, Any]) -> None:
        """Store one finished cell atomically (a half-written cell is never seen as finished)."""
        tmp = Path(tempfile.mkdtemp(prefix=f".{cell_hash}.", dir=self.cells_dir))
        examples = examples.assign(model=cell.model, benchmark=cell.benchmark, method=cell.method)
        _to_parquet(examples, tmp / "examples.parquet")
        row = dict(verdict, model=cell.model, benchmark=cell.benchmark, method=cell.method, cell_hash=cell_hash)
        (tmp / "verdict.json").write_text(json.dumps(row, indent=2, default=str))
        final = self.cells_dir / cell_hash
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)

    def load(self, cell: Cell, cell_hash: str) -> tuple[pd.DataFrame, dict[str, Any]]:
        folder = self.cells_dir / cell_hash
        verdict = json.loads((folder / "verdict.json").read_text())
        verdict.update(model=cell.model, benchmark=cell.benchmark, method=cell.method)
        examples = pd.read_parquet(folder / "examples.parquet")
        return examples.assign(model=cell.model, benchmark=cell.benchmark, method=cell.method), verdict

    def write_run(self, examples: list[pd.DataFrame], verdicts: list[dict[str, Any]]) -> dict[str, Path]:
        """Merge cells into the run's tables; returns the written paths."""
        paths = {
            "examples": self.root / "examples.parquet",
            "partitions": self.root / "partitions.parquet",
            "summary": self.root / "summary.json",
        }
        frames = [f for f in examples if len(f)]
        table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        front = [c for c in ("model", "partition", "method", "record_id", "error") if c in table.columns]
        table = table[front + [c for c in table.columns if c not in front]]
        _to_parquet(table, paths["examples"])
        partitions = pd.DataFrame(verdicts)
        _to_parquet(partitions, paths["partitions"])
        paths["summary"].write_text(json.dumps(verdicts, indent=2, default=str))
        return paths


def _to_parquet(frame: pd.DataFrame, path: Path) -> None:
    """Write a frame whose columns may hold mixed Python objects (dicts, lists) as Parquet.

    Columns of dicts, or of values whose types differ from row to row, are stored as JSON text so
    Arrow never has to guess a schema from the first rows.
    """
    out = frame.copy()
    for column in out.columns:
        if out[column].dtype == object and _needs_json(out[column]):
            out[column] = out[column].map(lambda v: None if v is None else json.dumps(v, default=str))
    out.to_parquet(path, index=False)


def _needs_json(values: pd.Series) -> bool:
    kinds = {type(v) for v in values if v is not None and not (isinstance(v, float) and pd.isna(v))}
    if any(k is dict for k in kinds):
        return True
    if len(kinds) > 1 and not kinds <= {int, float}:
        return True
    if kinds == {list}:
        inner = {type(x) for v in values if isinstance(v, list) for x in v}
        return len(inner) > 1 and not inner <= {int, float}
    return False
