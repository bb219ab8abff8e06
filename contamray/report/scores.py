"""Which per-example number is a method's score, for the per-partition distribution plots.

``examples.parquet`` holds every column every method wrote; a plot needs the one number per example
whose distribution the method's decision rests on. Each method declares it (``Method.outputs.score``,
``contamray.methods.base.Outputs``); the report reads that declaration and never guesses: a method
that declares no score (or whose rows do not fill it) gets no plot, with a note saying so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from contamray.methods.base import Outputs, get_method

NOT_SCORES = {"model", "partition", "method", "record_id", "error", "benchmark", "cell_hash", "run"}


@dataclass(frozen=True)
class ScoreSpec:
    label: str  # axis label
    column: str  # the examples column holding it
    missing_as: float | None = None  # what an empty cell means (None: not scored)

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.column,)

    def compute(self, frame: pd.DataFrame) -> pd.Series:
        values = pd.to_numeric(frame[self.column].map(_number), errors="coerce")
        return values if self.missing_as is None else values.fillna(self.missing_as)


def declared_outputs(method_name: str) -> Outputs | None:
    """``method_name``'s declaration (None for a method this installation does not know)."""
    try:
        return get_method(method_name).outputs
    except KeyError:
        return None


def declared_score(method_name: str) -> ScoreSpec | None:
    """The per-example score ``method_name`` declares, or None when it declares none."""
    outputs = declared_outputs(method_name)
    if outputs is None or outputs.score is None:
        return None
    return ScoreSpec(outputs.score_label or outputs.score, outputs.score, outputs.missing_as)


def score_spec(method_name: str, columns: dict[str, str]) -> ScoreSpec | None:
    """The declared score of ``method_name`` if the rows fill it (``filled_columns``), else None."""
    spec = declared_score(method_name)
    return spec if spec is not None and spec.column in columns else None


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


def _number(value: object) -> float:
    """A cell as a number: booleans as 0/1, the rest as they are (NaN when not a number)."""
    if value is None:
        return np.nan
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return np.nan
