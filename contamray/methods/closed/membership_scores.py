"""Per-example membership scores from token log-probabilities, and their partition-level test.

One module for six closely related reference-free (and one reference-model) detectors, because they
differ only in the number they compute from the same per-token scores. Every score is oriented so
that **higher means more likely seen in training** (the ``score`` column):

- ``min_k`` - Min-K% Prob, Shi et al., "Detecting Pretraining Data from Large Language Models"
  (ICLR 2024, arXiv:2310.16789; code github.com/swj0419/detect-pretrain-code): the mean of the k %
  lowest token log-probabilities. The paper sweeps k in {5, 10, 20, 30, 40, 50, 60} % and recommends
  k = 20 %; every k of ``ks`` is reported, ``k`` decides.
- ``min_k_plus_plus`` - Min-K%++, Zhang et al., "Min-K%++: Improved Baseline for Detecting Pre-Training
  Data from Large Language Models" (ICLR 2025, arXiv:2404.02936; code github.com/zjysteven/mink-plus-plus):
  per token ``(log p(x_t) - mu_t) / sigma_t`` with ``mu_t``, ``sigma_t`` the mean and standard deviation
  of ``log p(z)`` under ``z ~ p(. | x_<t)`` over the whole vocabulary, then the mean of the k % lowest.
  The authors' code sweeps k in {10, ..., 100} %; ``k`` defaults to 20 % (MIMIR's default, the one the
  Min-K% paper recommends). Needs ``vocab_stats`` from the engine: backend ``hf``.
- ``perplexity`` - the loss attack (Yeom et al. 2018; the "PPL" baseline of Carlini et al. 2021 and
  Shi et al.): mean token log-probability, i.e. minus log-perplexity.
- ``zlib_ratio`` - Carlini et al., "Extracting Training Data from Large Language Models" (USENIX
  Security 2021): log-perplexity over zlib entropy; here mean log-probability / zlib-compressed bytes,
  as the Min-K%++ code (Shi et al.'s ``log(ppl) / zlib`` with the sign flipped).
- ``lowercase_ratio`` - Carlini et al. 2021: log-perplexity of the lowercased text over that of the
  text: ``mean_logprob(lower) / mean_logprob(text)``.
- ``reference_ratio`` - Carlini et al. 2021's reference-model ("Small"/"Ref") attack: log-perplexity
  of the target minus that of a reference model (the log of the perplexity ratio), sign flipped:
  ``mean_logprob_target - mean_logprob_reference``. The reference model is the engine role
  ``"reference"`` (a second model; requests carry ``engine="reference"``).

The text of an example is its configured ``fields`` (``likelihood_text``). A text longer than
``context_len`` tokens is scored by the engine in rolling windows over its token ids, like the sharded
test (``likelihood_windows``: one request, ``Output.n_windows``), so no token is cut off.

Partition-level decision (``reduce``): a membership score means little alone - its level depends on the
text (length, vocabulary, how web-like it is) as much as on training - so the partition's scores are
compared with those of a *reference partition known to be unseen* (``reference``: a benchmark key, or a
mapping benchmark key -> reference key; the runner appends its rows with ``is_reference``) by a one-sided
Mann-Whitney U test (H1: the partition scores higher); ``statistic`` is the AUC of partition vs
reference (U / n1 n2; 0.5 = no difference). What the test means depends on ``mode``:

- ``heldout`` (the default): the reference is an i.i.d. held-out partition *of the same benchmark*, known
  unseen - another split of the same dataset config, or another draw of the same generator (e.g.
  ``synthetic_facts`` ``set1`` for ``synthetic_facts``), as the held-out "validation" set of Dataset
  Inference (Maini et al., "LLM Dataset Inference: Did you train on my dataset?", NeurIPS 2024,
  arXiv:2406.06443), which compares a suspect set's membership scores with those of an i.i.d. unseen
  set of the same distribution.
  **Null**: the partition and the held-out rows are exchangeable draws of one distribution and neither
  was seen; their scores are then exchangeable too, and the Mann-Whitney test is exact (its p-value is
  the permutation p-value of the rank sum; scipy's normal approximation beyond 8 rows a side). Under H1
  the partition was seen and scores higher. (Maini et al. aggregate several membership scores with a
  learned linear map and a t-test; here each method's one score is tested by ranks.) The plan refuses
  (``check_reference``) a reference from another adapter, one reading the same rows, and another
  *config* of a hub dataset (MMLU subjects, GSM8K main/socratic, Winogrande sizes are different subsets
  or formats, not draws; another split of the same config, or another config of a generated benchmark,
  is). With ``sample: first`` the held-out is exchangeable only if the dataset's row order does not
  depend on content.
- ``distribution`` (only when asked): the reference is any benchmark known unseen, e.g. synthetic facts
  against ARC. **Null**: the two benchmarks' scores come from one distribution - which is false for
  almost any two benchmarks: a lower loss on ARC than on synthetic facts says ARC is easier or more
  web-like, not that it leaked (Duan et al., "Do Membership Inference Attacks Work on Large Language
  Models?", COLM 2024, arXiv:2402.07841; Das et al., "Blind Baselines Beat Membership Inference Attacks
  for Foundation Models", 2024, arXiv:2406.16201; Maini et al. 2024). The verdict says so in
  ``details["null"]`` and ``details["summary"]``: "distribution comparison: a difference may be
  benchmark shift, not contamination".

The partition test is ``HeldoutMethod`` (config keys ``reference``, ``mode``, ``alpha``, ``units``,
``block_rows``, checked by ``check_heldout_test``); it tests whichever per-example column a method declares
as ``outputs.score``, so other per-example scores decide by the same held-out comparison (CDD's peakedness,
``methods/closed/cdd.py``).

Units, not rows (``units``, ``block_rows``; ``contamray.stats.clusters``): the rank test needs each side to
be a sample of independent units. A contiguous block of a split is a cluster sample - twins, runs of one
activity, entity or subject sit together and share most of what a score measures - so counting its rows
as independent over-rejects (runs of 3-6 rows at intra-run correlation 0.3, as measured on
``synthetic_structured``: 13 % of clean 20-row slices flagged at alpha = 0.05, ``tests/test_clusters.py``).
With ``units: auto`` declared groups and topics are units, and a side that is a contiguous block of its
split (unless its dataset declares its rows independent draws) is cut into blocks of ``floor(sqrt(n))``
(at least ``block_rows``) consecutive rows - batch means - and so is the other side; each unit scores
its rows' mean, and the test runs on units (4.3 % and 5.0 % flagged at 20 and 100 rows). A random sample
(``sample: random``) keeps its rows as units. Blocks cost power on small contiguous slices: 20 rows a
side are 4 blocks, and a block test needs near-complete separation. ``details["units"]`` says what was
tested; the row-level p, had the rows been independent, is kept in ``rows_p_value_if_independent``.

Why a held-out and not a paired test against zero: comparing each example with a perturbation of itself
(a paraphrase, neighbour or word-swapped copy) and testing the mean gap > 0 needs no second partition,
but its null is not "gap = 0": the original is fluent human text and the perturbation is less fluent,
so even a never-seen text scores higher than its perturbations and the gap is positive under H0 (the
test flags every clean benchmark). Calibrating the gap needs its distribution on unseen text of the
same kind - a held-out again. Hence ``heldout`` is the default.

The decision is three-valued. ``inconclusive`` (with a reason naming what to set) when there are no
reference rows (no ``reference`` for this benchmark, or the partition is itself a reference: the
yardstick is never tested), when the reference rows come from another benchmark in ``heldout`` mode,
when either side has fewer than ``applies.min_rows`` scored rows, or when even the most extreme ranking
could not reach ``alpha`` (the smallest one-sided p with n1, n2 units is ``1 / C(n1 + n2, n1)``).
``min_rows`` = 10 a side: by Noether's formula (Noether, JASA 1987), 80 % power at alpha = 0.05 for an AUC of 0.8 needs
about 12 rows a side (0.75: 17), so fewer rows can only find blatant contamination. Otherwise
``contaminated`` when p <= ``alpha``, else ``clean``. Every column of ``score_columns`` (e.g. each k
of Min-K%) is tested in ``details["by_column"]``; only ``score`` decides.

Instance level: when records carry membership labels (``member`` column, e.g. an injected fraction of a
partition) the ROC AUC and TPR at 5 % FPR (``auc_member``, ``tpr_at_5pct_fpr``) rank members against
non-members *of the same benchmark*: the partition's labelled rows, plus - in ``heldout`` mode only - the
reference rows of the same adapter, as non-members unless labelled. Rows of another benchmark are never
counted (that AUC would measure benchmark shift again).

Where this departs from the authors' code, and why:

- ``int(k * n)`` tokens is 0 for short texts in both reference implementations (the mean of nothing,
  NaN); here at least one token is kept;
- a vocabulary standard deviation of 0 (the model puts all mass on one token) would divide by zero in
  the Min-K%++ code; here sigma is floored at ``1e-6``;
- LLMSanitize (``model_methods/min_prob.py``) computes the reference "calibration" as
  ``mean_logprob_target - mean_logprob_ref`` but then ranks it as if *lower* meant member (as Shi et
  al.'s loss difference), so its reference attack is inverted; its zlib ratio divides a perplexity's log
  by zlib length correctly. Here every score is ranked one way (higher = member).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from contamray.methods.base import Applies, BenchmarkFacts, Method, Output, Outputs, Request, Verdict, register
from contamray.methods.closed.cell_rows import finite, missing, output_map, rows_of, truthy
from contamray.methods.closed.likelihood_text import check_fields, empty_message, is_empty, serialise
from contamray.methods.closed.likelihood_windows import Scored, read_scored, score_request
from contamray.records import Record
from contamray.stats.clusters import UNIT_MODES, paired_units, unit_key, unit_means
from contamray.stats.tests import describe, mann_whitney_greater, roc_auc, tpr_at_fpr

SIGMA_FLOOR = 1e-6
MIN_K_KS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
MIN_K_PP_KS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


MODES = ("heldout", "distribution")
NULLS = {
    "heldout": (
        "the partition and the held-out rows are exchangeable draws of one benchmark, neither seen by the model "
        "(one-sided Mann-Whitney U, exact under this null)"
    ),
    "distribution": (
        "the partition's scores and the other benchmark's come from one distribution; distribution comparison: "
        "a difference may be benchmark shift, not contamination"
    ),
}
SHIFT_CAVEAT = "distribution comparison: a difference may be benchmark shift, not contamination"
MIN_ROWS = 10  # a side; Noether: ~12 a side give 80 % power at alpha 0.05 for an AUC of 0.8


@dataclass
class MembershipConfig:
    """What every membership score shares: the text, the windows and the partition-level test."""

    fields: tuple[str, ...] = ("input", "label")
    format: str = "text"
    context_len: int = 2048
    stride: int = 1024
    # benchmark key of a partition known to be unseen, or a mapping benchmark key -> such a key
    reference: str | dict[str, str] = ""
    mode: str = "heldout"  # heldout: the reference is a held-out of the same benchmark; distribution: any
    alpha: float = 0.05
    units: str = "auto"  # auto: declared groups, blocks of block_rows when contiguous; declared; rows
    block_rows: int = 5
    method_name: ClassVar[str] = "membership"

    def __post_init__(self) -> None:
        where = f"methods.{self.method_name}"
        self.fields = check_fields(self.fields, self.format, where)
        if self.context_len < 2 or not 0 < self.stride < self.context_len:
            raise ValueError(
                f"{where}: need context_len >= 2 and 0 < stride < context_len, got {self.context_len} / {self.stride}"
            )
        check_heldout_test(self, where)


class HeldoutParams(Protocol):
    """The held-out test's keys (``MembershipConfig`` has them, and so does any ``HeldoutMethod``'s config)."""

    reference: str | dict[str, str]
    mode: str
    alpha: float
    units: str
    block_rows: int


def check_heldout_test(cfg: HeldoutParams, where: str) -> None:
    """Validate (and normalise ``reference`` of) the held-out test's keys every ``HeldoutMethod`` config has:
    ``reference``, ``mode``, ``alpha``, ``units``, ``block_rows``; errors name the key and the choices."""
    if not 0.0 < cfg.alpha < 1.0:
        raise ValueError(f"{where}.alpha must be in (0, 1), got {cfg.alpha}")
    if cfg.mode not in MODES:
        raise ValueError(
            f"{where}.mode: {cfg.mode!r} is not one of {', '.join(MODES)} (heldout: test against a held-out "
            "partition of the same benchmark; distribution: against any benchmark, a distribution comparison)"
        )
    cfg.reference = _reference(cfg.reference, f"{where}.reference")
    if cfg.units not in UNIT_MODES:
        raise ValueError(
            f"{where}.units: {cfg.units!r} is not one of {', '.join(UNIT_MODES)} (auto: declared groups and "
            "topics, and blocks of block_rows consecutive rows when a side is a contiguous block of its split; "
            "declared: declared groups and topics only; rows: every row is an independent draw)"
        )
    if cfg.block_rows < 1:
        raise ValueError(f"{where}.block_rows must be >= 1, got {cfg.block_rows}")


def _reference(value: Any, where: str) -> str | dict[str, str]:
    """``reference`` as one key ("" = none) or a mapping benchmark key -> reference key."""
    if value is None or value == "":
        return ""
    if isinstance(value, Mapping):
        bad = [k for k, v in value.items() if not isinstance(v, str) or not v]
        if bad:
            raise ValueError(f"{where}: expected benchmark key -> reference benchmark key, got no key for {bad}")
        return {str(k): str(v) for k, v in value.items()}
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a benchmark key or a mapping benchmark -> key, got {value!r}")
    return value


def _check_ks(k: float, ks: Sequence[float], where: str) -> tuple[float, ...]:
    ks = tuple(float(x) for x in ks)
    bad = [x for x in (*ks, k) if not 0.0 < x <= 1.0]
    if bad:
        raise ValueError(f"{where}: k values are fractions in (0, 1] (0.2 = 20 %), got {bad}")
    return ks if k in ks else tuple(sorted((*ks, k)))


@dataclass
class MinKConfig(MembershipConfig):
    k: float = 0.2
    ks: tuple[float, ...] = MIN_K_KS
    method_name: ClassVar[str] = "min_k"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.ks = _check_ks(self.k, self.ks, f"methods.{self.method_name}")


@dataclass
class MinKPlusPlusConfig(MinKConfig):
    ks: tuple[float, ...] = MIN_K_PP_KS
    method_name: ClassVar[str] = "min_k_plus_plus"


@dataclass
class PerplexityConfig(MembershipConfig):
    method_name: ClassVar[str] = "perplexity"


@dataclass
class ZlibConfig(MembershipConfig):
    method_name: ClassVar[str] = "zlib_ratio"


@dataclass
class LowercaseConfig(MembershipConfig):
    method_name: ClassVar[str] = "lowercase_ratio"


@dataclass
class ReferenceRatioConfig(MembershipConfig):
    method_name: ClassVar[str] = "reference_ratio"


# ----------------------------------------------------------------------------- per-token arithmetic


def k_count(n: int, k: float) -> int:
    """Tokens in the lowest k %: ``int(k * n)`` as the authors, but at least one."""
    return max(1, int(k * n))


def min_k_mean(values: Sequence[float], k: float) -> float:
    """Mean of the ``k_count`` smallest values."""
    arr = np.sort(np.asarray(values, dtype=np.float64))
    return float(arr[: k_count(arr.size, k)].mean())


def min_k_plus_plus_tokens(logprobs: Sequence[float], mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """Per-token ``(log p - mu) / sigma`` (sigma floored at ``SIGMA_FLOOR``)."""
    lp = np.asarray(logprobs, dtype=np.float64)
    mu = np.asarray(mean, dtype=np.float64)
    sd = np.maximum(np.asarray(std, dtype=np.float64), SIGMA_FLOOR)
    return (lp - mu) / sd


def zlib_bytes(text: str) -> int:
    return len(zlib.compress(text.encode("utf-8")))


# ----------------------------------------------------------------------------- shared machinery


def _failed(row: Mapping[str, Any]) -> bool:
    error = row.get("error")
    return isinstance(error, str) and bool(error.strip())


@dataclass(frozen=True)
class Variant:
    """One text of an example scored on one engine (e.g. the lowercased text, or the reference model)."""

    name: str  # "text", "lower"
    engine: str  # "target", "reference"
    text: str
    vocab_stats: bool = False

    def base(self, record_id: str) -> str:
        return f"{record_id}|{self.name}@{self.engine}"


class HeldoutMethod(Method):
    """A method whose partition verdict compares its per-example score (``outputs.score``, higher = seen) with
    the rows of a held-out partition of the same benchmark known unseen (see the module docstring): the plan
    checks (``check_reference``, ``plan_warnings``) and ``reduce``. Its config has the keys
    ``check_heldout_test`` validates; its ``score`` rows carry ``row_keys(record)`` (the partition and what
    makes the sampling units) and ``error``."""

    family = "closed"
    engine_roles: ClassVar[tuple[str, ...]] = ("target",)
    applies: ClassVar[Applies] = Applies(min_rows=MIN_ROWS)

    def row_keys(self, record: Record) -> dict[str, Any]:
        """The columns of a ``score`` row the test reads besides the score: the record, its partition and
        what makes its sampling units (split order, declared unit, whether the dataset's rows are independent)."""
        return {
            "record_id": record.id,
            "partition": record.partition,
            "order": record.order,
            "unit_key": unit_key(record.meta),
            "independent_rows": _independent_rows(record.partition),
        }

    # plan checks ---------------------------------------------------------------
    def check_reference(self, cfg: HeldoutParams, bench: BenchmarkFacts, reference: BenchmarkFacts) -> str | None:
        """Refuse a reference that cannot serve: the same rows (any mode); in ``heldout`` mode, another
        benchmark, or another config of a hub dataset (a different subset or format, not a draw)."""
        mine, theirs = _resolved(bench), _resolved(reference)
        if mine == theirs:
            return (
                f"{reference.name} reads the same partition as {bench.name} ({'/'.join(mine)}): a partition is not "
                f"held out from itself; use another split or draw of {bench.adapter}"
            )
        if cfg.mode == "distribution":
            return None
        if reference.adapter != bench.adapter:
            return (
                f"mode=heldout tests {bench.name} against a held-out partition of the same benchmark, but "
                f"{reference.name} is {reference.adapter}, not {bench.adapter}: a score difference between benchmarks "
                "says one is easier or more web-like, not that it leaked. Set the reference of "
                f"{bench.name} to a held-out {bench.adapter} partition known unseen (another split or draw, added "
                f"under benchmarks: with adapter: {bench.adapter}), or set mode: distribution in this method's block "
                "for a cross-benchmark distribution comparison (reported as such)"
            )
        if mine[1] != theirs[1] and not _generated(bench.adapter):
            return (
                f"mode=heldout needs an i.i.d. held-out of {bench.name}, but {reference.name} is config {theirs[1]!r} "
                f"of {bench.adapter} and {bench.name} config {mine[1]!r}: configs of a hub dataset are different "
                f"subsets or formats, not draws of one distribution. Use another split of config {mine[1]!r}, or set "
                "mode: distribution in this method's block"
            )
        return None

    def plan_warnings(self, cfg: HeldoutParams, bench: BenchmarkFacts) -> list[str]:
        """Too few rows (the base check), and no reference for a benchmark that is not itself a reference."""
        warnings = super().plan_warnings(cfg, bench)
        ref = cfg.reference
        is_reference = bench.name in ref.values() if isinstance(ref, dict) else bench.name == ref
        if (
            cfg.mode == "heldout"
            and bench.sample == "first"
            and bench.limit is not None
            and not _generated(bench.adapter)
            and (self.reference_benchmark(cfg, bench.name) or is_reference)
        ):
            warnings.append(
                f"{self.name} on {bench.name}: sample=first takes the first {bench.limit} rows, a contiguous block; a "
                "held-out comparison assumes the partition and its held-out are exchangeable draws, which a block "
                "is not when the split's order follows content (MMLU is sorted by subject, HellaSwag runs by "
                f"activity) - set benchmarks.{bench.name}.sample=random (and the same for its held-out)"
            )
        if not self.reference_benchmark(cfg, bench.name) and not is_reference:
            warnings.append(
                f"{self.name} on {bench.name}: no reference partition, the verdict will be inconclusive; to test it, "
                f"set reference: {{{bench.name}: <key of a held-out {bench.adapter} partition known unseen>}}"
            )
        return warnings

    # reduce --------------------------------------------------------------------
    def score_columns(self, cfg: Any) -> list[str]:
        """Columns tested in ``details`` beside the declared score (e.g. every k of Min-K%)."""
        return []

    def reduce(self, table: Any, cfg: HeldoutParams) -> Verdict:
        rows = rows_of(table)
        own = [r for r in rows if not truthy(r.get("is_reference"))]
        ref = [r for r in rows if truthy(r.get("is_reference"))]
        partitions = sorted({str(r.get("partition", "")) for r in own})
        if len(partitions) > 1:
            raise ValueError(
                f"{self.name}.reduce: the table mixes partitions {partitions} (reference rows aside); reduce one "
                "partition at a time"
            )
        partition = partitions[0] if partitions else ""
        ref_partitions = sorted({str(r.get("partition", "")) for r in ref})
        foreign = [p for p in ref_partitions if _adapter(p) != _adapter(partition)]
        same_benchmark = [r for r in ref if _adapter(str(r.get("partition", ""))) == _adapter(partition)]
        tested = ref if cfg.mode == "distribution" or not foreign else []
        non_members = same_benchmark if cfg.mode == "heldout" else []
        failed = [r for r in own if _failed(r)]
        details: dict[str, Any] = {
            "score": self.score_description(cfg),
            "alpha": cfg.alpha,
            "mode": cfg.mode,
            "null": NULLS[cfg.mode],
            "reference_partitions": ref_partitions,
        }
        if failed:
            details["errors"] = [f"{r.get('record_id')}: {r['error']}" for r in failed[:5]]
        columns = [self.outputs.score or "score"] + self.score_columns(cfg)
        results = {c: _test_column(own, tested, non_members, c, cfg) for c in columns}
        main = results[columns[0]]
        details.update(main)
        if len(columns) > 1:
            details["by_column"] = {c: results[c] for c in columns[1:]}
        reason = self._inconclusive_reason(cfg, partition, ref, foreign, main)
        p_value = main.get("p_value")
        if reason:
            decision = "inconclusive"
        else:
            decision = "contaminated" if p_value is not None and p_value <= cfg.alpha else "clean"
        details["summary"] = self._summary(cfg, partition, ref_partitions, main, decision, reason)
        statistic = main.get("auc_vs_reference")
        return Verdict(
            method=self.name,
            partition=partition,
            statistic=float(statistic) if statistic is not None else math.nan,
            p_value=p_value,
            rate=None,
            n_examples=len(own),
            n_failed=len(failed),
            details=details,
            decision=decision,
            reason=reason,
        )

    def _inconclusive_reason(
        self, cfg: HeldoutParams, partition: str, ref: list[dict], foreign: list[str], main: dict[str, Any]
    ) -> str:
        """Why the rows cannot decide (naming what to set), or "" when the test can."""
        adapter = _adapter(partition) or "the benchmark"
        if not ref:
            if not cfg.reference:
                return (
                    f"no reference configured: {self.name} scores mean little alone. Set methods.<label>.reference "
                    f"to {{<this benchmark's key>: <key of a held-out {adapter} partition known unseen>}} (another "
                    "split or draw, under benchmarks:)"
                )
            return (
                "no reference rows: either this partition is itself a reference (the yardstick, never tested), or "
                f"methods.<label>.reference maps nothing to it; to test it, map its key to a held-out {adapter} "
                "partition known unseen"
            )
        if foreign and cfg.mode == "heldout":
            return (
                f"mode=heldout, but the reference rows are from {', '.join(foreign)}, another benchmark than "
                f"{partition}: set the reference to a held-out {adapter} partition, or mode: distribution"
            )
        n1, n2 = main["partition"]["n"], main["reference"]["n"]
        need = self.applies.min_rows
        if n1 < need or n2 < need:
            return (
                f"{n1} scored rows in the partition and {n2} in the reference; the test needs >= {need} a side to "
                "have any power: raise benchmarks.<key>.limit (or run.limit) for both, and fix failed rows"
            )
        units = main.get("units") or {}
        u1 = (units.get("partition") or {}).get("n_units", n1)
        u2 = (units.get("reference") or {}).get("n_units", n2)
        smallest = min_p_value(u1, u2)
        if smallest > cfg.alpha:
            what = "rows" if (u1, u2) == (n1, n2) else f"sampling units ({units['partition']['how']})"
            return (
                f"with {u1} and {u2} {what} the smallest one-sided Mann-Whitney p is 1 / C({u1 + u2}, {u1}) = "
                f"{smallest:.3g} > alpha {cfg.alpha}: no ranking could reach it; add rows (or draw both sides with "
                "sample: random, whose rows are independent units) or raise alpha"
            )
        return ""

    def _summary(
        self,
        cfg: HeldoutParams,
        partition: str,
        refs: list[str],
        main: dict[str, Any],
        decision: str,
        reason: str,
    ) -> str:
        n1 = main["partition"]["n"]
        if not refs:
            return f"{self.name}: {n1} scored rows of {partition}, no reference rows -> inconclusive"
        where = ", ".join(refs)
        if main["reference"] is None:
            return f"{self.name}: {partition} vs rows of another benchmark ({where}) in mode=heldout: not tested"
        n2 = main["reference"]["n"]
        if cfg.mode == "heldout":
            line = f"{self.name}: {n1} rows of {partition} vs {n2} held-out rows of the same benchmark ({where})"
        else:
            line = f"{self.name}: {n1} rows of {partition} vs {n2} rows of {where} ({SHIFT_CAVEAT})"
        if main.get("p_value") is not None:
            units = main.get("units") or {}
            over = ""
            if units and units["partition"]["how"] != "rows":
                n_units = f"{units['partition']['n_units']} vs {units['reference']['n_units']}"
                over = f" over {n_units} {units['partition']['how']}"
            line += (
                f"; AUC {main['auc_vs_reference']:.3f}, one-sided Mann-Whitney p = {main['p_value']:.3g}{over} "
                f"(alpha {cfg.alpha})"
            )
        return f"{line} -> {decision}" + (" (see reason)" if reason else "")

    def score_description(self, cfg: Any) -> str:
        return self.__doc__.strip().splitlines()[0] if self.__doc__ else self.name


class MembershipMethod(HeldoutMethod):
    """Shared requests / score; subclasses say which texts to score and what number to keep (``score``)."""

    vocab_stats: ClassVar[bool] = False

    # subclasses ---------------------------------------------------------------
    def variants(self, text: str, cfg: MembershipConfig) -> list[Variant]:
        return [Variant("text", "target", text, self.vocab_stats)]

    def compute(self, text: str, scored: dict[str, Scored], cfg: Any) -> dict[str, Any]:
        """Method columns from the scored variants; must include ``score`` (higher = member)."""
        raise NotImplementedError

    # requests -------------------------------------------------------------------
    def requests(
        self, records: list[Record], cfg: MembershipConfig, stage: int, outputs: dict[str, Output]
    ) -> list[Request]:
        if stage > 0:
            return []
        out: list[Request] = []
        for record in records:
            if is_empty(record, cfg.fields):
                continue  # score() reports it
            text = serialise(record, cfg.fields, cfg.format)
            out += [
                score_request(
                    v.base(record.id),
                    (record.id,),
                    v.text,
                    cfg.context_len,
                    cfg.stride,
                    vocab_stats=v.vocab_stats,
                    engine=v.engine,
                )  # fmt: skip
                for v in self.variants(text, cfg)
            ]
        return out

    # score ---------------------------------------------------------------------
    def score(
        self, records: list[Record], outputs: Mapping[str, Output] | Iterable[Output], cfg: Any, **_: Any
    ) -> list[dict[str, Any]]:
        """One row per record: ``score`` (higher = more likely seen) and the method's columns."""
        got = output_map(outputs)
        rows = []
        for record in records:
            row: dict[str, Any] = {
                **self.row_keys(record),
                "score": None,
                "n_tokens": None,
                "n_windows": None,
                "note": "",
                "error": "",
            }
            if is_empty(record, cfg.fields):
                row["error"] = empty_message(record, cfg.fields)
                rows.append(row)
                continue
            text = serialise(record, cfg.fields, cfg.format)
            scored: dict[str, Scored] = {}
            errors = []
            for v in self.variants(text, cfg):
                base = v.base(record.id)
                try:
                    s = read_scored(got, base, vocab_stats=v.vocab_stats)
                except (KeyError, RuntimeError) as err:
                    errors.append(str(err).strip("'\""))
                    continue
                if not s.token_logprobs:
                    errors.append(
                        f"{v.name} text on the {v.engine} engine has fewer than 2 tokens: no token has a prefix "
                        "to be scored from"
                    )
                    continue
                scored[f"{v.name}@{v.engine}"] = s
            if errors:
                row["error"] = f"record {record.id!r}: " + "; ".join(errors)
                rows.append(row)
                continue
            main = scored.get("text@target") or next(iter(scored.values()))
            row["n_tokens"] = len(main.token_logprobs)
            row["n_windows"] = max(s.n_windows for s in scored.values())
            if row["n_windows"] > 1:
                row["note"] = (
                    f"longer than context_len={cfg.context_len} tokens: scored in {row['n_windows']} rolling windows "
                    f"(stride {cfg.stride})"
                )
            try:
                row.update(self.compute(text, scored, cfg))
            except (ValueError, ZeroDivisionError) as err:
                row["error"] = f"record {record.id!r}: {err}"
            rows.append(row)
        return rows


def min_p_value(n1: int, n2: int) -> float:
    """The smallest one-sided Mann-Whitney p-value n1 and n2 rows can give: every partition row above
    every reference row, one of C(n1 + n2, n1) equally likely rankings under the null."""
    return 1.0 / math.comb(n1 + n2, n1) if n1 > 0 and n2 > 0 else 1.0


def _adapter(partition: str) -> str:
    """The adapter of a partition string ``adapter/config/split``."""
    return partition.split("/", 1)[0]


def _generated(adapter: str) -> bool:
    """A generated benchmark (every config and split an independent draw of one generator)."""
    from contamray.benchmarks import get_adapter

    try:
        return get_adapter(adapter).generate is not None
    except (KeyError, ValueError):
        return False


def _independent_rows(partition: str) -> bool:
    """Whether the partition's benchmark declares its rows independent draws (``Adapter.independent_rows``)."""
    from contamray.benchmarks import get_adapter

    try:
        return bool(get_adapter(_adapter(partition)).independent_rows)
    except (KeyError, ValueError):
        return False


def _resolved(bench: BenchmarkFacts) -> tuple[str, str, str]:
    """(adapter, config, split) with the adapter's defaults filled in."""
    from contamray.benchmarks import get_adapter

    try:
        a = get_adapter(bench.adapter)
        return (bench.adapter, a.resolve_config(bench.config), a.resolve_split(bench.split))
    except (KeyError, ValueError):
        return (bench.adapter, str(bench.config or ""), str(bench.split or ""))


def _scored(rows: list[dict], column: str) -> list[tuple[dict, float]]:
    """(row, value) for rows that did not fail and have a finite ``column``."""
    pairs = [(r, finite(r.get(column))) for r in rows if not _failed(r)]
    return [(r, v) for r, v in pairs if v is not None]


def _in_order(pairs: list[tuple[dict, float]]) -> list[tuple[dict, float]]:
    """Scored rows in split order (partition, then ``order``); rows without an order keep theirs."""
    return sorted(pairs, key=lambda p: (str(p[0].get("partition", "")), _order(p[0])))


def _order(row: Mapping[str, Any]) -> int:
    value = finite(row.get("order"))
    return int(value) if value is not None else -1


def _test_column(
    own: list[dict], ref: list[dict], non_members: list[dict], column: str, cfg: HeldoutParams
) -> dict[str, Any]:
    """Mann-Whitney of ``own`` against ``ref`` on ``column`` over sampling units (``stats.clusters``: each
    unit's mean), and the instance-level AUC of own labelled rows against ``non_members`` (reference rows
    of the same benchmark; non-members unless labelled)."""
    mine, theirs = _in_order(_scored(own, column)), _in_order(_scored(ref, column))
    result: dict[str, Any] = {
        "partition": describe([v for _, v in mine]),
        "reference": describe([v for _, v in theirs]) if ref else None,
        "p_value": None,
        "auc_vs_reference": None,
    }
    if mine and theirs:
        sides = [([_order(r) for r, _ in s], [str(r.get("unit_key") or "") for r, _ in s],
                  all(truthy(r.get("independent_rows")) for r, _ in s)) for s in (mine, theirs)]  # fmt: skip
        units = paired_units(sides, cfg.units, cfg.block_rows)
        a = unit_means([v for _, v in mine], units[0])
        b = unit_means([v for _, v in theirs], units[1])
        test = mann_whitney_greater(a, b)
        result.update(p_value=test.p_value, auc_vs_reference=test.detail["auc"], mann_whitney_u=test.statistic,
                      units={"partition": units[0].to_dict(), "reference": units[1].to_dict()})  # fmt: skip
        if len(a) != len(mine) or len(b) != len(theirs):
            rows_test = mann_whitney_greater([v for _, v in mine], [v for _, v in theirs])
            result["rows_auc_vs_reference"] = rows_test.detail["auc"]
            result["rows_p_value_if_independent"] = rows_test.p_value
    result.update(_member_auc(mine, _scored(non_members, column)))
    return result


def _member_auc(mine: list[tuple[dict, float]], others: list[tuple[dict, float]]) -> dict[str, Any]:
    """ROC AUC and TPR at 5 % FPR of members vs non-members, when the partition has labels and both classes."""
    if not any(not missing(r.get("member")) for r, _ in mine):
        return {}
    labelled = [(v, truthy(r.get("member"))) for r, v in mine if not missing(r.get("member"))]
    labelled += [(v, truthy(r.get("member")) if not missing(r.get("member")) else False) for r, v in others]
    labels = [m for _, m in labelled]
    if set(labels) != {True, False}:
        return {}
    scores = [v for v, _ in labelled]
    return {
        "auc_member": roc_auc(scores, labels),
        "tpr_at_5pct_fpr": tpr_at_fpr(scores, labels, 0.05),
        "n_members": sum(labels),
        "n_non_members": len(labels) - sum(labels),
    }


# ----------------------------------------------------------------------------- the six methods


def _mean_logprob(s: Scored) -> float:
    return float(np.mean(s.token_logprobs))


@register
class MinK(MembershipMethod):
    """Min-K% Prob: mean of the k % lowest token log-probabilities (Shi et al. 2024)."""

    name = "min_k"
    Config = MinKConfig
    outputs = Outputs(
        score="score",
        score_label="Min-K% Prob: mean of the k % lowest token log-probabilities (higher = member)",
        membership="score",
    )

    def compute(self, text: str, scored: dict[str, Scored], cfg: MinKConfig) -> dict[str, Any]:
        lp = scored["text@target"].token_logprobs
        row = {f"min_k_{round(k * 100)}": min_k_mean(lp, k) for k in cfg.ks}
        row["score"] = row[f"min_k_{round(cfg.k * 100)}"]
        row["mean_logprob"] = float(np.mean(lp))
        return row

    def score_columns(self, cfg: MinKConfig) -> list[str]:
        return [f"min_k_{round(k * 100)}" for k in cfg.ks if k != cfg.k]


@register
class MinKPlusPlus(MembershipMethod):
    """Min-K%++: mean of the k % lowest (log p - mu) / sigma over the vocabulary (Zhang et al. 2024)."""

    name = "min_k_plus_plus"
    Config = MinKPlusPlusConfig
    outputs = Outputs(
        score="score",
        score_label="Min-K%++: mean of the k % lowest standardised token log-probabilities (higher = member)",
        membership="score",
    )
    vocab_stats = True

    def compute(self, text: str, scored: dict[str, Scored], cfg: MinKPlusPlusConfig) -> dict[str, Any]:
        s = scored["text@target"]
        z = min_k_plus_plus_tokens(s.token_logprobs, s.token_mean, s.token_std)
        row: dict[str, Any] = {f"min_k_pp_{round(k * 100)}": min_k_mean(z, k) for k in cfg.ks}
        row["score"] = row[f"min_k_pp_{round(cfg.k * 100)}"]
        row["min_k_20"] = min_k_mean(s.token_logprobs, 0.2)
        row["mean_logprob"] = float(np.mean(s.token_logprobs))
        return row

    def score_columns(self, cfg: MinKPlusPlusConfig) -> list[str]:
        return [f"min_k_pp_{round(k * 100)}" for k in cfg.ks if k != cfg.k]


@register
class Perplexity(MembershipMethod):
    """Perplexity (loss attack): mean token log-probability, i.e. minus log-perplexity."""

    name = "perplexity"
    Config = PerplexityConfig
    outputs = Outputs(
        score="score",
        score_label="mean token log-probability, minus log-perplexity (higher = member)",
        membership="score",
    )

    def compute(self, text: str, scored: dict[str, Scored], cfg: PerplexityConfig) -> dict[str, Any]:
        mean = _mean_logprob(scored["text@target"])
        return {"score": mean, "mean_logprob": mean, "perplexity": math.exp(-mean)}


@register
class ZlibRatio(MembershipMethod):
    """zlib ratio: mean token log-probability / zlib-compressed bytes (Carlini et al. 2021)."""

    name = "zlib_ratio"
    Config = ZlibConfig
    outputs = Outputs(
        score="score",
        score_label="mean token log-probability / zlib-compressed bytes (higher = member)",
        membership="score",
    )

    def compute(self, text: str, scored: dict[str, Scored], cfg: ZlibConfig) -> dict[str, Any]:
        mean = _mean_logprob(scored["text@target"])
        size = zlib_bytes(text)
        return {"score": mean / size, "mean_logprob": mean, "zlib_bytes": size}


@register
class LowercaseRatio(MembershipMethod):
    """Lowercase ratio: log-perplexity of the lowercased text / that of the text (Carlini et al. 2021)."""

    name = "lowercase_ratio"
    Config = LowercaseConfig
    outputs = Outputs(
        score="score",
        score_label="log-perplexity of the lowercased text / that of the text (higher = member)",
        membership="score",
    )

    def variants(self, text: str, cfg: MembershipConfig) -> list[Variant]:
        return [Variant("text", "target", text), Variant("lower", "target", text.lower())]

    def compute(self, text: str, scored: dict[str, Scored], cfg: LowercaseConfig) -> dict[str, Any]:
        mean = _mean_logprob(scored["text@target"])
        lower = _mean_logprob(scored["lower@target"])
        if mean == 0.0:
            raise ValueError("the text has log-perplexity 0 (every token certain); the lowercase ratio is undefined")
        return {"score": lower / mean, "mean_logprob": mean, "mean_logprob_lower": lower}


@register
class ReferenceRatio(MembershipMethod):
    """Reference-model ratio: log-perplexity of a reference model minus that of the target (Carlini et al. 2021)."""

    name = "reference_ratio"
    Config = ReferenceRatioConfig
    outputs = Outputs(
        score="score",
        score_label="mean token log-probability, target minus reference model (higher = member)",
        membership="score",
    )
    engine_roles = ("target", "reference")

    def variants(self, text: str, cfg: MembershipConfig) -> list[Variant]:
        return [Variant("text", "target", text), Variant("text", "reference", text)]

    def compute(self, text: str, scored: dict[str, Scored], cfg: ReferenceRatioConfig) -> dict[str, Any]:
        target = _mean_logprob(scored["text@target"])
        reference = _mean_logprob(scored["text@reference"])
        return {"score": target - reference, "mean_logprob": target, "mean_logprob_reference": reference}
