"""Where results live: one folder per cell, then the run's merged tables.

The store's root is a local path or any fsspec / object-store URI (``s3://bucket/runs/x``,
``gs://...``): a sweep's cells can be shared by runs on different machines. Each cell keeps

- ``cells/<hash>/examples.parquet``: its per-example table, written when the cell is scored;
- ``cells/<hash>/examples.sha256``: that table's sha256, written after it;
- ``cells/<hash>/verdict.json``: its Verdict and the sha256 of the examples it was reduced from,
  written when it is reduced — the mark of a finished cell. Every file is written to a temporary name
  and moved into place, so a half-written file is never taken for a result (where the filesystem
  renames atomically; an object store's "move" is a copy), and a table is reused only when it matches
  its checksum: a re-run with the same config hash reuses finished cells (and scored ones), and
  scores again a cell whose table was cut short or changed.

Corpus scans keep their finished passes under ``cells/scans/<index hash>/<shard key>.pkl`` (folded
matches of one benchmark index against one pass's files, with their sha256), so a killed scan resumes
after its last finished pass (``pipeline/corpus_scan.py``).

The merged outputs are what a user reads:

- ``examples.parquet``: one row per example × method (model, partition, method, record_id, error and
  the method's own columns);
- ``partitions.parquet`` and ``summary.json``: one row per model × partition × method (the Verdict).
  ``partitions.parquet`` holds no wall-clock column, so the same config and seed give it byte for byte
  whatever the number of engine replicas or scoring actors; the cells' ``seconds`` are in
  ``timings.parquet`` (and in ``summary.json``); ``read_partitions`` joins them back;
- ``report.md`` / ``report.html`` (written by ``contamray.report``);
- ``progress.json`` while the run goes on: cells total / scored / done and ``status`` (``running``,
  ``finished``), rewritten as cells are stored (what ``GET /v1/jobs/{id}`` reports).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import pickle
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pandas as pd

from contamray.pipeline.plan import Cell

PROGRESS_FILE = "progress.json"
EXAMPLES = "examples.parquet"
EXAMPLES_SHA256 = "examples.sha256"
VERDICT = "verdict.json"
CHECKSUM_KEY = "examples_sha256"  # in verdict.json: the examples the verdict was reduced from
SCANS = "scans"  # under the cells root: corpus passes per benchmark index (pipeline/corpus_scan.py)
PARTITIONS = "partitions.parquet"
COVERAGE = "corpus_coverage.json"  # in an open-data cell's folder: what the scan that scored it could not read
CORPUS_ERRORS = "corpus_errors.jsonl"  # in a run's output dir: the corpus rows its scan could not read
TIMINGS = "timings.parquet"
WALL_CLOCK = ("seconds",)  # verdict columns no re-run reproduces: in timings.parquet, not partitions.parquet
CELL_KEY = ("model", "partition", "method")

log = logging.getLogger(__name__)


class StoreWriteError(OSError):
    """A result file could not be written (``ENOSPC``, a quota, a read-only or lost mount). The run stops:
    what was stored before is whole (every file goes in under a temporary name, with its checksum), and
    the file that failed leaves nothing behind, so a re-run reuses the stored cells and computes the rest."""

    def __init__(self, path: str, size: int, cause: OSError) -> None:
        reason = cause.strerror or str(cause) or type(cause).__name__
        super().__init__(
            cause.errno,
            f"result store: cannot write {path} ({size} bytes): {reason}. The run stops here; every cell "
            "stored before is intact and a re-run with the same config reuses it. Fix: free space on that "
            "disk (or raise its quota), or point the run at a store with room (hydra.run.dir=..., "
            "run.cells_uri=...), then run again",
        )
        self.path = path


def write_atomic(fs: Any, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` on ``fs`` whole or not at all (a temporary name, then a move); raises
    ``StoreWriteError`` and leaves no half-written file when it cannot."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(tmp, "wb") as fh:
            fh.write(data)
        fs.mv(tmp, path)
    except OSError as err:  # a full disk, a quota, a lost mount: stop, and leave no half-written file
        try:
            if fs.exists(tmp):
                fs.rm(tmp)
        except OSError:
            pass
        raise StoreWriteError(path, len(data), err) from err


class ResultStore:
    """The run's tables under ``root``; finished cells under ``cells_root`` (default ``root/cells``).

    Give several runs one ``cells_root`` (``run.cells_uri``, e.g. an object-store URI) and each
    reuses the cells any of them finished.
    """

    def __init__(self, root: str | Any, cells_root: str | None = None) -> None:
        self.root = str(root).rstrip("/")
        self.fs, self._path = fsspec.core.url_to_fs(self.root)
        self.fs.makedirs(self._path, exist_ok=True)
        cells = str(cells_root).rstrip("/") if cells_root else f"{self.root}/cells"
        self.cells_uri = cells
        self.cells_fs, self._cells_path = fsspec.core.url_to_fs(cells)
        self.cells_fs.makedirs(self._cells_path, exist_ok=True)
        self._checksums: dict[str, str] = {}  # cells whose examples this store wrote or verified: sha256
        self._finished: set[str] = set()  # cells whose verdict this store wrote or verified

    # paths -------------------------------------------------------------------------------------
    def _join(self, *parts: str) -> str:
        return "/".join([self._path.rstrip("/"), *parts])

    def _cell(self, cell_hash: str, name: str) -> str:
        return "/".join([self._cells_path.rstrip("/"), cell_hash, name])

    # progress ----------------------------------------------------------------------------------
    def track(self, cell_hashes: list[str]) -> None:
        """Keep ``progress.json`` in the run's folder: cells scored and done (reduced) of ``cell_hashes``,
        rewritten (atomically) as cells are stored, so the on-demand API and a person polling the folder
        see a run's progress without re-planning it."""
        self._tracked = {h: (self.has_examples(h), self.has(h)) for h in cell_hashes}
        self._progress_lock = threading.Lock()
        self._write_progress("running")

    def finish(self) -> None:
        """The run's tables are written: ``progress.json`` says finished."""
        if getattr(self, "_tracked", None) is not None:
            self._write_progress("finished")

    def interrupted(self) -> tuple[int, int]:
        """The run was interrupted: ``progress.json`` says so; returns (cells done, cells in the run)."""
        tracked = getattr(self, "_tracked", None)
        if tracked is None:
            return 0, 0
        self._write_progress("interrupted")
        return sum(d for _, d in tracked.values()), len(tracked)

    def _mark(self, cell_hash: str, scored: bool, done: bool) -> None:
        tracked = getattr(self, "_tracked", None)
        if tracked is None or cell_hash not in tracked:
            return
        with self._progress_lock:
            was = tracked[cell_hash]
            tracked[cell_hash] = (was[0] or scored, was[1] or done)
        self._write_progress("running")

    def _write_progress(self, status: str) -> None:
        with self._progress_lock:
            states = list(self._tracked.values())
            body = {
                "status": status,
                "cells_total": len(states),
                "cells_scored": sum(s for s, _ in states),
                "cells_done": sum(d for _, d in states),
                "updated": time.time(),
            }
            write_atomic(self.fs, self._join(PROGRESS_FILE), json.dumps(body).encode())

    # cells -------------------------------------------------------------------------------------
    def has(self, cell_hash: str) -> bool:
        """A finished cell: reduced, its verdict stored, and its examples intact (their checksum is the one
        the verdict was written with)."""
        if cell_hash in self._finished:
            return True
        path = self._cell(cell_hash, VERDICT)
        if not self.cells_fs.exists(path) or not self.has_examples(cell_hash):
            return False
        try:
            with self.cells_fs.open(path, "rb") as fh:
                verdict = json.loads(fh.read())
        except (OSError, ValueError) as err:
            log.warning("cell %s: %s is unreadable (%s); the cell is computed again", cell_hash, VERDICT, err)
            return False
        if verdict.get(CHECKSUM_KEY) != self._checksums.get(cell_hash):
            log.warning("cell %s: its verdict was written for other examples than the stored ones; the cell is "
                        "reduced again", cell_hash)  # fmt: skip
            return False
        self._finished.add(cell_hash)
        return True

    def has_examples(self, cell_hash: str) -> bool:
        """A scored cell: its per-example table stored whole (it may not be reduced yet). The table's sha256
        is written beside it after the table; a table that does not match it (a write cut short on a store
        without atomic renames, a file changed by hand) is not reused: the cell is scored again."""
        if cell_hash in self._checksums:
            return True
        table, digest = self._cell(cell_hash, EXAMPLES), self._cell(cell_hash, EXAMPLES_SHA256)
        if not self.cells_fs.exists(table) or not self.cells_fs.exists(digest):
            return False
        with self.cells_fs.open(digest, "rb") as fh:
            expected = fh.read().decode("ascii", "replace").strip()
        with self.cells_fs.open(table, "rb") as fh:
            actual = hashlib.sha256(fh.read()).hexdigest()
        if actual != expected:
            log.warning("cell %s: %s does not match its checksum (a write cut short, or a changed file); the cell "
                        "is scored again", cell_hash, EXAMPLES)  # fmt: skip
            return False
        self._checksums[cell_hash] = actual
        return True

    def adopt(self, cell_hashes: list[str], roots: list[str]) -> dict[str, str]:
        """Copy into this store the cells of ``cell_hashes`` it has not finished that an earlier run finished under
        one of ``roots`` (other runs' cells roots, newest first; ``output_root.earlier_cells``), each checked there as
        ``has`` checks its own: examples matching their checksum, a verdict reduced from them. The files go in as
        a cell's own do (examples, their checksum, then the verdict, each whole), so a copy cut short is a cell
        computed again. Returns the adopted hashes, each with the root it came from."""
        wanted = [h for h in dict.fromkeys(cell_hashes) if not self.has(h)]
        adopted: dict[str, str] = {}
        for root in roots:
            if not wanted:
                break
            try:
                earlier = ResultStore(root.rstrip("/").rsplit("/", 1)[0], cells_root=root)
                listed = {str(p).rstrip("/").rsplit("/", 1)[-1]
                          for p in earlier.cells_fs.ls(earlier._cells_path, detail=False)}  # fmt: skip
            except OSError as err:  # an earlier run's folder removed meanwhile, or unreadable: look no further there
                log.warning("earlier run's cells %s not read (%s); its cells are not reused", root, err)
                continue
            for cell_hash in [h for h in wanted if h in listed]:
                try:
                    found = earlier._finished_files(cell_hash)
                except OSError as err:
                    log.warning("cell %s of the run %s not read (%s); it is computed here", cell_hash, root, err)
                    continue
                for name, data in found.items():  # in order: the verdict last, the mark of a finished cell
                    write_atomic(self.cells_fs, self._cell(cell_hash, name), data)
                if found and self.has_examples(cell_hash) and self.has(cell_hash):
                    adopted[cell_hash] = root
            wanted = [h for h in wanted if h not in adopted]
        return adopted

    def _finished_files(self, cell_hash: str) -> dict[str, bytes]:
        """A finished cell's files, in the order a cell's own are written (``adopt``); empty when it is not one."""
        if not self.has(cell_hash):
            return {}
        found = {}
        for name in (COVERAGE, EXAMPLES, EXAMPLES_SHA256, VERDICT):
            path = self._cell(cell_hash, name)
            if name != COVERAGE or self.cells_fs.exists(path):
                with self.cells_fs.open(path, "rb") as fh:
                    found[name] = fh.read()
        return found

    def discard(self, cell_hash: str) -> None:
        folder = self._cell(cell_hash, "").rstrip("/")
        if self.cells_fs.exists(folder):
            self.cells_fs.rm(folder, recursive=True)
        self._checksums.pop(cell_hash, None)
        self._finished.discard(cell_hash)

    def put_examples(self, cell: Cell, cell_hash: str, examples: pd.DataFrame) -> None:
        examples = examples.assign(model=cell.model, benchmark=cell.benchmark, method=cell.method)
        data = parquet_bytes(examples)
        digest = hashlib.sha256(data).hexdigest()
        self._finished.discard(cell_hash)  # new examples: a verdict of the old ones no longer holds
        write_atomic(self.cells_fs, self._cell(cell_hash, EXAMPLES), data)
        write_atomic(self.cells_fs, self._cell(cell_hash, EXAMPLES_SHA256), digest.encode())
        self._checksums[cell_hash] = digest
        self._mark(cell_hash, scored=True, done=False)

    def put_verdict(self, cell: Cell, cell_hash: str, verdict: dict[str, Any]) -> None:
        if not self.has_examples(cell_hash):
            raise ValueError(f"cell {cell_hash}: a verdict is stored after its examples, and they are missing")
        row = dict(verdict, model=cell.model, benchmark=cell.benchmark, method=cell.method, cell_hash=cell_hash)
        row[CHECKSUM_KEY] = self._checksums[cell_hash]
        data = json.dumps(row, indent=2, default=str).encode()
        write_atomic(self.cells_fs, self._cell(cell_hash, VERDICT), data)
        self._finished.add(cell_hash)
        self._mark(cell_hash, scored=True, done=True)

    def put(self, cell: Cell, cell_hash: str, examples: pd.DataFrame, verdict: dict[str, Any]) -> None:
        """Store a scored and reduced cell at once."""
        self.put_examples(cell, cell_hash, examples)
        self.put_verdict(cell, cell_hash, verdict)

    def put_coverage(self, cell_hash: str, coverage: dict[str, Any]) -> None:
        """What the corpus scan that scores an open-data cell could not read (``corpus.coverage``), stored before
        the cell's examples, so whichever run reduces the cell says it."""
        write_atomic(self.cells_fs, self._cell(cell_hash, COVERAGE), json.dumps(coverage).encode())

    def get_coverage(self, cell_hash: str) -> dict[str, Any] | None:
        """The stored coverage of an open-data cell, or None (a cell scored before coverage was stored)."""
        path = self._cell(cell_hash, COVERAGE)
        if not self.cells_fs.exists(path):
            return None
        try:
            with self.cells_fs.open(path, "rb") as fh:
                return json.loads(fh.read())
        except (OSError, ValueError) as err:
            log.warning("cell %s: %s is unreadable (%s); its verdict does not say what the corpus scan lost",
                        cell_hash, COVERAGE, err)  # fmt: skip
            return None

    def load_examples(self, cell_hash: str) -> pd.DataFrame:
        with self.cells_fs.open(self._cell(cell_hash, EXAMPLES), "rb") as fh:
            return pd.read_parquet(io.BytesIO(fh.read()))

    def load(self, cell: Cell, cell_hash: str) -> tuple[pd.DataFrame, dict[str, Any]]:
        with self.cells_fs.open(self._cell(cell_hash, VERDICT), "rb") as fh:
            verdict = json.loads(fh.read())
        verdict.pop(CHECKSUM_KEY, None)
        verdict.update(model=cell.model, benchmark=cell.benchmark, method=cell.method)
        return self.load_examples(cell_hash), verdict

    # corpus scans ------------------------------------------------------------------------------
    def _scan(self, index_hash: str, shard_key: str) -> str:
        return "/".join([self._cells_path.rstrip("/"), SCANS, index_hash, f"{shard_key}.pkl"])

    def put_scan(self, index_hash: str, shard_key: str, data: bytes) -> None:
        """A corpus pass's folded matches for one benchmark index (``pipeline/corpus_scan.py``), with its sha256."""
        digest = hashlib.sha256(data).hexdigest().encode()
        write_atomic(self.cells_fs, self._scan(index_hash, shard_key), digest + b"\n" + data)

    def get_scan(self, index_hash: str, shard_key: str) -> dict[str, Any] | None:
        """The stored pass, or None when there is none or it does not match its checksum (scanned again)."""
        path = self._scan(index_hash, shard_key)
        if not self.cells_fs.exists(path):
            return None
        with self.cells_fs.open(path, "rb") as fh:
            digest, _, data = fh.read().partition(b"\n")
        if hashlib.sha256(data).hexdigest().encode() != digest:
            log.warning("corpus scan %s/%s does not match its checksum; that pass is scanned again", index_hash,
                        shard_key)  # fmt: skip
            return None
        return pickle.loads(data)

    # the run's tables --------------------------------------------------------------------------
    def write_run(self, examples: list[pd.DataFrame], verdicts: list[dict[str, Any]]) -> dict[str, str]:
        """Merge cells into the run's tables; returns the written paths."""
        paths = {
            "examples": self._join("examples.parquet"),
            "partitions": self._join(PARTITIONS),
            "timings": self._join(TIMINGS),
            "summary": self._join("summary.json"),
        }
        frames = [f for f in examples if len(f)]
        table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        front = [c for c in ("model", "partition", "method", "record_id", "error") if c in table.columns]
        table = table[front + [c for c in table.columns if c not in front]]
        write_atomic(self.fs, paths["examples"], parquet_bytes(table))
        partitions = pd.DataFrame(verdicts)
        clock = [c for c in WALL_CLOCK if c in partitions.columns]
        timings = partitions[[c for c in CELL_KEY if c in partitions.columns] + clock]
        write_atomic(self.fs, paths["partitions"], parquet_bytes(partitions.drop(columns=clock)))
        write_atomic(self.fs, paths["timings"], parquet_bytes(timings))
        write_atomic(self.fs, paths["summary"], json.dumps(verdicts, indent=2, default=str).encode())
        return paths


def read_partitions(run_dir: str | Path) -> pd.DataFrame:
    """A finished run's ``partitions.parquet`` with the cells' wall-clock columns of ``timings.parquet``
    joined back (a run written before the split has them in place)."""
    table = pd.read_parquet(Path(run_dir) / PARTITIONS)
    timings_path = Path(run_dir) / TIMINGS
    if not timings_path.is_file() or table.empty:
        return table
    timings = pd.read_parquet(timings_path)
    key = [c for c in CELL_KEY if c in table.columns and c in timings.columns]
    extra = [c for c in timings.columns if c not in table.columns]
    if not key or not extra:
        return table
    return table.merge(timings[key + extra].drop_duplicates(key), on=key, how="left")


def parquet_bytes(frame: pd.DataFrame) -> bytes:
    """A frame whose columns may hold mixed Python objects (dicts, lists) as Parquet bytes.

    Columns of dicts, or of values whose types differ from row to row, are stored as JSON text so
    Arrow never has to guess a schema from the first rows.
    """
    out = frame.copy()
    for column in out.columns:
        if out[column].dtype == object and _needs_json(out[column]):
            out[column] = out[column].map(lambda v: None if v is None else json.dumps(v, default=str))
    buffer = io.BytesIO()
    out.to_parquet(buffer, index=False)
    return buffer.getvalue()


def _needs_json(values: pd.Series) -> bool:
    kinds = {type(v) for v in values if v is not None and not (isinstance(v, float) and pd.isna(v))}
    if any(k is dict for k in kinds):
        return True
    if len(kinds) > 1 and not kinds <= {int, float, bool}:
        return True
    if kinds == {list}:
        inner = {type(x) for v in values if isinstance(v, list) for x in v}
        return len(inner) > 1 and not inner <= {int, float}
    return False
