"""Is a benchmark's canonical order exchangeable? The units the sharded likelihood test may permute.

Oren et al.'s test assumes the examples of a benchmark are exchangeable: a model that never saw the
file finds every ordering equally likely. Many benchmarks break that - Winogrande keeps twin sentences
that differ in one word on adjacent rows, HellaSwag keeps several items of one activity together, MMLU
is sorted by subject. Then the canonical order is more predictable than a shuffle *to any model*, and
row permutations give false positives (issue #7 measured p = 0.02-0.04 on clean Winogrande slices with
the unmodified model, p ~ 0.01 after fine-tuning on other Winogrande rows). Permuting whole groups
instead keeps the structure in every ordering, so the null is exact again: under "the model never saw
this file", the canonical order of the *groups* is exchangeable - if the groups hold all the structure.

Similarity of two examples is the idf-weighted Jaccard index of their lower-cased word sets (each word
weighted by log(n / rows containing it) within the partition): words every row has (JSON keys,
templates) count for nothing, a name only a few rows share counts a lot. Plain Jaccard let shared
templates hide shared topics (issue #13: runs about one entity were not found).

1. **declared** groups: the benchmark adapter sets ``Record.meta["group"]`` (Winogrande twin pairs, HellaSwag's
   runs of one activity, whose rows go on from one another: ``benchmarks/multiple_choice.py``). A
   group is a maximal run of consecutive rows sharing a group id; a group split by the sample stays split.
2. **diagnosis and detected** groups (``diagnose``): the adjacent pairs of the canonical order against
   random pairs (|i - j| > 1) of the same partition, one-sided Mann-Whitney U (adjacent > random),
   ``structured`` when p <= ``STRUCTURE_ALPHA`` or groups are declared. When significant, every adjacent
   pair more similar than *every* far random pair (|i - j| >= ``FAR_GAP`` on partitions of at least
   ``4 * FAR_GAP`` rows, so that pairs inside a topical run do not set the bar) is linked, and linked
   runs become groups. The bar is high on purpose: a link costs power.
3. **residual structure** (``residual``): once the units are formed and cut into shards, are adjacent
   *units* still more alike than the units a shuffle puts side by side? The boundary pairs of the
   canonical order (last row of unit k, first row of unit k+1, inside a shard) against the pairs a
   shuffle of the same shard can make adjacent (last row of unit a, first row of unit b, b != a + 1),
   the same one-sided Mann-Whitney test at ``STRUCTURE_ALPHA``. It asks exactly what the permutation test
   assumes, within the shards it permutes (MMLU sorted by subject is structured over 1,000 rows, but
   inside 20-row shards of one subject its rows may be exchangeable). Issue #13 measured on 1,000
   mirrored rows: HellaSwag kept residual structure after 363 links (p = 2e-9 with plain Jaccard), MMLU-all
   was structured with 0 links.
4. **coarser units** (``coarser_units``), tried when residual structure remains, finest first: runs of
   rows sharing a declared topic (``TOPIC_KEYS``: MMLU's ``subject``, HellaSwag's ``activity_label``), and
   merges of adjacent units whose boundary similarity exceeds the q-quantile of random unit pairs
   (``MERGE_QUANTILES`` 0.99 ... 0.8). The caller (``sharded_likelihood``) takes the finest candidate with
   no residual structure; coarser units mean fewer units per shard, i.e. less power, which its power
   check reports. The units depend on the texts only, never on the model's scores, so choosing them
   does not bias the permutation test.

A caveat of step 4: a similarity merge keeps, by construction, only boundaries below its bar, so the
residual check after it is conditional on the merge and errs towards passing. The canonical order's
boundaries are then *less* alike than shuffled ones, which biases the test towards "clean" in
similarity terms, not towards false positives; structure no word overlap shows (a subject sort
without shared vocabulary) is not seen by any of these checks.

Measured on the first 1,000 mirrored rows (500 for synthetic_structured), 15 shards (survey preset):

=====================  ==============  ========  =====  =====================  ========================  ==========
benchmark              diagnosis p     declared  links  residual p (units)     units permuted            residual p
=====================  ==============  ========  =====  =====================  ========================  ==========
arc_challenge          0.35            0         0      0.28 (rows)            rows (1000)               0.28
gsm8k                  0.47            0         0      0.63 (rows)            rows (1000)               0.63
winogrande             1.2e-36         227       0      0.081 (groups)         declared groups (773)     0.081
hellaswag              1.8e-107        260       0      0.55 (groups)          declared groups (583)     0.55
mmlu (all)             2.9e-30         0         0      0.0023 (rows)          q0.95 merge (798)         1.0
synthetic_structured   3.6e-108        47        0      6e-66 (groups)         q0.9 merge (177)          0.69
=====================  ==============  ========  =====  =====================  ========================  ==========

Under ``permute: rows`` the rows of winogrande (p = 1e-31), hellaswag (2e-100), mmlu (0.0023) and
synthetic_structured (2e-85) show residual structure inside the shards: not credible. On ARC-Challenge
or GSM8K the check finds no structure and every row is its own unit, which is Oren et al.'s original
test.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from contamray.records import Record
from contamray.stats.clusters import TOPIC_KEYS  # declared topics (MMLU, HellaSwag) tried as coarser units
from contamray.stats.tests import mann_whitney_greater

STRUCTURE_ALPHA = 0.01
RESIDUAL_ALPHA = 0.05  # the residual check guards validity, so it errs towards finding structure
MAX_RANDOM_PAIRS = 5000
FAR_GAP = 10  # random pairs that set the link bar are at least this far apart (partitions of >= 4 * FAR_GAP rows)
MERGE_QUANTILES = (0.99, 0.95, 0.9, 0.8)
_WORD = re.compile(r"\w+")

Units = list[list[int]]


@dataclass(frozen=True)
class OrderStructure:
    """The diagnosis of one partition's canonical order and the units it implies."""

    units: Units  # indices into the ordered rows; each unit's rows in canonical order
    declared_groups: int  # multi-row groups from Record.meta["group"]
    detected_links: int  # adjacent pairs linked by the similarity check (beyond declared groups)
    adjacent_similarity: float | None  # mean similarity of adjacent pairs
    random_similarity: float | None  # mean similarity of random pairs
    link_threshold: float | None  # adjacent pairs above it were linked (the largest far random similarity)
    p_value: float | None  # adjacent > random, one-sided Mann-Whitney U
    structured: bool  # declared groups, or the check was significant

    @property
    def n_rows(self) -> int:
        return sum(len(u) for u in self.units)

    def summary(self) -> str:
        parts = []
        if self.declared_groups:
            parts.append(f"{self.declared_groups} declared group(s)")
        if self.p_value is not None:
            found = self.p_value <= STRUCTURE_ALPHA
            none = "none found beyond the declared groups" if self.declared_groups else "no structure found"
            verdict = f"<= {STRUCTURE_ALPHA:g}, structured" if found else f"> {STRUCTURE_ALPHA:g}, {none}"
            parts.append(
                f"adjacent-pair similarity {self.adjacent_similarity:.2f} vs {self.random_similarity:.2f} random "
                f"(p={self.p_value:.2g} {verdict})"
            )
        if self.detected_links:
            parts.append(f"{self.detected_links} adjacent pair(s) linked")
        multi = sum(len(u) > 1 for u in self.units)
        parts.append(f"{len(self.units)} units for {self.n_rows} rows ({multi} multi-row)")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "structured": self.structured,
            "declared_groups": self.declared_groups,
            "detected_links": self.detected_links,
            "adjacent_similarity": self.adjacent_similarity,
            "random_similarity": self.random_similarity,
            "link_threshold": self.link_threshold,
            "p_value": self.p_value,
            "n_units": len(self.units),
            "n_multi_row_units": sum(len(u) > 1 for u in self.units),
            "summary": self.summary(),
        }


def _words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.lower()))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    union = len(a | b)
    return len(a & b) / union if union else 0.0


class Similarity:
    """idf-weighted Jaccard of the lower-cased word sets of a partition's texts (see the module doc)."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.words = [_words(t) for t in texts]
        df: dict[str, int] = {}
        for ws in self.words:
            for w in ws:
                df[w] = df.get(w, 0) + 1
        n = max(len(self.words), 1)
        self.idf = {w: math.log(n / c) for w, c in df.items()}
        self.weight = [sum(self.idf[w] for w in ws) for ws in self.words]
        self._cache: dict[tuple[int, int], float] = {}

    def __len__(self) -> int:
        return len(self.words)

    def __call__(self, i: int, j: int) -> float:
        key = (i, j) if i <= j else (j, i)
        value = self._cache.get(key)
        if value is None:
            shared = sum(self.idf[w] for w in self.words[i] & self.words[j])
            union = self.weight[i] + self.weight[j] - shared
            value = self._cache[key] = shared / union if union > 0 else 0.0
        return value


def _random_pairs(n: int, rng: np.random.Generator, gap: int = 2) -> list[tuple[int, int]]:
    """Pairs (i, j), |i - j| >= ``gap``, as many as 20 per row up to ``MAX_RANDOM_PAIRS``."""
    want = min(MAX_RANDOM_PAIRS, 20 * n)
    if n < 1:
        return []
    drawn = rng.integers(0, n, size=(want * 4, 2))
    kept = drawn[np.abs(drawn[:, 0] - drawn[:, 1]) >= gap][:want]
    return [(int(i), int(j)) for i, j in kept]


def _declared_units(rows: Sequence[Record]) -> Units:
    units: Units = []
    previous: Any = object()
    for i, r in enumerate(rows):
        group = r.meta.get("group") if r.meta else None
        if group is not None and group == previous and units:
            units[-1].append(i)
        else:
            units.append([i])
        previous = group
    return units


def merge_adjacent(units: Units, join: Sequence[bool]) -> Units:
    """``units`` with unit k + 1 appended to unit k wherever ``join[k]`` (len(units) - 1 flags)."""
    merged: Units = []
    for k, unit in enumerate(units):
        if merged and join[k - 1]:
            merged[-1].extend(unit)
        else:
            merged.append(list(unit))
    return merged


def diagnose(rows: Sequence[Record], texts: Sequence[str], seed: int, detect: bool = True) -> OrderStructure:
    """The order structure of one partition's rows (canonical order) and its permutation units.

    ``texts`` are the serialised examples (what the model reads); ``detect=False`` keeps declared
    groups only (no similarity check).
    """
    if len(rows) != len(texts):
        raise ValueError(f"order_structure: {len(rows)} rows but {len(texts)} texts")
    units = _declared_units(rows)
    declared = sum(len(u) > 1 for u in units)
    adjacent_mean = random_mean = threshold = p_value = None
    links = 0
    n = len(rows)
    if detect and n >= 4:
        sim = Similarity(texts)
        adjacent = np.array([sim(i, i + 1) for i in range(n - 1)])
        rng = np.random.default_rng(seed)
        rand = np.array([sim(i, j) for i, j in _random_pairs(n, rng)])
        if len(rand) >= 2:
            adjacent_mean, random_mean = float(adjacent.mean()), float(rand.mean())
            p_value = float(mann_whitney_greater(adjacent, rand).p_value)
            far = _random_pairs(n, rng, gap=FAR_GAP) if n >= 4 * FAR_GAP else []
            threshold = float(max(sim(i, j) for i, j in far)) if far else float(rand.max())
            if p_value <= STRUCTURE_ALPHA:  # units are contiguous runs: unit k ends at row units[k + 1][0] - 1
                before = len(units)
                units = merge_adjacent(units, [bool(adjacent[u[0] - 1] > threshold) for u in units[1:]])
                links = before - len(units)
    structured = declared > 0 or (p_value is not None and p_value <= STRUCTURE_ALPHA)
    return OrderStructure(units, declared, links, adjacent_mean, random_mean, threshold, p_value, structured)


# ----------------------------------------------------------------------------- residual structure


@dataclass(frozen=True)
class Residual:
    """Adjacent units' similarity against what shuffles of the same shards put side by side."""

    p_value: float | None  # boundary > shuffled, one-sided Mann-Whitney U; None: nothing to compare
    boundary_similarity: float | None  # mean over the canonical order's unit boundaries
    shuffled_similarity: float | None  # mean over the unit pairs a shuffle can make adjacent
    n_boundaries: int

    @property
    def found(self) -> bool:
        return self.p_value is not None and self.p_value <= RESIDUAL_ALPHA

    def to_dict(self) -> dict[str, Any]:
        return {
            "residual_p_value": self.p_value,
            "boundary_similarity": self.boundary_similarity,
            "shuffled_similarity": self.shuffled_similarity,
            "n_boundaries": self.n_boundaries,
            "residual_structure": self.found,
        }


def residual(shards: Sequence[Sequence[Sequence[int]]], sim: Similarity, seed: int = 0) -> Residual:
    """Residual structure of ``shards`` (each a list of units, each a list of row indices): see the module doc.

    Per shard of m units the m - 1 boundary pairs are compared with the (m - 1)^2 pairs (last row of a,
    first row of b), a != b, b != a + 1, that a shuffle can make adjacent (subsampled to
    ``MAX_RANDOM_PAIRS`` over all shards).
    """
    boundary: list[float] = []
    candidates: list[tuple[int, int]] = []
    for units in shards:
        m = len(units)
        boundary += [sim(units[k][-1], units[k + 1][0]) for k in range(m - 1)]
        candidates += [(units[a][-1], units[b][0]) for a in range(m) for b in range(m) if a != b and b != a + 1]
    if len(candidates) > MAX_RANDOM_PAIRS:
        keep = np.random.default_rng(seed).choice(len(candidates), MAX_RANDOM_PAIRS, replace=False)
        candidates = [candidates[int(k)] for k in keep]
    shuffled = [sim(i, j) for i, j in candidates]
    if len(boundary) < 2 or len(shuffled) < 2:
        return Residual(None, None, None, len(boundary))
    p = float(mann_whitney_greater(boundary, shuffled).p_value)
    return Residual(p, float(np.mean(boundary)), float(np.mean(shuffled)), len(boundary))


def _topic_units(units: Units, rows: Sequence[Record], key: str) -> Units:
    def topic(i: int) -> Any:
        return rows[i].meta.get(key) if rows[i].meta else None

    return merge_adjacent(units, [topic(u[0]) is not None and topic(u[0]) == topic(prev[-1])
                                  for prev, u in zip(units, units[1:])])  # fmt: skip


def _random_unit_pairs(units: Units, sim: Similarity, seed: int) -> list[float]:
    """Similarity of (last row of unit a, first row of unit b) for random a != b, b != a + 1."""
    pairs = [(a, b) for a, b in _random_pairs(len(units), np.random.default_rng(seed), gap=1) if b != a + 1]
    return [sim(units[a][-1], units[b][0]) for a, b in pairs]


def _quantile_units(units: Units, sim: Similarity, q: float, random_pairs: Sequence[float]) -> Units:
    if len(random_pairs) < 2:
        return units
    bar = float(np.quantile(random_pairs, q))
    return merge_adjacent(units, [sim(prev[-1], u[0]) > bar for prev, u in zip(units, units[1:])])


def coarser_units(units: Units, rows: Sequence[Record], sim: Similarity, seed: int) -> list[tuple[str, Units]]:
    """Coarser partitions of ``units`` to try when residual structure remains, finest first, each labelled."""
    out: list[tuple[str, Units]] = []
    for key in TOPIC_KEYS:
        if any(r.meta and r.meta.get(key) is not None for r in rows):
            out.append((f"runs of one declared {key}", _topic_units(units, rows, key)))
    random_pairs = _random_unit_pairs(units, sim, seed)
    for q in MERGE_QUANTILES:
        out.append((f"adjacent units merged above the {q:g} quantile of random unit pairs",
                    _quantile_units(units, sim, q, random_pairs)))  # fmt: skip
    seen = {tuple(u[0] for u in units)}
    unique = []
    for label, candidate in sorted(out, key=lambda c: -len(c[1])):  # stable: topics before quantiles on a tie
        starts = tuple(u[0] for u in candidate)
        if starts not in seen:
            seen.add(starts)
            unique.append((label, candidate))
    return unique
