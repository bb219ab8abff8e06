"""Is a benchmark's canonical order exchangeable? The units the sharded likelihood test may permute.

Oren et al.'s test assumes the examples of a benchmark are exchangeable: a model that never saw the
file finds every ordering equally likely. Many benchmarks break that - Winogrande keeps twin sentences
that differ in one word on adjacent rows, reading-comprehension sets keep several questions of one
passage together, MMLU is sorted by subject. Then the canonical order is more predictable than a
shuffle *to any model*, and row permutations give false positives (issue #7 measured p = 0.02-0.04 on
clean Winogrande slices with the unmodified model, p ~ 0.01 after fine-tuning on other Winogrande
rows). Permuting whole groups instead keeps the structure in every ordering, so the null is exact
again: under "the model never saw this file", the canonical order of the *groups* is exchangeable.

Two sources of groups, both reported beside the p-value:

- **declared**: the benchmark adapter sets ``Record.meta["group"]`` (Winogrande twin pairs). A group is a
  maximal run of consecutive rows sharing a group id; a group split by the sample stays split.
- **detected**: the adjacent-pair check. Similarity of two examples is the Jaccard index of their
  lower-cased word sets. The adjacent pairs of the canonical order are compared with random pairs of
  the same partition (one-sided Mann-Whitney U, adjacent > random). When that is significant
  (p <= ``STRUCTURE_ALPHA``), every adjacent pair more similar than *every* random pair is linked, and
  linked runs become groups. The bar is deliberately high: a link costs the test power (fewer units to
  permute), a missed twin costs it validity only where a pair is as alike as no random pair is.

On ARC-Challenge or GSM8K the check finds no structure and every row is its own unit, which is
Oren et al.'s original test.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from contamray.records import Record
from contamray.stats.tests import mann_whitney_greater

STRUCTURE_ALPHA = 0.01
MAX_RANDOM_PAIRS = 5000
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class OrderStructure:
    """The diagnosis of one partition's canonical order and the units it implies."""

    units: list[list[int]]  # indices into the ordered rows; each unit's rows in canonical order
    declared_groups: int  # multi-row groups from Record.meta["group"]
    detected_links: int  # adjacent pairs linked by the similarity check (beyond declared groups)
    adjacent_similarity: float | None  # mean Jaccard of adjacent pairs
    random_similarity: float | None  # mean Jaccard of random pairs
    link_threshold: float | None  # adjacent pairs above it were linked (the largest random similarity)
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
            verdict = "structured" if self.p_value <= STRUCTURE_ALPHA else "no structure found"
            parts.append(
                f"adjacent-pair similarity {self.adjacent_similarity:.2f} vs {self.random_similarity:.2f} random "
                f"(p={self.p_value:.2g}, {verdict})"
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


def _random_pairs(n: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Pairs (i, j), |i - j| > 1, as many as 20 per row up to ``MAX_RANDOM_PAIRS``."""
    want = min(MAX_RANDOM_PAIRS, 20 * n)
    pairs: list[tuple[int, int]] = []
    for _ in range(want * 4):
        if len(pairs) >= want:
            break
        i, j = (int(x) for x in rng.integers(0, n, size=2))
        if abs(i - j) > 1:
            pairs.append((i, j))
    return pairs


def _declared_units(rows: Sequence[Record]) -> list[list[int]]:
    units: list[list[int]] = []
    previous: Any = object()
    for i, r in enumerate(rows):
        group = r.meta.get("group") if r.meta else None
        if group is not None and group == previous and units:
            units[-1].append(i)
        else:
            units.append([i])
        previous = group
    return units


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
        words = [_words(t) for t in texts]
        adjacent = np.array([jaccard(words[i], words[i + 1]) for i in range(n - 1)])
        rng = np.random.default_rng(seed)
        rand = np.array([jaccard(words[i], words[j]) for i, j in _random_pairs(n, rng)])
        if len(rand) >= 2:
            adjacent_mean, random_mean = float(adjacent.mean()), float(rand.mean())
            p_value = float(mann_whitney_greater(adjacent, rand).p_value)
            threshold = float(rand.max())
            if p_value <= STRUCTURE_ALPHA:
                merged: list[list[int]] = []
                for unit in units:  # units are contiguous runs: unit k-1 ends at row unit[0] - 1
                    if merged and adjacent[unit[0] - 1] > threshold:
                        merged[-1].extend(unit)
                        links += 1
                    else:
                        merged.append(list(unit))
                units = merged
    structured = declared > 0 or (p_value is not None and p_value <= STRUCTURE_ALPHA)
    return OrderStructure(units, declared, links, adjacent_mean, random_mean, threshold, p_value, structured)
