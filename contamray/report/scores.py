"""Which per-example number is a method's score, for the per-partition distribution plots.

``examples.parquet`` holds every column every method wrote; the plots need the one number per example
whose distribution the method's test (or rate) is about. A small mapping names it per registered method
(``method_name`` in ``partitions.parquet``); a method not in the mapping falls back to a ``score``
column, then a column ending in ``_score``, then the first floating-point column its rows fill.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class ScoreSpec:
    label: str  # axis label
    columns: tuple[str, ...]  # the examples columns it needs
    compute: Callable[[pd.DataFrame], pd.Series]


def _column(name: str) -> Callable[[pd.DataFrame], pd.Series]:
    return lambda frame: pd.to_numeric(frame[name], errors="coerce")


SCORES: dict[str, ScoreSpec] = {
    # Golchin & Surdeanu, Algorithm 1 tests whether guided completions overlap the reference more than
    # general ones: the per-example difference of ROUGE-L F1.
    "guided_prompting": ScoreSpec(
        "ROUGE-L guided − general",
        ("rougeL_guided", "rougeL_general"),
        lambda f: _column("rougeL_guided")(f) - _column("rougeL_general")(f),
    ),
    # n-gram overlap: share of the example's distinct n-grams found in the corpus.
    "ngram_overlap": ScoreSpec("fraction of n-grams matched", ("fraction_matched",), _column("fraction_matched")),
}
FALLBACK_NAMES = ("score",)
NOT_SCORES = {"model", "partition", "method", "record_id", "error", "benchmark", "cell_hash", "run"}


def score_spec(method_name: str, columns: dict[str, str]) -> ScoreSpec | None:
    """The score of ``method_name``, given the columns its example rows fill (``filled_columns``).

    None when a mapped method's columns are not filled, or an unmapped method fills no numeric column.
    """
    spec = SCORES.get(method_name)
    if spec is not None:
        return spec if all(c in columns for c in spec.columns) else None
    for name in FALLBACK_NAMES:
        if name in columns and is_numeric_type(columns[name]):
            return ScoreSpec(name, (name,), _column(name))
    for name, kind in columns.items():
        if name.endswith("_score") and is_numeric_type(kind):
            return ScoreSpec(name, (name,), _column(name))
    floats = [n for n, k in columns.items() if k in ("double", "float", "halffloat") and n not in NOT_SCORES]
    return ScoreSpec(floats[0], (floats[0],), _column(floats[0])) if floats else None


def filled_columns(frame: pd.DataFrame) -> dict[str, str]:
    """Column -> Arrow-like type name for the columns with at least one value in ``frame``."""
    out = {}
    for name in frame.columns:
        if name in NOT_SCORES or frame[name].isna().all():
            continue
        dtype = frame[name].dtype
        if pd.api.types.is_float_dtype(dtype):
            out[name] = "double"
        elif pd.api.types.is_integer_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype):
            out[name] = "int64"
        else:
            out[name] = "other"
    return out


def example_scores(frame: pd.DataFrame, spec: ScoreSpec) -> pd.Series:
    """The finite scores of the rows that did not fail, aligned to ``frame``'s index."""
    ok = frame["error"].fillna("").astype(str) == "" if "error" in frame.columns else pd.Series(True, frame.index)
    values = spec.compute(frame).astype(float)
    return values[ok & np.isfinite(values)]


def is_numeric_type(kind: str) -> bool:
    """Whether an Arrow type name (``str(pyarrow type)``) is a number."""
    return kind in ("double", "float", "halffloat", "int64", "int32", "int16", "int8")
