"""Load one benchmark partition as Records: from the hub by id, or from a local mirror of hub rows.

Rows come from ``datasets.load_dataset(hub_id, config, split=...)`` when ``mirror_dir`` is None, or
from ``<mirror_dir>/<hub_id>/<config>/<split>.jsonl`` (same row schema, e.g. ``shared/benchmarks``)
through ``datasets.load_dataset("json", data_files=...)``. Either way the adapter sees the same rows.
A generated benchmark (an adapter with a ``generate`` hook, e.g. ``synthetic_facts``) makes its rows
in-process instead, from neither the hub nor the mirror.

Sampling keeps the canonical order: ``n`` row indices are drawn with ``random.Random(seed)`` and then
sorted, because order-sensitive tests (Oren et al.'s shuffled-order likelihood) compare the canonical
order with permutations of it. ``Record.order`` is always the row's index in the full split.
A row that cannot be converted raises ``BenchmarkRowError`` (``strict=True``) or becomes a
``RowFailure`` (``strict=False``); failed rows are not replaced, so a sample may hold fewer than n.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from contamray.benchmarks.base import Adapter, BenchmarkRowError, LoadResult, RowContext
from contamray.benchmarks.registry import get_adapter
from contamray.records import Record


def mirror_path(adapter: Adapter, config: str, split: str, mirror_dir: str | Path) -> Path:
    """Where a mirror keeps a split: ``<mirror_dir>/<hub_id>/<config>/<split>.jsonl``."""
    return Path(mirror_dir) / adapter.hub_id / config / f"{split}.jsonl"


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """Silence ``datasets`` progress bars for one load, restoring the caller's setting after."""
    import datasets

    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def _read_mirror(adapter: Adapter, config: str, split: str, mirror_dir: str | Path) -> tuple[Any, str]:
    import datasets

    path = mirror_path(adapter, config, split, mirror_dir)
    if not path.is_file():
        folder = path.parent
        present = sorted(p.stem for p in folder.glob("*.jsonl")) if folder.is_dir() else []
        raise FileNotFoundError(
            f"no mirror file for benchmark {adapter.name!r} ({adapter.hub_id}, config {config}, "
            f"split {split}): expected {path}. Splits of {adapter.name}: {', '.join(adapter.splits)}; "
            f"mirrored in {folder}: {', '.join(present) if present else 'none (folder missing or empty)'}. "
            f"Fix: pass split= one of the mirrored splits, put the hub rows of {split!r} at {path}, "
            "or pass mirror_dir=None to load from the hub"
        )
    if path.stat().st_size == 0:
        raise ValueError(
            f"{path} is empty; fix: put the hub rows of {adapter.hub_id} ({config}, {split}) there"
        )
    try:
        with _quiet_datasets():
            table = datasets.load_dataset("json", data_files=str(path), split="train")
    except Exception as exc:  # pyarrow / datasets raise several types for a malformed file
        causes = "; ".join(f"{type(c).__name__}: {str(c).splitlines()[0] if str(c) else ''}" for c in _causes(exc))
        raise ValueError(
            f"{path} could not be read as JSON lines in the hub schema of {adapter.hub_id} "
            f"({config}, {split}): {type(exc).__name__}: {exc}"
            + (f" (caused by {causes})" if causes else "")
            + ". Fix: one JSON object per line in UTF-8 (no lone surrogate escapes), each field with the same "
            "type on every row"
        ) from exc
    return table, str(path)


def _causes(exc: BaseException, most: int = 2) -> list[BaseException]:
    """The first ``most`` exceptions ``exc`` was raised from (``datasets`` wraps pyarrow's, which says which
    row is bad and why)."""
    found: list[BaseException] = []
    while (exc := exc.__cause__ or exc.__context__) is not None and len(found) < most and exc not in found:
        found.append(exc)
    return found


def _read_hub(adapter: Adapter, config: str, split: str) -> tuple[Any, str]:
    import datasets

    source = f"hub:{adapter.hub_id} (config {config}, split {split})"
    try:
        with _quiet_datasets():
            table = datasets.load_dataset(adapter.hub_id, config, split=split)
    except Exception as exc:  # network, auth, missing config: all end here
        raise RuntimeError(
            f"could not load benchmark {adapter.name!r} from {source}: {type(exc).__name__}: {exc}. "
            f"Fix: check access to the dataset hub, or pass mirror_dir=<dir> holding "
            f"<dir>/{adapter.hub_id}/{config}/{split}.jsonl (see shared/benchmarks/README.md)"
        ) from exc
    return table, source


def _generated(adapter: Adapter, config: str, split: str) -> tuple[Any, str]:
    import datasets

    assert adapter.generate is not None
    return datasets.Dataset.from_list(adapter.generate(config, split)), f"generated:{adapter.name}/{config}/{split}"


SAMPLINGS = ("random", "first")


def sample_indices(
    total: int, n: int | None, seed: int, what: str, how: str = "random", offset: int = 0
) -> list[int]:
    """``n`` of ``range(offset, total)`` in ascending (canonical) order.

    ``how="random"`` draws them with ``random.Random(seed)``; ``how="first"`` takes the first ``n``, a
    contiguous block - what the sharded likelihood test needs, since a model that memorised the file in
    order learnt which example follows which, and a random subsample keeps few such neighbours.
    ``offset`` skips the split's first rows: rows ``offset`` .. ``offset + n - 1`` of a split are a
    held-out disjoint from its first ``offset`` rows.
    """
    if how not in SAMPLINGS:
        raise ValueError(f"sample={how!r} for {what}: choose one of {', '.join(SAMPLINGS)}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset={offset!r} for {what}: give the number of leading rows to skip (>= 0)")
    if offset >= total:
        raise ValueError(f"offset={offset} for {what}: the split has only {total} rows; use an offset below {total}")
    rows = range(offset, total)
    if n is None:
        return list(rows)
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"n={n!r} for {what}: give a positive number of rows, or None for all rows")
    if n >= len(rows):
        if n > len(rows):
            warnings.warn(f"n={n} is more than the {len(rows)} rows of {what} from row {offset}; taking them all",
                          stacklevel=3)  # fmt: skip
        return list(rows)
    if how == "first":
        return list(rows[:n])
    return sorted(random.Random(seed).sample(rows, n))


def _columns(table: Any, names: tuple[str, ...]) -> dict[str, list[Any]]:
    present = set(table.column_names)
    return {c: list(table[c]) if c in present else [None] * len(table) for c in names}


def load_records(
    name: str,
    split: str | None = None,
    config: str | None = None,
    n: int | None = None,
    seed: int = 0,
    mirror_dir: str | Path | None = None,
    strict: bool = True,
    sample: str = "random",
    offset: int = 0,
) -> LoadResult:
    """The Records of benchmark ``name`` (registry name) for one config and split.

    ``split``/``config`` default to the adapter's; ``n`` samples that many rows (canonical order; None =
    all; ``sample`` = "random" draws them seeded, "first" takes the first ``n``; ``offset`` skips the split's
    first rows); ``mirror_dir`` reads a
    local mirror instead of the hub; ``strict=False`` records bad rows as ``RowFailure`` instead of
    raising ``BenchmarkRowError``.
    """
    adapter = get_adapter(name)
    split = adapter.resolve_split(split)
    config = adapter.resolve_config(config)
    partition = adapter.partition(config, split)
    if adapter.generate is not None:  # a generated benchmark: no hub, no mirror
        table, source = _generated(adapter, config, split)
    elif mirror_dir is None:
        table, source = _read_hub(adapter, config, split)
    else:
        table, source = _read_mirror(adapter, config, split, mirror_dir)
    total = len(table)
    if total == 0:
        raise ValueError(f"{source} holds no rows for {partition}; fix: point at a non-empty split")
    indices = sample_indices(total, n, seed, f"{partition} ({source})", sample, offset)
    extras = adapter.groups(_columns(table, adapter.group_columns), partition) if adapter.groups else None
    rows = table if indices == list(range(total)) else table.select(indices)

    result = LoadResult(records=[], failures=[], partition=partition, source=source, total_rows=total)
    first_row_of: dict[str, int] = {}
    for index, row in zip(indices, _decoded_rows(rows)):
        ctx = RowContext(adapter, row if not isinstance(row, _Undecodable) else {}, index, partition, source,
                         split, config)  # fmt: skip
        if extras is not None:
            ctx.extra_meta = dict(extras[index])
        try:
            if isinstance(row, _Undecodable):
                ctx.fail(row.column, f"is not valid UTF-8 text ({row.error})",
                         "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8), restore the row from the "
                         "hub dataset, drop the row, or load with strict=False to skip the row and get a RowFailure")
            record = _convert(adapter, ctx, first_row_of)
        except BenchmarkRowError as err:
            if strict:
                raise
            result.failures.append(err.failure)
            continue
        result.records.append(record)
    return result


@dataclasses.dataclass
class _Undecodable:
    """A row whose bytes are not UTF-8 (the JSON reader keeps them; they fail when the row is read)."""

    column: str
    error: str


def _decoded_rows(rows: Any) -> Iterator[dict[str, Any] | _Undecodable]:
    """The rows of a ``datasets`` table in order; a row holding invalid UTF-8 comes as ``_Undecodable``
    (naming its first bad column) and the rows after it are still read (one by one from there)."""
    position = 0
    try:
        for row in rows:
            yield row
            position += 1
        return
    except UnicodeDecodeError:
        pass
    for k in range(position, len(rows)):
        try:
            yield rows[k]
        except UnicodeDecodeError as err:
            column = next((c for c in rows.column_names if not _decodes(rows, k, c)), "?")
            yield _Undecodable(column, str(err))


def _decodes(rows: Any, k: int, column: str) -> bool:
    try:
        rows.select_columns([column])[k]
    except UnicodeDecodeError:
        return False
    return True


def _convert(adapter: Adapter, ctx: RowContext, first_row_of: dict[str, int]) -> Record:
    row_id = ctx.row_id
    if row_id in first_row_of:  # the first row keeps the id; a repeat fails as ``<id>@row<index>`` (ids stay unique)
        try:
            ctx.fail(
                adapter.id_field or "id",
                f"repeats the id of row {first_row_of[row_id]}",
                "give every row its own id (as on the hub), drop the duplicate, or load with strict=False "
                "(data.strict=false in a run) to keep the first row and record the others as failed",
            )
        except BenchmarkRowError as err:
            failure = dataclasses.replace(err.failure, row_id=f"{row_id}@row{ctx.row_index}")
            raise BenchmarkRowError(failure) from None
    record = adapter.convert(ctx)
    first_row_of[row_id] = ctx.row_index
    return record
