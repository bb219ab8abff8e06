"""Sampling units of a partition: when its rows are not independent draws, test units, not rows.

A test that compares two partitions row by row (a Mann-Whitney of membership scores against a held-out)
assumes each side is a sample of independent rows. A *contiguous block* of a split is not: benchmarks
keep related rows together - Winogrande's twin sentences, HellaSwag's runs of one activity, MMLU's
subjects, a generator's runs of facts about one entity - and rows of one run share most of what a
score measures. Measured on ``synthetic_structured`` (runs of 3-6 rows about one entity) with the
embedded model: the lag-1 autocorrelation of the mean token log-probability in canonical order is
0.28 and the entity explains its variance (one-way ANOVA p = 4e-9); on ``synthetic_facts`` (independent
rows) it is -0.10. With runs of m rows and an intra-run correlation rho the rank test's variance grows
by the design effect 1 + (m - 1) rho (Kish, "Survey Sampling", 1965), about 2 here, so a nominal 5 %
test flags about 12 % of clean slices.

Text similarity does not find such runs in a 20-row slice (rows about one entity share a rare name but
fewer template words than rows of different entities of one kind), and the scores' own autocorrelation
has no power at that size either, so the units are fixed by how the rows were drawn, not detected:

1. **declared units**: consecutive rows sharing ``meta["group"]`` (twins) or a declared topic
   (``TOPIC_KEYS``: MMLU's ``subject``, HellaSwag's ``activity_label``) are one unit;
2. **blocks** (batch means; Carlstein, "The use of subseries values for estimating the variance of a
   general statistic from a stationary sequence", Ann. Statist. 1986): when a side's rows are a contiguous
   block of the split (most neighbours have consecutive ``order``), consecutive declared units are merged
   into blocks of at least ``block_size`` rows (``floor(sqrt(n))`` of the smaller side, at least
   ``block_rows``), so dependence shorter than a block stays inside one block or two neighbours. A
   random sample of a split (``sample: random``) keeps few neighbours: its rows are exchangeable draws
   and stay units (exact); so do the rows of a dataset that declares them independent draws
   (``Adapter.independent_rows``: ``synthetic_facts``, whose generator draws every row alone). When one
   side is blocked, the other is blocked too with the same block size, so both sides' unit scores are
   means of as many rows (a mean of 5 rows and a single row have different medians when scores are
   skewed, which a rank test would read as a shift).

Each unit's score is the mean of its rows' scores. Runs longer than a block (MMLU subjects of 100+ rows,
undeclared) remain a cluster sample; declare them (a topic key) so a slice of one subject is one unit
and the test says it cannot decide.

**A topic every row of both sides shares** is no cluster of the comparison: a slice of one MMLU subject
against a held-out of the *same* subject (rows 172-211 of astronomy against rows 212-251) compares rows
within one cluster, where the topic is a constant and cannot tell the sides apart; what remains is the
dependence of neighbouring rows, which blocks handle as in any contiguous block of a split. So under
``auto`` such a topic makes no unit (``shared_topic``), and the sides are cut into blocks: 6 against 6 at
40 rows a side, where the whole subject as one unit gave 1 against 1 and no test (measured on a model
fine-tuned on the 40 astronomy rows: every membership score at AUC 1.000 over rows, yet inconclusive).
Groups (twins) stay units whatever the sides share; a topic shared by only some rows still makes units.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TOPIC_KEYS = ("subject", "activity_label")
UNIT_MODES = ("auto", "declared", "rows")
CONTIGUOUS_SHARE = 0.5  # a side is a contiguous block when at least this share of neighbours are adjacent rows


@dataclass(frozen=True)
class Units:
    """One side's units: each a list of indices into the rows given, and how they were formed."""

    units: list[list[int]]
    how: str
    contiguous: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "how": self.how,
            "n_units": len(self.units),
            "n_rows": sum(len(u) for u in self.units),
            "multi_row_units": sum(len(u) > 1 for u in self.units),
            "contiguous": self.contiguous,
        }


def unit_key(meta: Mapping[str, Any] | None, keys: Sequence[str] = ("group", *TOPIC_KEYS)) -> str:
    """The declared unit of a row (its group, else its topic), "" when none is declared."""
    for key in keys if meta else ():
        value = meta.get(key)
        if value is not None and str(value) != "":
            return f"{key}={value}"
    return ""


def topic_key(meta: Mapping[str, Any] | None) -> str:
    """The declared topic of a row (``TOPIC_KEYS``: MMLU's subject, HellaSwag's activity), "" when none."""
    return unit_key(meta, TOPIC_KEYS)


def is_contiguous(orders: Sequence[int]) -> bool:
    """Whether rows (split indices, ascending) are mostly neighbours in the split."""
    if len(orders) < 2:
        return False
    adjacent = sum(b - a == 1 for a, b in zip(orders, orders[1:]))
    return adjacent >= CONTIGUOUS_SHARE * (len(orders) - 1)


def declared_units(orders: Sequence[int], keys: Sequence[str]) -> list[list[int]]:
    """Runs of consecutive rows (in the order given) sharing a non-empty declared key."""
    units: list[list[int]] = []
    for i, key in enumerate(keys):
        if i and key and key == keys[i - 1] and units:
            units[-1].append(i)
        else:
            units.append([i])
    return units


def blocks(units: list[list[int]], block_rows: int) -> list[list[int]]:
    """Consecutive units merged into blocks of at least ``block_rows`` rows; a short tail joins the last block."""
    out: list[list[int]] = []
    current: list[int] = []
    for unit in units:
        current = current + unit
        if len(current) >= block_rows:
            out.append(current)
            current = []
    if current:
        if out:
            out[-1] = out[-1] + current
        else:
            out.append(current)
    return out


def sampling_units(
    orders: Sequence[int],
    keys: Sequence[str],
    mode: str,
    block_rows: int,
    force_blocks: bool = False,
    independent: bool = False,
    contiguous: bool | None = None,
) -> Units:
    """The units of one side's rows, given in ascending ``order`` (see the module doc).

    ``mode``: ``auto`` (declared units, blocks when contiguous or ``force_blocks``), ``declared``
    (declared units only) or ``rows`` (every row its own unit: the rows are known to be independent).
    ``independent``: the dataset declares its rows independent draws whatever their order (a generator
    drawing each row alone), so a contiguous block is a random sample. ``contiguous``: whether the side was drawn
    as a contiguous block, when known from more rows than ``orders`` (rows left out of the test leave gaps); None:
    read from ``orders``.
    """
    if mode not in UNIT_MODES:
        raise ValueError(f"units: {mode!r} is not one of {', '.join(UNIT_MODES)}")
    contiguous = (is_contiguous(orders) if contiguous is None else contiguous) and not independent
    if mode == "rows":
        return Units([[i] for i in range(len(orders))], "rows", contiguous)
    units = declared_units(orders, keys)
    how = "declared groups/topics" if any(len(u) > 1 for u in units) else "rows"
    if mode == "auto" and (contiguous or force_blocks) and block_rows > 1:
        why = "a contiguous block of the split" if contiguous else "the other side is blocked"
        return Units(blocks(units, block_rows), f"blocks of >= {block_rows} consecutive rows ({why})", contiguous)
    return Units(units, how, contiguous)


def block_size(n_rows: Sequence[int], block_rows: int) -> int:
    """Rows per block: ``floor(sqrt(n))`` of the smaller side, at least ``block_rows`` - the batch-means
    rule of Flegal & Jones ("Batch means and spectral variance estimators in Markov chain Monte Carlo",
    Ann. Statist. 2010): blocks must grow with n, or the correlation of neighbouring blocks (a run across
    their boundary) keeps the level above alpha. Measured with runs of 3-6 rows at rho = 0.3, 2,000 clean
    pairs: fixed blocks of 5 flag 6.8 % at 100 rows a side and 7.5 % at 300; sqrt(n) blocks 5.2 % and 5.7 %."""
    smallest = min((n for n in n_rows if n > 0), default=0)
    return max(block_rows, math.isqrt(smallest))


def shared_topic(keys: Sequence[Sequence[str]]) -> str:
    """The declared topic (``TOPIC_KEYS``) of every row of every side when there is one such topic, else ""."""
    distinct = {key for side in keys for key in side}
    if len(keys) < 2 or len(distinct) != 1:
        return ""
    (key,) = distinct
    return key if key.split("=", 1)[0] in TOPIC_KEYS else ""


def paired_units(
    sides: Sequence[tuple[Sequence[int], Sequence[str], bool]],
    mode: str,
    block_rows: int,
    contiguous: Sequence[bool | None] | None = None,
) -> list[Units]:
    """Units of every side (split orders, declared keys, rows declared independent); when any side is
    blocked, every side is, with one block size. Under ``auto`` a topic shared by every row of every side makes
    no unit (module doc). ``contiguous``: per side, whether it was drawn as a contiguous block (``sampling_units``),
    when the caller knows it from more rows than those tested."""
    topic = shared_topic([k for _, k, _ in sides]) if mode == "auto" else ""
    if topic:
        sides = [(o, [""] * len(k), i) for o, k, i in sides]
    size = block_size([len(o) for o, _, _ in sides], block_rows)
    design = list(contiguous) if contiguous is not None else [None] * len(sides)
    units = [sampling_units(o, k, mode, size, independent=i, contiguous=c) for (o, k, i), c in zip(sides, design)]
    if mode == "auto" and any(u.how.startswith("blocks") for u in units):
        units = [sampling_units(o, k, mode, size, force_blocks=True, independent=i, contiguous=c)
                 for (o, k, i), c in zip(sides, design)]  # fmt: skip
    if topic:
        note = f"; {topic} on every row of both sides, a constant of the comparison, makes no unit"
        units = [Units(u.units, u.how + note, u.contiguous) for u in units]
    return units


def unit_means(values: Sequence[float], units: Units) -> list[float]:
    """The mean value of each unit."""
    return [sum(values[i] for i in u) / len(u) for u in units.units if u]
