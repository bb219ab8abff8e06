"""Multiple-testing correction across a report's grid of p-values (Holm, Benjamini–Hochberg).

A sweep of 12 models × 6 partitions × 2 tested methods is 144 tests: at α = 0.05 about seven of them
come out "significant" by chance alone. The report therefore marks cells by *adjusted* p-values, with
one family made of every p-value in the merged grid (all models, partitions and methods that give a
p-value; cells without one — rate-only methods, failed cells, too few examples — are not tests and are
left out of the family):

- ``holm``: Holm (1979), "A simple sequentially rejective multiple test procedure". Controls the
  family-wise error rate (the chance of any false "contaminated") under any dependence. Sorted
  ascending, ``p_adj(i) = max_{j <= i} min(1, (m - j + 1) * p(j))``.
- ``bh``: Benjamini & Hochberg (1995), "Controlling the false discovery rate". Controls the expected
  share of false discoveries among the flagged cells (independent or positively dependent tests).
  ``p_adj(i) = min_{j >= i} min(1, m / j * p(j))``.
- ``none``: the raw p-values.

Both are the step-wise adjusted p-values (what ``statsmodels.stats.multitest.multipletests`` returns
for ``holm`` and ``fdr_bh``): a cell is significant when ``p_adj <= alpha``, which is the same decision
as running the procedure at level ``alpha``.

Out of reach: an exact test cannot give every p-value - 20 rows against 20 compared as 6 blocks against 6
cannot go below 1 / C(12, 6) = 1/924 (``Verdict.min_p``, the smallest p the cell's data allow). A grid large
enough makes such a cell unflaggable whatever its outcome: under Holm over 144 tests the smallest adjusted p
it could get is about 144 / 924 = 0.16. ``reachable`` gives, for each cell, the adjusted p it would get with
its p at that floor and every other cell's as observed (adjusted p-values are non-decreasing in a cell's own
p, so no outcome of that cell could do better); the report shows a not-flagged cell whose best is above
alpha as inconclusive, not as clean. Which cells those are depends on the grid and the data's floors, never
on the cells' outcomes, and the family is left as it is (every decided test stays in it), so the
correction's error guarantee is unchanged. (Tarone (1990), "A modified Bonferroni method for discrete
data", drops such tests from the family to gain power for the others; not done here.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

CORRECTIONS = ("holm", "bh", "none")
TITLES = {
    "holm": "Holm (family-wise error rate)",
    "bh": "Benjamini–Hochberg (false discovery rate)",
    "none": "none (raw p-values)",
}


def check_correction(
    name: str, alpha: float, correction_key: str = "report.correction", alpha_key: str = "report.alpha"
) -> tuple[str, float]:
    """Validate a correction name and level; the error names the config key (or CLI flag) and the choices."""
    key = str(name).strip().lower()
    aliases = {"fdr_bh": "bh", "benjamini-hochberg": "bh", "bonferroni-holm": "holm", "raw": "none"}
    key = aliases.get(key, key)
    if key not in CORRECTIONS:
        raise ValueError(
            f"{correction_key}: unknown multiple-testing correction {name!r}; choose one of "
            f"{', '.join(CORRECTIONS)}"
        )
    try:
        level = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"{alpha_key}: expected a number in (0, 1), got {alpha!r}") from None
    if not 0.0 < level < 1.0:
        raise ValueError(f"{alpha_key}: expected a number in (0, 1), got {alpha!r}")
    return key, level


def adjust(p_values: Sequence[float | None], correction: str) -> list[float | None]:
    """Adjusted p-values in input order; ``None``/NaN entries are not tests and stay ``None``."""
    key, _ = check_correction(correction, 0.05)
    valid = [i for i, p in enumerate(p_values) if _is_p(p)]
    out: list[float | None] = [None] * len(p_values)
    if not valid:
        return out
    p = np.array([float(p_values[i]) for i in valid], dtype=float)  # type: ignore[arg-type]
    bad = [(valid[k], v) for k, v in enumerate(p) if not 0.0 <= v <= 1.0]
    if bad:
        i, v = bad[0]
        raise ValueError(f"p-value #{i} is {v!r}, outside [0, 1]; the cell's method produced an invalid p-value")
    if key == "holm":
        adjusted = holm(p)
    elif key == "bh":
        adjusted = benjamini_hochberg(p)
    else:
        adjusted = p
    for k, i in enumerate(valid):
        out[i] = float(adjusted[k])
    return out


def reachable(
    p_values: Sequence[float | None], floors: Sequence[float | None], correction: str
) -> list[float | None]:
    """Per cell, the smallest adjusted p it could get: its p replaced by its ``floors`` entry (the smallest p its
    data allow), every other cell's kept (same order as ``p_values``; None where the cell is not a test or has
    no floor). A floor at or above the cell's own p (it should not be) is ignored: the observed p is reachable.

    In O(m log m) plus the cells' ranks between their floor and their p (a grid of thousands of cells takes
    milliseconds, not a re-adjustment per cell): with its floor ``f`` at rank ``r`` among the other p-values
    (sorted ``q_1 <= ... <= q_m`` with the cell at rank ``R``), Holm's adjusted value is
    ``min(1, max(max_{j < r} (m - j + 1) q_j, (m - r + 1) f))`` - the ``r - 1`` smaller p-values keep their ranks,
    and equal values share the first's multiplier -; BH's is ``min(1, m / r f, min_{r <= j < R} m / (j + 1) q_j,
    min_{j > R} m / j q_j)`` - the others between ``f`` and the cell's p move up one rank."""
    key, _ = check_correction(correction, 0.05)
    out: list[float | None] = [None] * len(p_values)
    valid = [i for i, p in enumerate(p_values) if _is_p(p)]
    if not valid:
        return out
    p = np.array([float(p_values[i]) for i in valid], dtype=float)  # type: ignore[arg-type]
    adjusted = np.asarray(adjust(list(p), key), dtype=float)
    m = len(p)
    order = np.argsort(p, kind="mergesort")
    q = p[order]
    rank = np.empty(m, dtype=int)
    rank[order] = np.arange(1, m + 1)
    ranks = np.arange(1, m + 1)
    prefix = np.concatenate([[0.0], np.maximum.accumulate(np.minimum(1.0, (m - ranks + 1) * q))])  # Holm
    shifted = m / (ranks + 1) * q  # BH: a rank's p one rank further down
    suffix = np.concatenate([np.minimum.accumulate((m / ranks * q)[::-1])[::-1], [np.inf]])  # BH: min over ranks >= j
    for k, i in enumerate(valid):
        if not _is_p(floors[i]):
            continue
        f = max(0.0, float(floors[i]))  # type: ignore[arg-type]
        if f >= p[k]:
            out[i] = float(adjusted[k])
            continue
        r = int(np.searchsorted(q, f, side="left")) + 1  # the others below f keep ranks 1 .. r - 1
        if key == "holm":
            best = max(prefix[r - 1], (m - r + 1) * f)
        elif key == "bh":
            between = shifted[r - 1 : rank[k] - 1]  # ranks r .. R - 1 of the sorted list, one rank further down
            best = min(m / r * f, between.min() if between.size else np.inf, suffix[rank[k]])
        else:
            best = f
        out[i] = float(min(1.0, best))
    return out


def holm(p: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values (same order as ``p``)."""
    p = np.asarray(p, dtype=float)
    m = len(p)
    order = np.argsort(p, kind="mergesort")  # stable: ties keep their input order
    stepped = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted_sorted = np.maximum.accumulate(stepped)
    out = np.empty(m)
    out[order] = adjusted_sorted
    return out


def benjamini_hochberg(p: Sequence[float] | np.ndarray) -> np.ndarray:
    """Benjamini–Hochberg step-up adjusted p-values (same order as ``p``)."""
    p = np.asarray(p, dtype=float)
    m = len(p)
    order = np.argsort(p, kind="mergesort")
    stepped = np.minimum(1.0, m / np.arange(1, m + 1) * p[order])
    adjusted_sorted = np.minimum.accumulate(stepped[::-1])[::-1]
    out = np.empty(m)
    out[order] = adjusted_sorted
    return out


def _is_p(value: object) -> bool:
    if value is None or isinstance(value, bool):
        return False
    try:
        return not math.isnan(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
