"""Scoreboard arithmetic: ROC AUC and TPR at a fixed FPR over labelled scores, NaN when undefined.

The curves themselves are ``contamray.stats.tests`` (the same functions the membership methods report
with: AUC as the Mann-Whitney U over n_pos * n_neg with ties counting one half; TPR at FPR as the best
TPR over thresholds ``score >= t`` whose FPR is at most ``max_fpr``, tied scores flagged together -
the operating point Carlini et al. 2022, "Membership Inference Attacks From First Principles", argue
for). Here they are made total for a scoreboard: rows with a missing or non-finite score are dropped
(a failed example has no score), and a group without both classes gives NaN instead of an error, so
one empty group does not stop the table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from contamray.stats import tests


def _clean(labels: Sequence[bool], scores: Sequence[float]) -> tuple[list[bool], list[float]] | None:
    if len(labels) != len(scores):
        raise ValueError(f"labels ({len(labels)}) and scores ({len(scores)}) differ in length")
    pairs = [(bool(y), float(s)) for y, s in zip(labels, scores) if s is not None and math.isfinite(float(s))]
    y = [p[0] for p in pairs]
    if not any(y) or all(y):
        return None
    return y, [p[1] for p in pairs]


def roc_auc(labels: Sequence[bool], scores: Sequence[float]) -> float:
    """ROC AUC (higher score = more likely positive); NaN when a class is missing."""
    data = _clean(labels, scores)
    return float("nan") if data is None else float(tests.roc_auc(data[1], data[0]))


def tpr_at_fpr(labels: Sequence[bool], scores: Sequence[float], max_fpr: float = 0.05) -> float:
    """The best TPR with FPR <= ``max_fpr``; NaN when a class is missing."""
    if not 0 <= max_fpr <= 1:
        raise ValueError(f"max_fpr must be in [0, 1], got {max_fpr}")
    data = _clean(labels, scores)
    return float("nan") if data is None else float(tests.tpr_at_fpr(data[1], data[0], max_fpr))


def mean(values: Sequence[float]) -> float:
    """Mean of the finite values; NaN when there are none."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return sum(finite) / len(finite) if finite else float("nan")
