"""Read one or more run directories into one table of cells (and, on demand, their example scores).

A run directory is what ``python -m contamray.run`` writes (``contamray.pipeline.store``):
``partitions.parquet`` (one row per model × partition × method) and ``examples.parquet`` (one row per
example × method). Merging several runs is the everyday case — a zoo sweep writes one directory per
model or per Hydra multirun job — so the same cell (model, partition, method label) may appear in more
than one run: the run given *last* wins, and the report says which cells were superseded.

``examples.parquet`` can be large (the evidence of every example), so only the columns a plot needs
are read from it, and only when asked.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from contamray.corpus.coverage import corpus_losses, describe_losses
from contamray.pipeline.store import CORPUS_ERRORS, read_partitions

REQUIRED = ("model", "partition", "method", "p_value", "rate", "contaminated")
OPTIONAL = {
    "statistic": float("nan"),
    "n_examples": 0,
    "n_failed": 0,
    "details": "",
    "error": "",
    "benchmark": "",
    "cell_hash": "",
    "method_name": "",
    "decision": "",
    "reason": "",
    "min_p": float("nan"),
}
KEY = ["model", "partition", "method"]


@dataclass
class RunSet:
    """The merged cells of several runs; ``partitions`` has a ``run`` column naming the source dir."""

    run_dirs: list[Path]
    partitions: pd.DataFrame
    notes: list[str] = field(default_factory=list)  # cells replaced by a later run, unfinished runs skipped

    def examples(self, method: str, columns: Iterable[str]) -> pd.DataFrame:
        """Rows of method label ``method`` from every run's ``examples.parquet`` (kept cells only).

        Returns the columns ``model``, ``partition``, ``method``, ``error`` plus those of ``columns``
        that exist; an empty frame when no run has examples for it.
        """
        frames = []
        wanted = list(dict.fromkeys(["model", "partition", "method", "error", *columns]))
        for run_dir in self.run_dirs:
            kept = self.partitions[(self.partitions["run"] == str(run_dir)) & (self.partitions["method"] == method)]
            path = run_dir / "examples.parquet"
            if kept.empty or not path.is_file():
                continue
            names = set(pq.read_schema(path).names)
            if not {"model", "partition", "method"} <= names:
                continue
            cols = [c for c in wanted if c in names]
            table = pq.read_table(path, columns=cols, filters=[("method", "==", method)]).to_pandas()
            keys = set(zip(kept["model"], kept["partition"]))
            table = table[[k in keys for k in zip(table["model"], table["partition"])]]
            frames.append(table)
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=wanted)

    def example_columns(self, method: str) -> dict[str, str]:
        """Column name -> Arrow type name of the examples files that hold rows of ``method``."""
        out: dict[str, str] = {}
        for run_dir in self.run_dirs:
            path = run_dir / "examples.parquet"
            if path.is_file() and (self.partitions["run"] == str(run_dir)).any():
                for f in pq.read_schema(path):
                    out.setdefault(f.name, str(f.type))
        return out


def expand_run_dirs(paths: Sequence[str | Path]) -> tuple[list[Path], list[str]]:
    """Run directories from the given paths: a run directory as it is, or a sweep directory's runs.

    A path without ``partitions.parquet`` whose subdirectories hold runs (a Hydra multirun directory,
    ``<sweep>/<job number>/``, or a zoo sweep, ``<sweep>/<model>/``) stands for those runs, in name
    order; its unfinished subdirectories are skipped with a note (an interrupted job of a sweep must not
    hide the others). A path that is neither is passed on, so ``load_runs`` names what is wrong with it.
    """
    dirs: list[Path] = []
    notes: list[str] = []
    for path in map(Path, paths):
        if (path / "partitions.parquet").is_file() or not path.is_dir():
            dirs.append(path)
            continue
        subdirs = sorted((p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")), key=_natural)
        runs = [p for p in subdirs if (p / "partitions.parquet").is_file()]
        if not runs:
            dirs.append(path)
            continue
        dirs += runs
        notes += [
            f"{p}: no partitions.parquet (an unfinished run of the sweep {path}); skipped"
            for p in subdirs
            if p not in runs and (p / "cells").is_dir()
        ]
    return dirs, notes


def corpus_note(run_dir: str | Path) -> str:
    """What a run's corpus scan could not read (its ``corpus_errors.jsonl``), for the report; "" when it read all
    (``corpus.coverage.describe_losses``)."""
    path = Path(run_dir) / CORPUS_ERRORS
    if not path.is_file():
        return ""
    errors = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    text = describe_losses(*corpus_losses(errors))
    if not text:
        return ""
    return (f"{text} Each is listed in {path}; fix or restore them and run again (the corpus fingerprint changes, "
            "so the open-data cells are scanned again).")  # fmt: skip


def load_runs(run_dirs: Sequence[str | Path]) -> RunSet:
    """Read and merge the ``partitions.parquet`` of each run (or sweep) directory; later runs win a cell."""
    if not run_dirs:
        raise ValueError("no run directory given; pass one or more directories written by `contamray run`")
    dirs, notes = expand_run_dirs(run_dirs)
    frames = []
    for order, run_dir in enumerate(dirs):
        frames.append(_read_partitions(run_dir).assign(run=str(run_dir), _order=order))
    table = pd.concat(frames, ignore_index=True)
    merged_notes = list(notes)
    for run_dir in dirs:
        if note := corpus_note(run_dir):
            merged_notes.append(f"{run_dir}: {note}" if len(dirs) > 1 else note)
    dup = table.duplicated(KEY, keep="last")
    for _, row in table[dup].iterrows():
        winner = table[(table[KEY] == row[KEY]).all(axis=1)].iloc[-1]
        same = bool(row["cell_hash"]) and row["cell_hash"] == winner["cell_hash"]
        merged_notes.append(
            f"{row['model']} / {row['partition']} / {row['method']}: the cell of {row['run']} is replaced by the "
            f"one of {winner['run']}" + (" (same cell hash: identical inputs)" if same else "")
        )
    table = table[~dup].drop(columns="_order").reset_index(drop=True)
    return RunSet(run_dirs=dirs, partitions=table, notes=merged_notes)


def _read_partitions(run_dir: Path) -> pd.DataFrame:
    path = run_dir / "partitions.parquet"
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist; pass a directory written by `contamray run`")
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: {run_dir} is not a finished contamray run (a run writes partitions.parquet at "
            "its end; re-run it with the same config to finish it — finished cells are reused)"
        )
    try:
        table = read_partitions(run_dir)
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise ValueError(f"{path}: not a readable Parquet file ({type(err).__name__}: {err})") from None
    if table.empty:
        return pd.DataFrame(columns=[*REQUIRED, *OPTIONAL])
    missing = [c for c in REQUIRED if c not in table.columns]
    if missing:
        raise ValueError(
            f"{path}: column(s) {', '.join(missing)} missing; expected the verdict columns "
            f"{', '.join(REQUIRED)} written by contamray.pipeline.store.ResultStore.write_run"
        )
    for column, default in OPTIONAL.items():
        if column not in table.columns:
            table[column] = default
    table["method_name"] = [n if isinstance(n, str) and n else m for n, m in zip(table["method_name"], table["method"])]
    table["error"] = table["error"].fillna("").astype(str)
    table["reason"] = table["reason"].fillna("").astype(str)
    table["decision"] = [
        decision_of(d, c, e) for d, c, e in zip(table["decision"], table["contaminated"], table["error"])
    ]
    table["details"] = table["details"].map(_details_text)
    for column in ("p_value", "rate", "statistic", "min_p"):
        table[column] = pd.to_numeric(table[column], errors="coerce")
    for column in ("model", "partition", "method"):
        blank = table[column].isna() | (table[column].astype(str) == "")
        if blank.any():
            row = int(blank.idxmax())
            raise ValueError(
                f"{path}: row {row} has an empty {column!r}; every cell names its model, partition and method"
            )
        table[column] = table[column].astype(str)
    return table


def _natural(path: Path) -> tuple[int, int | str]:
    """Hydra job numbers in numeric order (2 before 10), names alphabetically after them."""
    return (0, int(path.name)) if path.name.isdigit() else (1, path.name)


def decision_of(decision: Any, contaminated: Any, error: str) -> str:
    """A cell's three-valued decision; runs written before decisions existed decided by ``contaminated``."""
    if error:
        return "error"
    if isinstance(decision, str) and decision:
        return decision
    return "contaminated" if bool(contaminated) else "clean"


def details_summary(value: Any) -> str:
    """A verdict's one-line ``details["summary"]`` (how the p-value was obtained), or ""."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip().startswith("{") else {}
        except json.JSONDecodeError:
            return ""
    return str(value.get("summary") or "") if isinstance(value, dict) else ""


def _details_text(value: Any) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)
