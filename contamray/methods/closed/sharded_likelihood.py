"""Sharded likelihood comparison test: Oren, Meister, Chatterji, Ladhak & Hashimoto, "Proving Test Set
Contamination in Black Box Language Models" (ICLR 2024, arXiv:2310.17623; code:
github.com/tatsu-lab/test_set_contamination).

Idea: benchmark examples are exchangeable - if a model never saw the benchmark, every ordering of its
examples is equally likely to it. A model trained on the benchmark *file* has also learnt its order,
so the canonical order is more likely than shuffled ones. The test turns that into a p-value that
needs no access to the training data:

1. serialise the examples in canonical dataset order (``Record.order``) - only the configured text
   fields (``fields``, as JSON lines by default, like the authors' benchmark files);
2. split them into ``num_shards`` contiguous shards (the first ``n % num_shards`` shards one example
   larger, as the authors' code);
3. per shard, score the log-likelihood of the canonical concatenation and of
   ``permutations_per_shard`` random shuffles of it (distinct and never the canonical order; every other
   order once when the shard has no more than that, ``unit_orders``). Shards longer than ``context_len`` tokens are
   scored with a sliding window over their token ids that advances by ``stride`` tokens, each window
   scoring only its new tokens (done by the engine: ``likelihood_windows``);
4. d_i = canonical_i - mean(shuffled_i); the one-sided t statistic of mean(d) > 0 across shards.
   Contaminated when p <= ``alpha``. The p-value (``test``):

   - ``permutation`` (the default): the t statistic's exact permutation distribution
     (``contamray.stats.tests.shard_permutation_test``). Under the null the canonical order of a
     shard is exchangeable with its shuffles, so each choice of one ordering per shard as "the
     canonical" is equally likely; p is the share of choices whose t reaches the observed one
     (enumerated up to 250,000 choices, else 100,000 seeded draws). Valid at any shard count;
   - ``t``: Student's t with n - 1 degrees of freedom (``t_test_greater``), the paper's. It needs the
     d_i normal: with few shards their skew shows (a shard's log-likelihoods over orderings are
     skewed), and in simulation with 5 shards of skewed orderings it flags 15 % at alpha = 0.05
     where the permutation p flags 3.5 % (``tests/test_stats_tests.py``). The Student p is reported
     beside the decision either way (``details.t_test_p``).

``outputs``: the plotted per-example score is ``d``, the row's shard's d (every row of a shard carries
it); there is no per-example membership score (the test decides per partition). Per shard the exact
permutation p-value - the rank of the canonical order among its shuffles,
``(1 + #{shuffled >= canonical}) / (1 + permutations)`` - is reported too.

Two variants (``permute``), both reporting the order-structure diagnosis of
``contamray.methods.closed.order_structure`` beside the p-value:

- ``permute: groups`` (the default, ``sharded_likelihood``): the units that are shuffled are the
  partition's groups - declared by the benchmark (Winogrande twin pairs, HellaSwag's activity runs) or detected
  from the data (adjacent examples far more alike than random pairs) - and a shard holds whole groups. On a benchmark
  with no structure every example is its own unit, which is exactly Oren et al.'s test. Oren et al.'s
  assumption - examples are exchangeable - fails on structured benchmarks (twin sentences on adjacent
  rows are more likely in their canonical order to *any* model), and row permutations then give false
  positives; groups are exchangeable again. Issue #7 measured the false positive on Winogrande and
  ``tests/test_order_structure.py`` reproduces it and its fix.
- ``permute: rows``: Oren et al.'s original (every example a unit, whatever the structure), for
  reproducing the paper (``sharded_likelihood_paper``) and the survey's Table 1 (``sharded_likelihood_oren``).

Several serialisations (``other_serialisations``, our extension; default none): the test finds only the
serialisation the model saw - a model that read the rows as plain text, or the inputs alone, gives the
default JSON lines of input and label no order preference (measured on the embedded model fine-tuned on
20 ARC-Challenge inputs as JSON lines, 10 copies: ``json:input+label`` p = 0.28, ``json:input`` p = 0.017,
``text:input`` p = 0.64). When the format of a leak is unknown, each listed serialisation
(``"FORMAT"`` or ``"FORMAT:FIELD+FIELD"``) is tested beside ``(fields, format)`` - its own shards,
shuffles, structure check and p-value - and the decision is their Bonferroni combination,
p = min(1, k x the smallest p) over the k serialisations that can decide (whether one can depends on
shard counts, the texts' structure and failed requests, never on the order likelihoods, so the level
stays alpha whatever the tests' dependence; ``tests/test_sharded_likelihood.py`` checks it by simulation).
The price is k times the scoring and a k-fold p: on the model above all four serialisations together
gave p = 0.067. Rows: ``d`` stays the first serialisation's; each other one's shard d is
``d_<format>_<fields>`` and its whole row is kept in ``other_serialisations`` (JSON by label);
``details.by_serialisation`` holds each test's decision, p and reason, ``details.decided_by`` the one
with the smallest p.

The raw form and files that number their rows (``position_fields``): ``format: raw`` scores the dataset's rows byte
for byte, and many files number them (HellaSwag's ``ind``, GLUE's ``idx``, the generated benchmarks' ``id``), point
at other rows by number (``twin``) or count runs (``run``). Shuffled as they are, the numbers jump about where the
canonical file counts upward - a preference any model has without having read the file: on the base model the raw
form flagged 3 of 4 clean ``synthetic_facts`` slices (p = 0.0027, 0.0057, 0.0012), the JSON form none. Each scored
order is therefore written as the file would be in that order: the numbering stays with the positions, references
follow the rows they name, a counter's runs are kept whole (units a run straddles are joined) and renumbered as they
come; the canonical text is unchanged. Fields that follow the row order in a way no renumbering reproduces make the
raw form's null not credible (inconclusive below). ``details.order_structure.position_fields`` and the summary name
the fields renumbered.

When the null is not credible the decision is ``inconclusive`` (issue #13), never a silent answer:

- **residual structure**: the permuted units must be exchangeable *inside the shards*. After the units
  are formed, ``order_structure.residual`` compares the similarity of adjacent units (across unit
  boundaries, within a shard) with the pairs a shuffle of the same shard puts side by side (one-sided
  Mann-Whitney at ``RESIDUAL_ALPHA`` = 0.05, stricter than the diagnosis' 0.01 because it guards
  validity). Under ``permute: groups``, when structure remains, coarser units are tried finest first
  (runs of one declared topic - MMLU's ``subject``, HellaSwag's ``activity_label`` - and merges of
  adjacent units above the 0.99 ... 0.8 quantile of random unit pairs; ``detect_structure: false``
  tries none) and the first without residual structure is permuted; coarser units mean fewer units
  per shard, which the power check below sees. When none removes it, or under ``permute: rows``
  when rows show residual structure or declared groups would be split, the verdict is inconclusive
  with the reason and the diagnosis in ``details``; the t-test's p-value is still reported as evidence.
  ``allow_structured: true`` decides anyway (with ``details.warning_structure``) - the way to reproduce
  Oren et al.'s and the survey's decisions on structured benchmarks; the presets keep it false, so
  on Winogrande or HellaSwag they report the paper's p-value but do not call it a decision.
- **numbered raw rows**: under ``format: raw``, a field whose numbers follow the row order (Kendall's tau with the
  position, ``position_fields``) but is neither an index, a reference to one nor a counter - the reason names it;
  ``allow_structured: true`` decides anyway (``details.warning_position_fields``).
- **power**: inconclusive when fewer than ``min_shards`` shards could be tested (default 5, the
  canary's shard count: a one-sided t-test on 2-4 shard differences has 1-3 degrees of freedom, so
  only an effect far larger than its spread reaches alpha, and a "clean" from it says nothing), or
  when more than half of the
  ``num_shards`` configured were not tested (a shard needs >= 2 units; with the survey's 15 shards
  on 20 rows only 5 two-row shards are testable). ``plan_warnings`` says so at plan time when
  ``limit < 2 * num_shards`` (the survey preset needs >= 30 contiguous rows; under ``permute: groups`` 2 x
  ``group_rows`` x num_shards on a benchmark declaring groups - Winogrande's twin pairs: 60) or ``num_shards <
  min_shards``, and when ``sample`` is not ``first`` (the test needs neighbouring rows), each naming
  the fix (``run.limit``, ``num_shards``, ``run.sample=first``). Inconclusive too when the shards' layout
  cannot reach alpha: the smallest p a layout allows is prod(1 / (1 + m_i)) over the shards (m_i other orders
  scored; ``details.permutation_null.min_p``), and a shard of k units has only k! - 1 other orders (2 units:
  1), so four 2-unit shards cannot go below 1/16; above alpha not even a model preferring every canonical
  order could be flagged, so a "clean" would say nothing. Rows of older versions drew shuffles with
  replacement, so a small shard's shuffles could repeat the canonical order (2 units: about half of them) -
  the same text, the same score, tied with the canonical in every choice of the null; for them the bound is
  prod((1 + c_i) / (1 + m_i)) (c_i repeats, ``canonical_repeats``; always 0 now). Before the tie-aware check
  such layouts answered clean.

Calibration (``contamray calibrate --slices 5``: base SmolLM2-135M, float32, never fine-tuned, so every
slice is clean with respect to order unless pre-training read the benchmark file; 5 contiguous slices of 20
rows per benchmark, spread evenly over the split, 5 shards x 10 permutations, ``permute: groups``, alpha
0.05), measured 2026-12-07 in float32 (HellaSwag's activity runs declared as groups):

=================  ======  =======  ============  =====  ===========  ================================
benchmark          slices  flagged  inconclusive  clean  FPR at 0.05  p-values
=================  ======  =======  ============  =====  ===========  ================================
arc_challenge      5       0        0             5      0.00         0.13 0.86 0.50 0.61 0.37
winogrande         5       0        0             5      0.00         0.11 0.83 0.62 0.35 0.44
hellaswag          5       1        0             4      0.20         0.86 0.93 0.024 0.74 0.92
mmlu (all)         5       0        0             5      0.00         0.36 0.11 0.27 0.38 0.83
=================  ======  =======  ============  =====  ===========  ================================

Pooled: 1 of 20 slices flagged (0.05), none inconclusive; 5 slices per benchmark bound a per-benchmark rate
only loosely (0/5 has a 95 % upper bound of 0.52). Before HellaSwag declared its runs (2026-11-29, bfloat16) two
HellaSwag slices were flagged, rows 1644-1663 (p = 0.0037) and 2466-2485 (p = 0.048): the slices' own similarity
check had too few rows to see their runs (p = 0.02 against the diagnosis' 0.01), so rows were permuted and rows
that go on from one another were shuffled apart - a preference of any model. With the runs as units the second is
clean (p = 0.74) and the first still flagged (p = 0.024, every shard's d > 0); on 10 slices 1 flagged, 1
inconclusive (a shard of fewer than 2 runs). That one may be the base model's own pre-training exposure to the
HellaSwag file (the survey finds HellaSwag contaminated in most models), which a public benchmark's "clean" cannot
exclude - only synthetic benchmarks are clean by construction (below). An earlier run (2026-11-23, 4 slices a
benchmark, shuffles drawn with replacement) flagged 1 of 20, an MMLU slice.
On the same kind of slices the null check (text only) finds the rows not
exchangeable under ``permute: rows`` in 4/4 Winogrande, 2/4 HellaSwag and 1/4 ARC slices (the
last is RESIDUAL_ALPHA's 5 % base rate on unstructured rows), so Oren et al.'s variant answers
``inconclusive`` there instead of risking issue #7's false positives; ``permute: groups`` finds
every slice credible.
For tighter numbers: ``contamray calibrate --methods sharded_likelihood --slices 20``; the README holds
the latest run of every closed-data test.

On partitions clean by construction (``tests/test_null_calibration.py``: 20 slices of the generated
benchmarks on a model fine-tuned on other rows, 5 shards x 5 shuffles, the permutation p) it flagged
3 of 20 - the same three slices as Student's t with other shuffles, which an exact test does with
probability 0.075 - and left 1 inconclusive. Under the base model on 50 further clean slices of the same two
benchmarks (``contamray calibrate --benchmarks synthetic_facts,synthetic_structured --methods sharded_likelihood
--slices 25``, 5 shards x 10 shuffles, 2026-11-29): 1 of 50 flagged (p = 0.003, a synthetic_facts slice), none
inconclusive.

A calibrated null from a reference model (the same statistic on a model known not to have seen the
split) is not implemented: group permutations keep the test exact without a second model, and a
reference model's own order preferences differ from the target's, so the comparison has no exact null.

Parameters: ``num_shards``, ``permutations_per_shard``, ``context_len``, ``stride``, ``fields``, ``format``,
``other_serialisations`` (default none),
``alpha``, ``seed``, ``permute``, ``detect_structure`` (see above), ``min_shards`` (default 5),
``allow_structured`` (default false) and ``test`` (``permutation``, default; ``t`` in the two presets that
reproduce the paper's and the survey's numbers).

Presets (``conf/method/``): the paper's (``sharded_likelihood_paper``: 50 shards x 250 permutations,
``context_len=2048``, ``stride=1024``; its Table 2 runs use up to 5,000 examples per benchmark) and the
survey's (``sharded_likelihood``, the default: 15 shards x 25 permutations, 1024 / 512, on 100 points
per dataset - Ravaut et al. 2024, "How Much are LLMs Contaminated? A Comprehensive Survey and the
LLMSanitize Library", Table 1; the 100 points are ``run.limit``, not a method parameter).

Where this implementation departs from the authors' code, and why:

- the p-value is by default the t statistic's exact permutation p (step 4), not Student's t: the
  paper's own argument (exchangeability of orderings) gives it exactly, where Student's t is an
  approximation that over-rejects with few shards;
- the t statistic uses the sample standard deviation (n - 1), as a t-test does; the authors' code
  (and LLMSanitize, which copies it) divides by ``np.std`` (ddof 0), which inflates t by
  sqrt(n / (n - 1)) and understates p;
- examples are joined as text and tokenised together; the authors tokenise each example alone and
  concatenate the ids, which for Llama tokenizers puts a BOS token before *every* example. Joined
  text is what a model trained on the file saw;
- shuffles are drawn per shard from a generator seeded by (``seed``, partition, shard), so a shard's
  permutations do not depend on how many other shards there are; unlike the authors' code (independent
  ``np.random.permutation`` draws) they are distinct and never the canonical order, and a shard with at
  most ``permutations_per_shard`` other orders scores each of them once (``unit_orders``; exact either way).
  Drawn with replacement, half the shuffles of a 2-unit shard are the canonical text again, tie with it and
  cannot count as evidence: on Winogrande-like twins in 5 shards x 5 shuffles about half of the layouts
  could not reach 0.05 at all; with the shard's one other order scored once they all reach 1/32;
- shards with fewer than 2 units cannot be reordered and are skipped (each row says why); an
  example whose configured fields are all empty is left out of the shards (an error row). LLMSanitize
  serialises examples as hand-built pseudo-JSON without escaping quotes or newlines; here they are
  real JSON (``json.dumps``).

Requests: one stage, one score request per order of every shard (key
``"<first record id of the shard>|shard<i>|canon"`` and ``...|perm<j>``, ``record_ids`` = the shard's
records; an other serialisation's keys start ``"<label>|"``), carrying ``context_len`` / ``stride`` so the
engine windows the longer ones.
``score_scope = "partition"``: ``score`` needs every shard of the partition at once.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from contamray.methods.base import (
    Applies,
    BenchmarkFacts,
    Method,
    Output,
    Outputs,
    Request,
    Verdict,
    every_row_failed,
    register,
)
from contamray.methods.closed.cell_rows import finite, output_map, row_failed, rows_of, truthy
from contamray.methods.closed.likelihood_text import (
    EXAMPLE_END,
    check_fields,
    empty_message,
    is_empty,
    serialise,
)
from contamray.methods.closed.likelihood_windows import read_scored, score_request
from contamray.methods.closed.order_structure import (
    RESIDUAL_ALPHA,
    OrderStructure,
    Residual,
    Similarity,
    Units,
    coarser_units,
    diagnose,
    merge_adjacent,
    residual,
)
from contamray.methods.closed.position_fields import PositionFields, Renumber, counter_runs
from contamray.methods.closed.position_fields import find as find_position_fields
from contamray.records import Record
from contamray.stats.tests import permutation_p_value, shard_permutation_test, t_test_greater

NAME = "sharded_likelihood"
MIN_SHARD = 2  # units (rows, or groups of rows) a shard needs to be reordered
MIN_SHARDS = 5  # default min_shards: tested shards below which the verdict is inconclusive
PERMUTE = ("groups", "rows")
TESTS = ("permutation", "t")
TEST_TEXT = {
    "permutation": "one-sided test of Oren et al.'s t statistic over shards (d = canonical - mean(shuffled)), "
    "p from its exact permutation distribution (any ordering of a shard as its canonical)",
    "t": "one-sided t-test of mean(d) > 0 over shards, d = canonical - mean(shuffled) (Student's t, the paper's)",
}
VARIANTS = {
    "groups": "group permutations (structure-aware)",
    "rows": "row permutations (Oren et al. 2023)",
}


@dataclass
class Config:
    """Parameters of the sharded test; defaults are the survey's preset (see the module docstring)."""

    seed: int = 0
    num_shards: int = 15
    permutations_per_shard: int = 25
    context_len: int = 1024
    stride: int = 512
    fields: tuple[str, ...] = ("input", "label")
    format: str = "json"
    alpha: float = 0.05
    permute: str = "groups"  # "groups": shuffle declared/detected groups as units; "rows": Oren et al.'s original
    detect_structure: bool = True  # also find groups from the data (adjacent-pair similarity)
    min_shards: int = MIN_SHARDS  # fewer tested shards (or more than half of num_shards untested): inconclusive
    allow_structured: bool = False  # decide even when the permuted units are not exchangeable (reproduce Oren)
    test: str = "permutation"  # p of the t statistic: "permutation" (exact, any shard count) or "t" (Student's t)
    # more ways the file may have been written ("FORMAT" or "FORMAT:FIELD+FIELD", e.g. "text:input"), each tested
    # beside (fields, format); the decision is their Bonferroni combination (module docstring)
    other_serialisations: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        where = f"methods.{NAME}"
        self.fields = check_fields(self.fields, self.format, where)
        self.other_serialisations = _check_serialisations(self.other_serialisations, self.fields, self.format, where)
        if self.test not in TESTS:
            raise ValueError(
                f"{where}.test: {self.test!r} is not one of {', '.join(TESTS)} (permutation: the t statistic's exact "
                "permutation p-value; t: Student's t, the paper's)"
            )
        if self.permute not in PERMUTE:
            raise ValueError(
                f"{where}.permute: {self.permute!r} is not one of {', '.join(PERMUTE)} (groups: structure-aware, "
                "rows: Oren et al.'s original)"
            )
        if self.num_shards < 1:
            raise ValueError(f"{where}.num_shards must be >= 1, got {self.num_shards} (paper 50, survey 15)")
        if self.permutations_per_shard < 1:
            raise ValueError(
                f"{where}.permutations_per_shard must be >= 1, got {self.permutations_per_shard} (paper 250, survey 25)"
            )
        if self.context_len < 2 or not 0 < self.stride < self.context_len:
            raise ValueError(
                f"{where}: need context_len >= 2 and 0 < stride < context_len, got context_len={self.context_len}, "
                f"stride={self.stride} (paper 2048/1024, survey 1024/512)"
            )
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"{where}.alpha must be in (0, 1), got {self.alpha}")
        if self.min_shards < 2:
            raise ValueError(f"{where}.min_shards must be >= 2 (the t-test needs 2 shards), got {self.min_shards}")


@dataclass(frozen=True)
class Serialisation:
    """One way of writing the examples as a file: the Record ``fields`` written as ``format``."""

    fields: tuple[str, ...]
    format: str

    @property
    def label(self) -> str:
        return "raw" if self.format == "raw" else f"{self.format}:{'+'.join(self.fields)}"

    @property
    def column(self) -> str:
        """The per-example column of this serialisation's shard d (beside ``d``, the first serialisation's)."""
        return "d_raw" if self.format == "raw" else f"d_{self.format}_{'_'.join(self.fields)}"


def _form(fields: Sequence[str], fmt: str) -> Serialisation:
    return Serialisation(() if fmt == "raw" else tuple(fields), fmt)  # raw: the dataset's row, whatever the fields


def parse_serialisation(spec: Any, default_fields: Sequence[str], where: str) -> Serialisation:
    """``"FORMAT"`` (the configured ``fields``) or ``"FORMAT:FIELD+FIELD"``; the error names ``where``."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{where}: expected \"FORMAT\" or \"FORMAT:FIELD+FIELD\" (e.g. \"text:input\"), got {spec!r}")
    fmt, _, names = spec.strip().partition(":")
    fields = tuple(f for f in names.split("+") if f) if names else tuple(default_fields)
    return _form(check_fields(fields, fmt, where), fmt)


def _check_serialisations(specs: Any, fields: tuple[str, ...], fmt: str, where: str) -> tuple[str, ...]:
    if isinstance(specs, str):
        specs = [specs]
    seen = [_form(fields, fmt)]
    for i, spec in enumerate(specs or ()):
        parsed = parse_serialisation(spec, fields, f"{where}.other_serialisations[{i}]")
        if parsed in seen:
            raise ValueError(
                f"{where}.other_serialisations[{i}]: {parsed.label} is already tested "
                f"({', '.join(s.label for s in seen)}); test each serialisation once (a repeat only raises the "
                "Bonferroni factor)"
            )
        seen.append(parsed)
    return tuple(s.label for s in seen[1:])


def serialisations(cfg: Config) -> list[Serialisation]:
    """``(fields, format)`` first, then ``other_serialisations``."""
    return [_form(cfg.fields, cfg.format)] + [
        parse_serialisation(spec, cfg.fields, "other_serialisations") for spec in cfg.other_serialisations
    ]


def _alone(cfg: Config, s: Serialisation) -> Config:
    """The single-serialisation test of ``s`` under ``cfg``'s other parameters."""
    return replace(cfg, fields=s.fields or cfg.fields, format=s.format, other_serialisations=())


# ----------------------------------------------------------------------------- layout


@dataclass
class Shard:
    """One contiguous run of examples of a partition (canonical order) and its permutations."""

    partition: str
    index: int
    records: list[Record]
    texts: list[str]  # serialised examples, each ending with the example separator
    units: list[list[int]] = field(default_factory=list)  # local row indices of each permutable unit
    orders: list[list[int]] = field(default_factory=list)  # [canonical, shuffle 1, ...] as row orders
    skip_reason: str = ""
    renumber: Renumber | None = None  # raw rows numbering their positions: each order written renumbered

    @property
    def base(self) -> str:
        return f"{self.records[0].id}|shard{self.index}" if self.records else f"{self.partition}|shard{self.index}"

    @property
    def record_ids(self) -> tuple[str, ...]:
        return tuple(r.id for r in self.records)

    def text(self, order: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
        """The concatenation in ``order`` and each example's character span in it (in that order)."""
        parts = self.renumber.texts(order) if self.renumber else [self.texts[i] for i in order]
        spans, pos = [], 0
        for part in parts:
            spans.append((pos, pos + len(part)))
            pos += len(part)
        return "".join(parts), spans

    def perm_key(self, j: int) -> str:
        return f"{self.base}|canon" if j == 0 else f"{self.base}|perm{j}"


def _shard_rng(seed: int, partition: str, index: int) -> np.random.Generator:
    digest = hashlib.blake2b(f"{seed}\x1f{partition}\x1f{index}".encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


def other_orders(n_units: int) -> int:
    """How many orders of ``n_units`` units differ from the canonical one: n! - 1 (counted up to 13 units; beyond,
    more than any shuffle count asks for)."""
    return math.factorial(min(n_units, 13)) - 1


def unit_orders(n_units: int, m: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """The other orders of a shard's ``n_units`` units that are scored beside the canonical one (the identity):
    every one of them once when there are at most ``m`` (n! - 1 <= m: 2 units have 1, 3 units 5, 4 units 23),
    else ``m`` distinct ones drawn uniformly without replacement (seeded draws, a repeat or the identity drawn
    again is drawn anew). Either way the canonical order is, given the set of scored orders, equally likely to
    be any of them under the null (the full group, or the identity plus a uniform subset of the rest: Hemerik &
    Goeman 2018, "Exact testing with random permutations", TEST 27), so the permutation p stays exact - and no
    scored order repeats the canonical one, which would tie with it in every choice and waste the shard's power
    (about half of the draws do in a 2-unit shard)."""
    identity = tuple(range(n_units))
    if other_orders(n_units) <= m:
        return [p for p in itertools.permutations(identity) if p != identity]
    seen, out = {identity}, []
    while len(out) < m:
        p = tuple(int(k) for k in rng.permutation(n_units))
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def _canonical(records: Sequence[Record]) -> list[Record]:
    """Records sorted by ``Record.order``; a repeated order makes the canonical order ambiguous."""
    seen: dict[int, str] = {}
    for r in records:
        if r.order in seen:
            raise ValueError(
                f"sharded_likelihood: records {seen[r.order]!r} and {r.id!r} of {r.partition!r} share order "
                f"{r.order}, so the canonical order is ambiguous; the benchmark adapter must set Record.order to "
                "the row's index in the split"
            )
        seen[r.order] = r.id
    return sorted(records, key=lambda r: r.order)


def shard_counts(n: int, num_shards: int) -> list[int]:
    """Examples per shard as the authors' code: ``n // k`` each, the first ``n % k`` shards one more."""
    return [n // num_shards + (1 if i < n % num_shards else 0) for i in range(num_shards)]


def chunk_units(units: Units, num_shards: int) -> list[Units]:
    """The units of each shard (contiguous, ``shard_counts`` units each; empty shards kept as [])."""
    out, start = [], 0
    for count in shard_counts(len(units), num_shards):
        out.append(units[start : start + count])
        start += count
    return out


@dataclass
class UnitChoice:
    """The units a partition's shards permute, where they come from, and whether the null is credible.

    ``credible``: the residual check found no structure between adjacent units inside the shards, and
    (``permute: rows``) no declared groups are split by row permutations.
    """

    units: Units
    source: str
    residual: Residual
    credible: bool
    tried: list[dict[str, Any]]
    problem: str = ""  # why the null is not credible (empty when credible)

    def to_dict(self) -> dict[str, Any]:
        return {
            "units_from": self.source,
            "n_permuted_units": len(self.units),
            **self.residual.to_dict(),
            "null_credible": self.credible,
            "units_tried": self.tried,
            "null_problem": self.problem,
        }


def _tried(label: str, units: Units, res: Residual, cfg: Config) -> dict[str, Any]:
    testable = sum(len(c) >= MIN_SHARD for c in chunk_units(units, cfg.num_shards))
    return {"units": label, "n_units": len(units), "testable_shards": testable, "residual_p_value": res.p_value}


def choose_units(structure: OrderStructure, rows: Sequence[Record], texts: Sequence[str], cfg: Config) -> UnitChoice:
    """The units to permute: rows (``permute: rows``) or the finest grouping without residual structure.

    ``permute: groups``: the diagnosis' units (declared + detected groups), else the first of
    ``coarser_units`` (finest first) whose shards show no residual structure; when none does, the
    diagnosis' units with ``credible=False``. ``permute: rows``: rows, credible when the rows inside the
    shards show no residual structure and no declared group is split.
    """
    sim = Similarity(texts)

    def check(units: Units) -> Residual:
        return _residual_of(units, sim, cfg)

    if cfg.permute == "rows":
        rows_units = [[i] for i in range(len(rows))]
        res = check(rows_units)
        problems = []
        if structure.declared_groups:
            problems.append(f"{structure.declared_groups} declared group(s) are split by row permutations")
        if res.found:
            problems.append(_residual_text(res, "adjacent rows"))
        return UnitChoice(rows_units, "rows", res, not problems, [_tried("rows", rows_units, res, cfg)],
                          "; ".join(problems))  # fmt: skip
    base = "declared + detected groups" if structure.declared_groups or structure.detected_links else "rows"
    res = check(structure.units)
    tried = [_tried(base, structure.units, res, cfg)]
    if not res.found:
        return UnitChoice(structure.units, base, res, True, tried)
    for label, units in coarser_units(structure.units, rows, sim, cfg.seed) if cfg.detect_structure else []:
        candidate = check(units)
        tried.append(_tried(label, units, candidate, cfg))
        if candidate.p_value is not None and not candidate.found:  # testable (>= 2 units in some shards) and clean
            return UnitChoice(units, label, candidate, True, tried)
    problem = (
        f"{_residual_text(res, 'adjacent units (' + base + ')')}, and none of the {len(tried) - 1} coarser "
        f"grouping(s) tried (declared topics, similarity merges) removed it with >= {MIN_SHARD} units in a shard"
        + ("" if cfg.detect_structure else " (detect_structure=false: no grouping from the data was tried)")
    )
    return UnitChoice(structure.units, base, res, False, tried, problem)


def _residual_of(units: Units, sim: Similarity, cfg: Config) -> Residual:
    return residual([c for c in chunk_units(units, cfg.num_shards) if len(c) >= MIN_SHARD], sim, cfg.seed)


def join_runs(choice: UnitChoice, together: Sequence[bool], texts: Sequence[str], cfg: Config) -> UnitChoice:
    """``choice`` with the units joined wherever ``together[i]`` says rows i and i + 1 must move as one (a raw
    row's counter holds one value over both: ``position_fields.counter_runs``); its residual structure checked
    again on the joined units."""
    joined = merge_adjacent(choice.units, [together[u[0] - 1] for u in choice.units[1:]])
    if len(joined) == len(choice.units):
        return choice
    res = _residual_of(joined, Similarity(texts), cfg)
    label = f"{choice.source}, joined into whole runs of the raw rows' counter"
    problem = choice.problem or (_residual_text(res, f"adjacent units ({label})") if res.found else "")
    return UnitChoice(joined, label, res, choice.credible and not res.found,
                      [*choice.tried, _tried(label, joined, res, cfg)], problem)  # fmt: skip


def _residual_text(res: Residual, what: str) -> str:
    return (
        f"{what} are more alike than the pairs a shuffle puts side by side (similarity {res.boundary_similarity:.3f} "
        f"vs {res.shuffled_similarity:.3f}, p={res.p_value:.2g} <= {RESIDUAL_ALPHA})"
    )


@dataclass
class Layout:
    """The shards of every partition, the empty records, each partition's order structure and units."""

    shards: list[Shard]
    empty: list[Record]
    structure: dict[str, OrderStructure]
    units: dict[str, UnitChoice] = field(default_factory=dict)
    positions: dict[str, PositionFields] = field(default_factory=dict)  # raw form: position-carrying fields


def layout(records: Sequence[Record], cfg: Config) -> Layout:
    """Shards of whole units (rows under ``permute: rows``, groups under ``permute: groups``)."""
    by_partition: dict[str, list[Record]] = {}
    for r in records:
        by_partition.setdefault(r.partition, []).append(r)
    out = Layout([], [], {})
    for partition, rows in by_partition.items():
        ordered = _canonical(rows)
        usable = [r for r in ordered if not is_empty(r, cfg.fields, cfg.format)]
        out.empty += [r for r in ordered if is_empty(r, cfg.fields, cfg.format)]
        lines = [serialise(r, cfg.fields, cfg.format) for r in usable]
        texts = [line + EXAMPLE_END[cfg.format] for line in lines]
        structure = diagnose(usable, texts, cfg.seed, detect=cfg.detect_structure)
        out.structure[partition] = structure
        choice = choose_units(structure, usable, texts, cfg)
        # the raw rows may number their positions; a shuffled file is written renumbered (position_fields), the
        # runs of a counter kept whole
        positions = find_position_fields(lines) if cfg.format == "raw" else PositionFields()
        if cfg.format == "raw":
            out.positions[partition] = positions
            if positions.counters:
                choice = join_runs(choice, counter_runs(lines, positions), texts, cfg)
        out.units[partition] = choice
        units = choice.units
        for i, shard_units in enumerate(chunk_units(units, cfg.num_shards)):
            if not shard_units:
                continue
            first = shard_units[0][0]
            rows_idx = [j for unit in shard_units for j in unit]
            shard = Shard(
                partition, i, [usable[j] for j in rows_idx], [texts[j] for j in rows_idx],
                units=[[j - first for j in unit] for unit in shard_units],
                renumber=Renumber(positions, [lines[j] for j in rows_idx], EXAMPLE_END[cfg.format])
                if positions.renumbered else None,
            )  # fmt: skip
            if len(shard_units) < MIN_SHARD:
                shard.skip_reason = (
                    f"shard {i} of {partition!r} holds {len(shard_units)} unit(s) ({len(units)} units of "
                    f"{len(usable)} usable examples in {cfg.num_shards} shards, permute={cfg.permute}); a shard "
                    f"needs at least {MIN_SHARD} to be reordered - lower num_shards or score more rows"
                )
            else:
                rng = _shard_rng(cfg.seed, partition, i)
                shard.orders = [list(range(len(shard.records)))] + [
                    [j for k in order for j in shard.units[k]]
                    for order in unit_orders(len(shard.units), cfg.permutations_per_shard, rng)
                ]
            out.shards.append(shard)
    return out


# ----------------------------------------------------------------------------- the method


@register
class ShardedLikelihood(Method):
    name = NAME
    family = "closed"
    Config = Config
    engine_roles = ("target",)
    score_scope = "partition"
    scores_text = True
    outputs = Outputs(
        score="d", score_label="shard d: canonical minus mean shuffled log-likelihood (nats; the row's shard)"
    )
    applies = Applies(min_rows=MIN_SHARD * MIN_SHARDS)

    def plan_warnings(self, cfg: Config, bench: BenchmarkFacts) -> list[str]:
        """Too few rows for ``num_shards`` shards of >= 2 units (under ``permute: groups`` a declared group - a
        Winogrande twin pair - is one unit), or rows that are not a contiguous block."""
        warnings: list[str] = []
        per_unit = _group_rows(bench.adapter) if cfg.permute == "groups" else 1
        need = _rows_needed(cfg.num_shards, per_unit)
        if cfg.num_shards < cfg.min_shards:
            warnings.append(
                f"{self.name} on {bench.name}: num_shards={cfg.num_shards} is below min_shards={cfg.min_shards}, so "
                f"the verdict will be inconclusive - raise num_shards to >= {cfg.min_shards} (with run.limit >= "
                f"{_rows_needed(cfg.min_shards, per_unit)}) or lower min_shards"
            )
        elif bench.limit is not None and bench.limit < need:
            fit = bench.limit // (MIN_SHARD * per_unit)
            lower = (
                f", or lower num_shards to {fit}" if fit >= cfg.min_shards else f" (min_shards={cfg.min_shards} "
                f"needs >= {_rows_needed(cfg.min_shards, per_unit)} rows even with num_shards={cfg.min_shards})"
            )
            unit = (f"{MIN_SHARD} rows" if per_unit == 1 else
                    f"{MIN_SHARD} units - {bench.adapter} declares groups of up to {per_unit} rows, each shuffled as "
                    "one unit")  # fmt: skip
            warnings.append(
                f"{self.name} on {bench.name}: limit={bench.limit} rows cannot fill num_shards={cfg.num_shards} shards "
                f"of >= {unit} (needs >= {need} contiguous rows); shards will be skipped and the verdict "
                f"inconclusive - raise run.limit (benchmarks.{bench.name}.limit) to >= {need}{lower}"
            )
        if bench.limit is not None and bench.sample != "first":
            warnings.append(
                f"{self.name} on {bench.name}: sample={bench.sample!r} takes rows with gaps in the canonical order; "
                "the test compares orders of neighbouring rows and is far weaker on a sample - set run.sample=first "
                f"(benchmarks.{bench.name}.sample=first) for a contiguous block"
            )
        return warnings

    # -- requests

    def requests(self, records: list[Record], cfg: Config, stage: int, outputs: dict[str, Output]) -> list[Request]:
        """Every order of every shard, per serialisation (the first's keys bare, the others' ``<label>|...``)."""
        if stage > 0:
            return []
        return [
            score_request(prefix + shard.perm_key(j), shard.record_ids, shard.text(order)[0], cfg.context_len,
                          cfg.stride)  # fmt: skip
            for _, prefix, alone in _each(cfg)
            for shard in layout(records, alone).shards
            if not shard.skip_reason
            for j, order in enumerate(shard.orders)
        ]

    # -- score

    def score(
        self, records: list[Record], outputs: Mapping[str, Output] | Iterable[Output], cfg: Config, **_: Any
    ) -> list[dict[str, Any]]:
        """One row per record: its shard's canonical and shuffled log-likelihoods, d and permutation p - of the
        first serialisation; each other one's d in its column (``d_<format>_<fields>``) and its whole row in
        ``other_serialisations`` (JSON by label), from which ``reduce`` tests it."""
        got = output_map(outputs)
        (_, _, first), *others = _each(cfg)
        rows = self._score_alone(records, got, first)
        if not others:
            return rows
        by_id = {row["record_id"]: row for row in rows}
        evidence: dict[str, dict[str, Any]] = {row["record_id"]: {} for row in rows}
        for form, prefix, alone in others:
            mine = {key[len(prefix):]: out for key, out in got.items() if key.startswith(prefix)}
            for row in self._score_alone(records, mine, alone):
                by_id[row["record_id"]][form.column] = row["d"]
                kept = {k: v for k, v in row.items() if k not in ("record_id", "partition", "order")}
                evidence[row["record_id"]][form.label] = kept
        for record_id, row in by_id.items():
            row["other_serialisations"] = json.dumps(evidence[record_id])
        return rows

    def _score_alone(self, records: list[Record], got: dict[str, Output], cfg: Config) -> list[dict[str, Any]]:
        laid = layout(records, cfg)
        rows: list[dict[str, Any]] = []
        for r in laid.empty:
            error = empty_message(r, cfg.fields, cfg.format)
            rows.append(self._row(r, None, error=error, status="excluded: empty example"))
        for shard in laid.shards:
            rows += self._score_shard(shard, got, cfg)
        for row in rows:
            structure = laid.structure.get(row["partition"])
            choice = laid.units.get(row["partition"])
            row["variant"] = VARIANTS[cfg.permute]
            diagnosis = {**structure.to_dict(), **choice.to_dict()} if structure and choice else {}
            if diagnosis and row["partition"] in laid.positions:
                diagnosis["position_fields"] = laid.positions[row["partition"]].to_dict()
            row["order_structure"] = json.dumps(diagnosis) if diagnosis else ""
        return rows

    def _row(self, record: Record, shard: Shard | None, error: str = "", status: str = "", **values: Any) -> dict:
        row: dict[str, Any] = {
            "record_id": record.id,
            "partition": record.partition,
            "order": record.order,
            "shard": shard.index if shard else None,
            "shard_size": len(shard.records) if shard else None,
            "shard_units": len(shard.units) if shard else None,
            "position": shard.records.index(record) if shard else None,
            "shard_status": status,
            "canonical_logprob": None,
            "shuffled_mean": None,
            "shuffled_sd": None,
            "d": None,
            "permutation_p": None,
            "n_permutations": 0,
            "canonical_repeats": None,
            "orderings_logprob": None,
            "n_windows": None,
            "note": "",
            "error": error,
        }
        row.update(values)
        return row

    def _score_shard(self, shard: Shard, outputs: Mapping[str, Output], cfg: Config) -> list[dict[str, Any]]:
        if shard.skip_reason:
            return [self._row(r, shard, status=f"skipped: {shard.skip_reason}") for r in shard.records]
        notes = []
        totals: list[float | None] = []
        errors: list[str] = []
        n_windows = 0
        for j in range(len(shard.orders)):
            try:
                scored = read_scored(outputs, shard.perm_key(j))
            except (KeyError, RuntimeError) as err:
                totals.append(None)
                errors.append(str(err).strip("'\""))
                continue
            totals.append(scored.total)
            n_windows = max(n_windows, scored.n_windows)
        if n_windows > 1:
            notes.append(
                f"longer than context_len={cfg.context_len} tokens: scored in up to {n_windows} rolling windows "
                f"(stride {cfg.stride})"
            )
        canonical = totals[0]
        shuffled = [t for t in totals[1:] if t is not None]
        if canonical is None or not shuffled:
            what = "the canonical order" if canonical is None else "every shuffled order"
            error = f"shard {shard.index}: {what} could not be scored: " + "; ".join(errors[:3])
            return [self._row(r, shard, error=error, status="failed", note="; ".join(notes)) for r in shard.records]
        if len(shuffled) < len(totals) - 1:
            notes.append(f"{len(totals) - 1 - len(shuffled)} shuffled order(s) failed and were left out: {errors[0]}")
        # a shuffle drawn equal to the canonical order (likely in a shard of few units: 2 units have 2 orders) scores
        # alike, so it ties with the canonical in every permutation choice: it bounds the p-value the shard allows
        repeats = sum(1 for j in range(1, len(totals)) if totals[j] is not None and shard.orders[j] == shard.orders[0])
        values = {
            "canonical_logprob": canonical,
            "shuffled_mean": float(np.mean(shuffled)),
            "shuffled_sd": float(np.std(shuffled, ddof=1)) if len(shuffled) > 1 else 0.0,
            "d": canonical - float(np.mean(shuffled)),
            "permutation_p": permutation_p_value(canonical, shuffled),
            "n_permutations": len(shuffled),
            "canonical_repeats": repeats,
            "orderings_logprob": json.dumps([canonical, *shuffled]),
            "n_windows": n_windows,
        }
        return [self._row(r, shard, status="scored", note="; ".join(notes), **values) for r in shard.records]

    # -- reduce

    def reduce(self, table: Any, cfg: Config) -> Verdict:
        """One-sided test over the shards' d_i per serialisation (reference rows, if any, are not part of it);
        with ``other_serialisations``, their Bonferroni combination (``_combine``)."""
        rows = [r for r in rows_of(table) if not truthy(r.get("is_reference"))]
        each = _each(cfg)
        if len(each) == 1:
            return self._reduce_alone(rows, cfg)
        # each serialisation's test passes the checks every decision passes (``settle``: rows that failed) before
        # it counts among those that can decide
        verdicts = [self.settle(self._reduce_alone(rows if i == 0 else [_row_of(r, form.label) for r in rows],
                                                   alone), alone)
                    for i, (form, _, alone) in enumerate(each)]  # fmt: skip
        return _combine([form for form, _, _ in each], verdicts, cfg)

    def _reduce_alone(self, rows: list[dict[str, Any]], cfg: Config) -> Verdict:
        partitions = sorted({str(r.get("partition", "")) for r in rows})
        if len(partitions) > 1:
            raise ValueError(
                f"sharded_likelihood.reduce: the table mixes partitions {partitions}; reduce one partition at a time"
            )
        failed = [r for r in rows if row_failed(r)]
        shards: dict[Any, dict[str, Any]] = {}
        skipped: dict[Any, str] = {}
        for r in rows:
            if r.get("shard") is None or (isinstance(r.get("shard"), float) and math.isnan(r["shard"])):
                continue
            key = int(r["shard"])
            status = str(r.get("shard_status") or "")
            if status == "scored" and finite(r.get("d")) is not None:
                shards.setdefault(key, r)
            elif status.startswith("skipped"):
                skipped[key] = status
        per_shard = [
            {
                "shard": k,
                "size": int(r["shard_size"]),
                "units": int(r["shard_units"]) if finite(r.get("shard_units")) is not None else None,
                "canonical_logprob": float(r["canonical_logprob"]),
                "shuffled_mean": float(r["shuffled_mean"]),
                "d": float(r["d"]),
                "permutation_p": float(r["permutation_p"]),
                "n_permutations": int(r["n_permutations"]),
                "canonical_repeats": int(finite(r.get("canonical_repeats")) or 0),
            }
            for k, r in sorted(shards.items())
        ]
        ds = [s["d"] for s in per_shard]
        structure = next((json.loads(r["order_structure"]) for r in rows if r.get("order_structure")), None)
        variant = next((str(r["variant"]) for r in rows if r.get("variant")), VARIANTS[cfg.permute])
        orderings = [json.loads(shards[s["shard"]]["orderings_logprob"]) for s in per_shard
                     if shards[s["shard"]].get("orderings_logprob")]  # fmt: skip
        test = cfg.test
        if test == "permutation" and len(orderings) != len(per_shard):
            raise ValueError(
                f"{len(per_shard) - len(orderings)} scored shard(s) carry no orderings_logprob (rows of an older "
                "version): the permutation p needs every order's log-likelihood; recompute the cell "
                "(run.force=true), or set test: t for Student's t"
            )
        details: dict[str, Any] = {
            "test": TEST_TEXT[test],
            "variant": variant,
            "order_structure": structure,
            "alpha": cfg.alpha,
            "num_shards": cfg.num_shards,
            "permutations_per_shard": cfg.permutations_per_shard,
            "context_len": cfg.context_len,
            "stride": cfg.stride,
            "fields": list(cfg.fields),
            "format": cfg.format,
            "n_shards_tested": len(per_shard),
            "shards": per_shard,
            "skipped_shards": [{"shard": k, "reason": v} for k, v in sorted(skipped.items())],
            "n_shards_permutation_significant": sum(s["permutation_p"] <= cfg.alpha for s in per_shard),
            "mean_d": float(np.mean(ds)) if ds else None,
        }
        if failed:
            details["errors"] = sorted({f"{r.get('record_id')}: {r['error']}" for r in failed})[:5]
        orders = sorted(int(r["order"]) for r in rows if finite(r.get("order")) is not None)
        gaps = np.diff(orders) if len(orders) > 1 else np.zeros(0)
        if gaps.size and gaps.max() > 1:
            details["order_gaps"] = {"max": int(gaps.max()), "median": float(np.median(gaps))}
            details["warning"] = (
                "the rows are not consecutive in the split (a sample with gaps): a model that learnt the file "
                "learnt which row follows which, so the test is far weaker on a sample than on a contiguous "
                "block (the authors use the first rows); prefer a contiguous range of rows"
            )
        statistic, p_value, contaminated = math.nan, None, False
        if len(ds) >= 2:
            student = t_test_greater(ds)
            res = shard_permutation_test(orderings, seed=cfg.seed) if test == "permutation" else student
            statistic, p_value = res.statistic, res.p_value
            contaminated = p_value <= cfg.alpha
            details["t_sd"] = student.detail["sd"]
            details["t_test_p"] = student.p_value  # Student's t p-value, the paper's (evidence beside the decision)
            if test == "permutation":
                details["permutation_null"] = {
                    **{k: res.detail[k] for k in ("null", "n_null")},
                    "min_p": max(res.detail["min_p"], _tied_min_p(per_shard)),
                    "canonical_repeats": sum(s["canonical_repeats"] for s in per_shard),
                }
        per_unit = _rows_per_unit(structure, len(rows))
        problems = _power_problems(len(ds), len(skipped), cfg, per_unit) + _null_problems(structure, cfg, details)
        if not ds and failed and len(failed) == len(rows):  # nothing was scored: say why first
            problems.insert(0, every_row_failed(len(rows), str(failed[0].get("error"))))
        null = details.get("permutation_null", {})
        reach = null.get("min_p")
        if not problems and reach is not None and reach > cfg.alpha:
            problems.append(_unreachable(per_shard, reach, null.get("canonical_repeats", 0), cfg))
        if problems:
            details["inconclusive_reasons"] = problems
        details["summary"] = _summary(variant, structure, problems)
        verdict = Verdict(
            method=NAME,
            partition=partitions[0] if partitions else "",
            statistic=float(statistic),
            contaminated=bool(contaminated),
            p_value=p_value,
            min_p=reach if p_value is not None else None,  # Student's t (test: t) has no floor
            rate=None,
            n_examples=len(rows),
            n_failed=len(failed),
            details=details,
        )
        return verdict.make_inconclusive("; ".join(problems)) if problems else verdict


def _each(cfg: Config) -> list[tuple[Serialisation, str, Config]]:
    """(serialisation, request key prefix, its single-serialisation config) of every serialisation tested, the
    first's keys unprefixed."""
    return [(form, "" if i == 0 else f"{form.label}|", _alone(cfg, form))
            for i, form in enumerate(serialisations(cfg))]  # fmt: skip


def _row_of(row: dict[str, Any], label: str) -> dict[str, Any]:
    """A stored row as the single test of serialisation ``label`` wrote it (``score``'s ``other_serialisations``)."""
    stored = row.get("other_serialisations")
    evidence = json.loads(stored).get(label) if isinstance(stored, str) and stored else None
    base = {k: row.get(k) for k in ("record_id", "partition", "order")}
    if evidence is None:
        return {**base, "error": f"no result of serialisation {label} in this row (recompute the cell)"}
    return {**base, **evidence}


def _combine(forms: list[Serialisation], verdicts: list[Verdict], cfg: Config) -> Verdict:
    """The decision over several serialisations: Bonferroni, p = min(1, k x the smallest p) over the k that can
    decide. Whether one can (shard counts, the residual-structure check on the texts, failed requests) does not
    depend on the order likelihoods, so each decidable test is valid at its level and the minimum over k at
    alpha / k keeps the level alpha, whatever the tests' dependence. None decidable: inconclusive."""
    first = verdicts[0]
    by = {
        form.label: {"decision": v.decision, "p_value": v.p_value, "statistic": v.statistic, "reason": v.reason,
                     "summary": v.details.get("summary", "")}  # fmt: skip
        for form, v in zip(forms, verdicts, strict=True)
    }
    details = {**first.details, "serialisations": [f.label for f in forms], "by_serialisation": by}
    decided = [(f, v) for f, v in zip(forms, verdicts, strict=True) if v.decision != "inconclusive" and
               v.p_value is not None]  # fmt: skip
    common = {"method": NAME, "partition": first.partition, "rate": None, "n_examples": first.n_examples}
    if not decided:
        reasons = sorted({v.reason for v in verdicts})
        reason = reasons[0] if len(reasons) == 1 else "; ".join(f"{f.label}: {v.reason}" for f, v in
                                                                 zip(forms, verdicts, strict=True))  # fmt: skip
        details["summary"] = f"none of the {len(forms)} serialisations could decide"
        return Verdict(statistic=first.statistic, p_value=None, details=details, decision="inconclusive",
                       reason=reason, n_failed=max(v.n_failed for v in verdicts), **common)  # fmt: skip
    details.pop("inconclusive_reasons", None)  # the first serialisation's alone; each one's is in by_serialisation
    form, best = min(decided, key=lambda fv: fv[1].p_value)
    p_value = min(1.0, len(decided) * float(best.p_value))
    contaminated = p_value <= cfg.alpha
    deciding = {f for f, _ in decided}
    undecided = [f.label for f in forms if f not in deciding]
    details["summary"] = (
        f"Bonferroni over {len(decided)} serialisation(s): smallest p {best.p_value:.3g} ({form.label}) x "
        f"{len(decided)} = {p_value:.3g}" + (f"; undecided: {', '.join(undecided)}" if undecided else "")
        + f" -> {'contaminated' if contaminated else 'clean'}; "
        + "; ".join(f"{f.label}: p={v.p_value:.3g}" for f, v in decided)
    )
    details["decided_by"] = form.label
    floors = [v.min_p for _, v in decided]
    floor = None if None in floors else min(1.0, len(decided) * min(floors))  # type: ignore[type-var]
    # the deciding test's failed rows: a serialisation that could not decide (e.g. no raw rows) does not count
    return Verdict(statistic=best.statistic, p_value=p_value, contaminated=contaminated, details=details,
                   n_failed=best.n_failed, min_p=floor, **common)  # fmt: skip


def _tied_min_p(per_shard: list[dict[str, Any]]) -> float:
    """The smallest exact permutation p the shards' layouts allow: a shard whose ``c`` shuffles repeat its
    canonical order (the same text, the same score) has ``1 + c`` of its ``1 + m`` orderings tied with the
    canonical in every choice of the null, so p >= prod((1 + c_i) / (1 + m_i))."""
    return math.prod((1 + s["canonical_repeats"]) / (1 + s["n_permutations"]) for s in per_shard)


def _group_rows(adapter: str) -> int:
    """The rows one of the adapter's declared groups takes (``Adapter.group_rows``; 1: no groups declared, or an
    unknown adapter)."""
    from contamray.benchmarks import get_adapter

    try:
        return max(1, int(get_adapter(adapter).group_rows))
    except (KeyError, ValueError):
        return 1


def _unreachable(per_shard: list[dict[str, Any]], reach: float, repeats: int, cfg: Config) -> str:
    """Why no ordering preference could reach alpha with these shards, and what to change."""
    sizes = [s["units"] or s["size"] for s in per_shard]
    few = [s for s in per_shard if s["units"] and other_orders(s["units"]) < cfg.permutations_per_shard]
    if repeats:  # rows of an older version, which drew shuffles with replacement
        why = (f" ({repeats} shuffle(s) drew the canonical order again and tie with it: shards of "
               f"{min(sizes)}-{max(sizes)} units have few orders)")  # fmt: skip
    elif few:
        small = min(s["units"] for s in few)
        why = (f" ({len(few)} shard(s) of as few as {small} units have only {other_orders(small)} other "
               f"order(s), each scored once)")  # fmt: skip
    else:
        why = ""
    fix = ("score more contiguous rows so that each shard holds more units, or lower num_shards" if repeats or few
           else "raise permutations_per_shard or num_shards")  # fmt: skip
    return (f"the smallest p-value {len(per_shard)} shards of these orders can give is {reach:.3g} > "
            f"alpha={cfg.alpha}{why} - {fix}")  # fmt: skip


def _rows_needed(shards: int, per_unit: float = 1.0) -> int:
    """Contiguous rows that fill ``shards`` shards of ``MIN_SHARD`` units each, at ``per_unit`` rows a unit (a declared
    group - a Winogrande twin pair, a HellaSwag run of one activity - is one unit)."""
    return math.ceil(MIN_SHARD * shards * per_unit)


def _rows_per_unit(structure: dict[str, Any] | None, n_rows: int) -> float:
    """Rows per permuted unit in this partition (1 when every row is a unit, or nothing was laid out)."""
    units = (structure or {}).get("n_permuted_units") or 0
    return max(1.0, n_rows / units) if units else 1.0


def _power_problems(tested: int, skipped: int, cfg: Config, per_unit: float = 1.0) -> list[str]:
    """Why the shards tested cannot carry a decision: fewer than ``min_shards``, or most shards untested."""
    fix = _power_fix(cfg, per_unit)
    if tested < cfg.min_shards:
        return [
            f"only {tested} shard(s) could be tested ({skipped} skipped of num_shards={cfg.num_shards}; see "
            f"skipped_shards and errors); the test needs >= min_shards={cfg.min_shards} - {fix}"
        ]
    untested = cfg.num_shards - tested
    if untested > cfg.num_shards / 2:
        return [
            f"{untested} of the {cfg.num_shards} configured shards were not tested ({skipped} skipped: fewer than "
            f"{MIN_SHARD} units); a test on the rest is not the configured one - {fix}"
        ]
    return []


def _power_fix(cfg: Config, per_unit: float = 1.0) -> str:
    """The rows to score for ``MIN_SHARD`` units a shard, at this partition's rows per unit (a HellaSwag run of one
    activity, a Winogrande twin pair is one unit)."""
    units = "" if per_unit == 1 else f"; its units hold {per_unit:.2g} rows on average"
    if cfg.num_shards < cfg.min_shards:
        return (
            f"num_shards={cfg.num_shards} is below min_shards={cfg.min_shards}: raise num_shards to "
            f">= {cfg.min_shards} (with run.limit >= {_rows_needed(cfg.min_shards, per_unit)} contiguous rows, "
            f"run.sample=first{units}) or lower min_shards"
        )
    return (
        f"score more contiguous rows (run.limit >= {_rows_needed(cfg.num_shards, per_unit)} with "
        f"run.sample=first{units}) or lower num_shards (to no less than min_shards={cfg.min_shards})"
    )


def _null_problems(structure: dict[str, Any] | None, cfg: Config, details: dict[str, Any]) -> list[str]:
    """Why the permutation null is not credible (see ``choose_units``); none under ``allow_structured``."""
    if not structure:
        return []
    numbered = _position_problems(structure.get("position_fields") or {}, cfg, details)
    if structure.get("null_credible", True):
        if structure.get("structured") and cfg.permute == "rows":
            details["warning_structure"] = (
                "the canonical order is structured (see order_structure) and rows were permuted; inside the shards "
                "the rows show no residual structure, so the null holds at this shard size, but permute=groups is safer"
            )
        return numbered
    problem = structure.get("null_problem") or "the permuted units are not exchangeable"
    if cfg.permute == "rows":
        fix = "use permute=groups (the structure-aware default), or allow_structured=true to reproduce Oren et al."
    else:
        fix = (
            "the structure cannot be permuted away at this size: score a block without it (e.g. one MMLU subject), "
            "more rows per shard (fewer num_shards), or allow_structured=true to decide anyway"
        )
    text = f"the permutation null is not credible: {problem} ({structure.get('summary', '')}); {fix}"
    if cfg.allow_structured:
        details["warning_structure"] = f"decided although {text} (allow_structured=true)"
        return numbered
    return numbered + [text]


def _position_problems(positions: dict[str, Any], cfg: Config, details: dict[str, Any]) -> list[str]:
    """Raw rows with fields that follow the row order but cannot be renumbered (``position_fields``): any model
    prefers the canonical file's numbering to a shuffle's, so the null is not credible; none under
    ``allow_structured``."""
    unheld = positions.get("unheld") or {}
    if not unheld:
        return []
    names = ", ".join(f"{k!r} (Kendall tau {v:.2f} with the row position)" for k, v in unheld.items())
    text = (
        f"the permutation null is not credible: the raw rows' field(s) {names} follow the row order but are not an "
        "index, a reference to one or a counter of whole units, so a shuffle cannot be renumbered as the file would "
        "be and any model prefers the canonical numbering; score format json (or text) with fields, or "
        "allow_structured=true to decide anyway"
    )
    if cfg.allow_structured:
        details["warning_position_fields"] = f"decided although {text} (allow_structured=true)"
        return []
    return [text]


def _summary(variant: str, structure: dict[str, Any] | None, problems: list[str]) -> str:
    """One line: the variant, the order diagnosis, the units permuted and the first warning."""
    parts = [variant]
    if structure:
        parts.append(f"order: {structure['summary']}")
        if structure.get("units_from"):
            res = structure.get("residual_p_value")
            parts.append(
                f"units: {structure['units_from']} ({structure.get('n_permuted_units')}), residual structure "
                + (f"p={res:.2g}" if res is not None else "not testable")
            )
        numbered = (structure.get("position_fields") or {}).get("summary")
        if numbered:
            parts.append(numbered)
    if problems:
        parts.append(f"inconclusive: {problems[0]}")
    return "; ".join(parts)
