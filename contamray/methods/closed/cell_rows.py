"""Reading what a closed-data method is handed (engine outputs, a cell's example rows), and writing a row.

``score`` receives outputs as a mapping or a list (rows of Ray Data batches arrive as plain dicts);
``reduce`` receives a pandas DataFrame, a pyarrow Table or a list of dicts, whose cells may be None,
NaN or pandas' NA where a column was absent for a row. These helpers give every method one reading.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from contamray.methods.base import Output

T = TypeVar("T")


def output_map(outputs: Mapping[str, Any] | Iterable[Output]) -> dict[str, Output]:
    """Outputs by request key (plain-dict outputs are turned back into ``Output``)."""
    if isinstance(outputs, Mapping):
        return {k: (v if isinstance(v, Output) else Output.from_row(v)) for k, v in outputs.items()}
    return {o.key: o for o in outputs}


def rows_of(table: Any) -> list[dict[str, Any]]:
    """A cell's rows as dicts, from pandas, pyarrow or an iterable of mappings."""
    if hasattr(table, "to_dict") and hasattr(table, "columns"):  # pandas
        return table.to_dict(orient="records")
    if hasattr(table, "to_pylist"):  # pyarrow
        return table.to_pylist()
    return [dict(r) for r in table]


def missing(value: Any) -> bool:
    """None, NaN or pandas' NA (a missing ``member`` / ``is_reference`` cell)."""
    if value is None:
        return True
    try:
        return bool(value != value)
    except TypeError:  # pandas.NA refuses to be a bool
        return True


def finite(value: Any) -> float | None:
    """The value as a finite float, or None."""
    if missing(value):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def truthy(value: Any) -> bool:
    """A flag cell: missing is False; strings "1", "true", "yes" are True."""
    if missing(value):
        return False
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    return bool(value)


def row_failed(row: Mapping[str, Any], column: str = "error") -> bool:
    """The row carries a failure message in ``column`` (``error``; ``judge_error`` for a judge's): a non-blank
    string. A failed row is counted (``n_failed``) and never scored."""
    error = row.get(column)
    return isinstance(error, str) and bool(error.strip())


def column_mean(rows: list[dict[str, Any]], column: str) -> tuple[float | None, int]:
    """Mean of ``column`` over the rows that have a finite value (None when none), and their number."""
    values = [v for v in (finite(r.get(column)) for r in rows) if v is not None]
    return (sum(values) / len(values) if values else None, len(values))


class Filtered(ValueError):
    """The method's protocol leaves this record out: no request, no score, not a failure (the same rule
    drops the same kind of record on both sides of the held-out test)."""


def built(row: dict[str, Any], build: Callable[[], T]) -> T | None:
    """``build()``, or None with ``row["filtered"]`` (``Filtered``) or ``row["error"]`` (``ValueError``) set."""
    try:
        return build()
    except Filtered as why:
        row["filtered"] = str(why)
    except ValueError as err:
        row["error"] = str(err)
    return None
