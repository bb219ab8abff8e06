"""Which per-example column is a method's instance-level membership score (higher = more likely seen).

Instance-level ROC AUC needs one number per example. Methods keep their own columns (a ROUGE pair, a
matched fraction, a similarity), so the scoreboard maps each method to the column that ranks examples
best by its own paper's logic:

- the likelihood methods (Min-K%, Min-K%++, perplexity / zlib / lowercase / reference ratios) write
  ``score``, already oriented so that higher = more likely seen (``membership_scores``);
- guided prompting: ROUGE-L of the guided completion minus that of the general completion (Golchin &
  Surdeanu's per-instance evidence: the guided prompt helps only for seen instances);
- the open-data matchers: the graded quantity behind their decision (the share of n-grams or tokens
  matched, METEOR recall, embedding similarity, substrings found, judge's "true" count);
- any other method with a per-example ``contaminated`` flag: the flag (a single ROC point);
- sharded likelihood and clean-vs-dirty accuracy decide per partition (shards, accuracy gaps) and have
  no instance score: their AUC is not defined.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

ScoreFn = Callable[[pd.DataFrame], pd.Series]


def _column(name: str, sign: float = 1.0) -> ScoreFn:
    return lambda t: sign * pd.to_numeric(t[name], errors="coerce") if name in t.columns else _missing(t)


def _missing(table: pd.DataFrame) -> pd.Series:
    return pd.Series(np.nan, index=table.index)


def _guided(table: pd.DataFrame) -> pd.Series:
    if not {"rougeL_guided", "rougeL_general"} <= set(table.columns):
        return _missing(table)
    return pd.to_numeric(table["rougeL_guided"], errors="coerce") - pd.to_numeric(
        table["rougeL_general"], errors="coerce"
    )


def _count(value: object) -> float:
    """Number of items of a list-like cell (GPT-4 substrings found); NaN when missing."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return np.nan
    return float(len(value))  # type: ignore[arg-type]


INSTANCE_SCORES: dict[str, ScoreFn | None] = {
    **{name: _column("score") for name in (
        "min_k", "min_k_plus_plus", "perplexity", "zlib_ratio", "lowercase_ratio", "reference_ratio"
    )},
    "guided_prompting": _guided,
    "ngram_overlap": _column("fraction_matched"),
    "llama2_tokens": _column("contaminated_share"),
    "meteor_recall": _column("meteor_recall"),
    "platypus_embedding": _column("max_similarity"),
    "llm_decontaminator": _column("judged_true"),
    "gpt4_substring": lambda t: t["samples_found"].map(_count) if "samples_found" in t.columns else _missing(t),
    "sharded_likelihood": None,
    "clean_dirty_eval": None,
}


def instance_scores(table: pd.DataFrame, method_name: str) -> pd.Series | None:
    """The membership score of each row of ``table`` (one method's examples), or None if undefined."""
    if method_name in INSTANCE_SCORES:
        fn = INSTANCE_SCORES[method_name]
        if fn is None:
            return None
        scores = fn(table)
        if method_name == "ngram_overlap":  # too-short examples have no fraction: nothing matched
            scores = scores.fillna(0.0)
        return scores
    if "contaminated" in table.columns:
        return table["contaminated"].map(lambda v: np.nan if v is None or pd.isna(v) else float(bool(v)))
    return None
