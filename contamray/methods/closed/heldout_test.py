"""The partition-level test every per-example score method shares: a held-out reference partition.

Used by the membership scores (``membership_scores``), TS-Guessing (``ts_guessing``), CDD (``cdd``), DCQ
(``dcq``) and name cloze (``name_cloze``):
each writes one ``score`` per example (higher = more likely seen) plus the sampling-unit columns of
``unit_columns``, declares a ``HeldoutConfig`` and inherits ``HeldoutTest``'s plan checks and ``reduce``.

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
  the permutation p-value of the rank sum; scipy's normal approximation beyond 8 rows a side for distinct
  scores; for coarse scores - 0/1 hits of TS-Guessing and name cloze, DCQ's few levels - the permutation
  distribution given the pooled values, exact for 0/1 (Fisher's test), which the normal approximation undercuts:
  6-7 % false positives at 0.05 on unequal sides, ``stats.tests.mann_whitney_greater``). Under H1
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

Units, not rows (``units``, ``block_rows``; ``contamray.stats.clusters``): the rank test needs each side to
be a sample of independent units. A contiguous block of a split is a cluster sample - twins, runs of one
activity, entity or subject sit together and share most of what a score measures - so counting its rows
as independent over-rejects (runs of 3-6 rows at intra-run correlation 0.3, as measured on
``synthetic_structured``: 13 % of clean 20-row slices flagged at alpha = 0.05, ``tests/test_clusters.py``).
With ``units: auto`` declared groups and topics are units, and a side that is a contiguous block of its
split (read from all its rows - rows filtered or failed leave gaps that must not make a block look like a random
sample; unless its dataset declares its rows independent draws) is cut into blocks of ``floor(sqrt(n))``
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
yardstick is never tested), when the reference rows come from another benchmark in ``heldout`` mode, when
more than half of the reference rows failed (``settle`` counts the partition's failures; the reference's are
counted here - the rows left need not represent it),
when either side has fewer than ``applies.min_rows`` scored rows, or when even the most extreme ranking
could not reach ``alpha`` (the smallest one-sided p with n1, n2 units is ``1 / C(n1 + n2, n1)``), or when
the scores are so tied that no assignment of them to the two sides could (``details["min_p_value"]``,
``stats.tests.mann_whitney_min_p``, conditioning on the pooled scores as the permutation test does: with
exact-match scores, 20 rows a side and 4 hits in all, even all 4 on the partition's side give p = 0.053; with
none, p = 1) - "clean" there would only say that the test could not have flagged anything.
``min_rows`` = 10 a side: by Noether's formula (Noether, JASA 1987), 80 % power at alpha = 0.05 for an AUC of 0.8 needs
about 12 rows a side (0.75: 17), so fewer rows can only find blatant contamination. Otherwise
``contaminated`` when p <= ``alpha``, else ``clean``. Every column of ``score_columns`` (e.g. each k
of Min-K%) is tested in ``details["by_column"]``; only ``score`` decides.

Instance level: when records carry membership labels (``member`` column, e.g. an injected fraction of a
partition) the ROC AUC and TPR at 5 % FPR (``auc_member``, ``tpr_at_5pct_fpr``) rank members against
non-members *of the same benchmark*: the partition's labelled rows, plus - in ``heldout`` mode only - the
reference rows of the same adapter, as non-members unless labelled. Rows of another benchmark are never
counted (that AUC would measure benchmark shift again).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from contamray.methods.base import Applies, BenchmarkFacts, Method, Output, Verdict, decision_at
from contamray.methods.closed.cell_rows import column_mean, finite, missing, output_map, row_failed, rows_of, truthy
from contamray.records import Record, benchmark_of
from contamray.stats.clusters import UNIT_MODES, is_contiguous, paired_units, unit_key, unit_means
from contamray.stats.tests import describe, mann_whitney_greater, mann_whitney_min_p, roc_auc, tpr_at_fpr

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
class HeldoutConfig:
    """The partition-level test against a held-out reference partition (see the module docstring)."""

    # benchmark key of a partition known to be unseen, or a mapping benchmark key -> such a key
    reference: str | dict[str, str] | None = ""
    mode: str = "heldout"  # heldout: the reference is a held-out of the same benchmark; distribution: any
    alpha: float = 0.05
    units: str = "auto"  # auto: declared groups, blocks of block_rows when contiguous; declared; rows
    block_rows: int = 5
    method_name: ClassVar[str] = "membership"

    def __post_init__(self) -> None:
        where = f"methods.{self.method_name}"
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"{where}.alpha must be in (0, 1), got {self.alpha}")
        if self.mode not in MODES:
            raise ValueError(
                f"{where}.mode: {self.mode!r} is not one of {', '.join(MODES)} (heldout: test against a held-out "
                "partition of the same benchmark; distribution: against any benchmark, a distribution comparison)"
            )
        self.reference = _reference(self.reference, f"{where}.reference")
        if self.units not in UNIT_MODES:
            raise ValueError(
                f"{where}.units: {self.units!r} is not one of {', '.join(UNIT_MODES)} (auto: declared groups and "
                "topics, and blocks of block_rows consecutive rows when a side is a contiguous block of its split; "
                "declared: declared groups and topics only; rows: every row is an independent draw)"
            )
        if self.block_rows < 1:
            raise ValueError(f"{where}.block_rows must be >= 1, got {self.block_rows}")


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


class HeldoutTest(Method):
    """The partition decision against a held-out reference partition (module docstring: ``reduce``).

    Shared by every method whose per-example ``score`` column is ranked against the rows of a reference
    partition known unseen (membership scores, TS-Guessing): ``check_reference``, ``plan_warnings`` and
    ``reduce`` read ``reference``, ``mode``, ``alpha``, ``units`` and ``block_rows`` of the Config
    (``HeldoutConfig``) and the rows' ``score``, ``order``, ``unit_key``, ``independent_rows`` and ``error``.
    """

    family = "closed"
    applies: ClassVar[Applies] = Applies(min_rows=MIN_ROWS)
    tie_hint: ClassVar[str] = "one score for every unit"  # what all-tied scores mean, for the inconclusive reason
    # a 0/1 per-example column whose mean is the verdict's ``rate`` (exact matches, right answers), and its name
    # opening the summary ("": not named there); None: the verdict has no rate
    rate_column: ClassVar[str | None] = None
    rate_label: ClassVar[str] = ""

    # plan checks ---------------------------------------------------------------
    def check_reference(self, cfg: HeldoutConfig, bench: BenchmarkFacts, reference: BenchmarkFacts) -> str | None:
        """Refuse a reference that cannot serve: the same rows (any mode); in ``heldout`` mode, another
        benchmark, or another config of a hub dataset (a different subset or format, not a draw)."""
        mine, theirs = _resolved(bench), _resolved(reference)
        if mine == theirs and _may_overlap(bench, reference):
            return (
                f"{reference.name} reads the same partition as {bench.name} ({'/'.join(mine)}) and may read the same "
                f"rows: a partition is not held out from itself; use another split or draw of {bench.adapter}, or "
                f"rows after the tested ones (benchmarks.{reference.name}.offset with sample: first on both)"
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

    def plan_warnings(self, cfg: HeldoutConfig, bench: BenchmarkFacts) -> list[str]:
        """Too few rows (the base check), and no reference for a benchmark that is not itself a reference."""
        warnings = super().plan_warnings(cfg, bench)
        ref = cfg.reference
        is_reference = bench.name in ref.values() if isinstance(ref, dict) else bench.name == ref
        if (
            cfg.mode == "heldout"
            and bench.sample == "first"
            and bench.limit is not None
            and not _generated(bench.adapter)
            and self.reference_benchmark(cfg, bench.name)  # said of the tested side, naming its held-out too
        ):
            warnings.append(
                f"{self.name} on {bench.name}: sample=first takes {_block(bench)}, a contiguous block; a "
                "held-out comparison assumes the partition and its held-out are exchangeable draws, which a block "
                "is not when the split's order follows content (MMLU is sorted by subject, HellaSwag runs by "
                f"activity) - there, set benchmarks.{bench.name}.sample=random with a held-out drawn at random from "
                "another split of its config (two random draws of one split may share rows, which the plan refuses); "
                "the test cuts contiguous sides into blocks of rows, its sampling units, either way"
            )
        if not self.reference_benchmark(cfg, bench.name) and not is_reference:
            warnings.append(
                f"{self.name} on {bench.name}: no reference partition, the verdict will be inconclusive; to test it, "
                f"set benchmarks.{bench.name}.heldout: <key of a held-out {bench.adapter} partition known unseen> "
                "(every held-out test of the run uses it; or this method's reference alone)"
            )
        return warnings

    # score ---------------------------------------------------------------------
    def score(
        self, records: list[Record], outputs: Mapping[str, Output] | Iterable[Output], cfg: Any, **_: Any
    ) -> list[dict[str, Any]]:
        """One row per record: ``_score_one`` of each (a method whose rows need more overrides this)."""
        got = output_map(outputs)
        return [self._score_one(record, got, cfg) for record in records]

    def _score_one(self, record: Record, got: dict[str, Output], cfg: Any) -> dict[str, Any]:
        raise NotImplementedError

    # reduce --------------------------------------------------------------------
    def score_columns(self, cfg: Any) -> list[str]:
        """Columns tested in ``details`` beside ``score`` (e.g. every k of Min-K%)."""
        return []

    def reduce(self, table: Any, cfg: HeldoutConfig) -> Verdict:
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
        foreign = [p for p in ref_partitions if benchmark_of(p) != benchmark_of(partition)]
        same_benchmark = [r for r in ref if benchmark_of(str(r.get("partition", ""))) == benchmark_of(partition)]
        tested = ref if cfg.mode == "distribution" or not foreign else []
        non_members = same_benchmark if cfg.mode == "heldout" else []
        failed = [r for r in own if row_failed(r)]
        details: dict[str, Any] = {
            "score": self.score_description(cfg),
            "alpha": cfg.alpha,
            "mode": cfg.mode,
            "null": NULLS[cfg.mode],
            "reference_partitions": ref_partitions,
        }
        if failed:
            details["errors"] = [f"{r.get('record_id')}: {r['error']}" for r in failed[:5]]
        score = self.outputs.score or "score"  # the declared per-example score column decides
        columns = [score] + self.score_columns(cfg)
        results = {c: _test_column(own, tested, non_members, c, cfg) for c in columns}
        unit_scores = {c: results[c].pop(UNIT_SCORES, None) for c in columns}  # for a joint test, not the details
        main = results[score]
        details.update(main)
        if len(columns) > 1:
            details["by_column"] = {c: results[c] for c in columns[1:]}

        def reason_of(column: str, at: Any) -> str:
            return self._inconclusive_reason(at, partition, ref, foreign, results[column])

        combined = self.combine(cfg, own + ref, results, reason_of, unit_scores)
        if combined is None:  # the declared score column decides
            reason, p_value, statistic = reason_of(score, cfg), main.get("p_value"), main.get("auc_vs_reference")
            floor = main.get("min_p_value") if p_value is not None else None
            decision = decision_at(p_value, cfg.alpha, reason)
            details["summary"] = self._summary(cfg, partition, ref_partitions, main, decision, reason)
        else:  # the method tests several columns at once (e.g. CDD's two prompt forms)
            p_value, statistic, reason, summary, floor = combined
            decision = decision_at(p_value, cfg.alpha, reason)
            if cfg.mode != "heldout":  # labelled as what it is, as the single column's summary is
                summary = f"{summary} ({SHIFT_CAVEAT})"
            details.update(p_value=p_value, summary=f"{summary} -> {decision}" + (" (see reason)" if reason else ""))
        verdict = Verdict(
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
            min_p=floor,
        )
        if self.rate_column:
            _with_rates(verdict, own, ref, self.rate_column, self.rate_label)
        return verdict

    def combine(
        self,
        cfg: Any,
        rows: list[dict],
        results: dict[str, dict[str, Any]],
        reason_of: Callable[[str, Any], str],
        unit_scores: dict[str, UnitScores | None],
    ) -> tuple[float | None, float | None, str, str, float | None] | None:
        """A decision over several tested columns at once: (p-value, statistic, inconclusive reason, summary, the
        smallest p the combined test could give - ``Verdict.min_p``, None when unknown), or None to decide by the
        declared score column alone (the default). ``rows``: the partition's and the
        reference's; ``results``: each tested column's test; ``reason_of(column, cfg)``: why that column's test
        cannot decide under ``cfg`` ("" when it can); ``unit_scores``: each column's unit scores (``UnitScores``,
        None when a side had none), for a test of several columns over the same units."""
        return None

    def _inconclusive_reason(
        self, cfg: HeldoutConfig, partition: str, ref: list[dict], foreign: list[str], main: dict[str, Any]
    ) -> str:
        """Why the rows cannot decide (naming what to set), or "" when the test can."""
        adapter = benchmark_of(partition) or "the benchmark"
        if not ref:
            if not cfg.reference:
                return (
                    f"no reference configured: {self.name} scores mean little alone. Set benchmarks.<this benchmark's "
                    f"key>.heldout to the key of a held-out {adapter} partition known unseen (another split, draw or "
                    "block of rows, under benchmarks:), or this method's reference to {<this key>: <that key>}"
                )
            return (
                "no reference rows: either this partition is itself a reference (the yardstick, never tested), or "
                f"methods.<label>.reference maps nothing to it; to test it, name a held-out {adapter} partition known "
                "unseen in benchmarks.<its key>.heldout (or map its key to one in the reference)"
            )
        if foreign and cfg.mode == "heldout":
            return (
                f"mode=heldout, but the reference rows are from {', '.join(foreign)}, another benchmark than "
                f"{partition}: set the reference to a held-out {adapter} partition, or mode: distribution"
            )
        ref_failed = sum(1 for r in ref if row_failed(r))
        if ref_failed / len(ref) > self.max_failed_share:  # ``settle`` counts the partition's failures alone
            return (
                f"{ref_failed} of {len(ref)} reference rows failed ({ref_failed / len(ref):.0%} > "
                f"{self.max_failed_share:.0%}): the held-out rows left need not represent the reference, so the "
                "comparison is not credible; fix the failures (see the reference cell's error column)"
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
        what = "rows" if (u1, u2) == (n1, n2) else f"sampling units ({units['partition']['how']})"
        smallest = min_p_value(u1, u2)
        if smallest > cfg.alpha:
            return (
                f"with {u1} and {u2} {what} the smallest one-sided Mann-Whitney p is 1 / C({u1 + u2}, {u1}) = "
                f"{smallest:.3g} > alpha {cfg.alpha}: no ranking could reach it; add rows (or draw both sides with "
                "sample: random, whose rows are independent units) or raise alpha"
            )
        tied = main.get("min_p_value", smallest)
        if tied > cfg.alpha:
            distinct = main.get("distinct_values")
            return (
                f"the {u1} and {u2} {what} take {distinct} distinct score value(s) between them (ties, e.g. "
                f"{self.tie_hint} on either side): the smallest one-sided p any assignment of these scores to the two "
                f"sides could give is {tied:.3g} > alpha {cfg.alpha}, so no outcome could be significant; add rows, "
                "or raise alpha"
            )
        return ""

    def _summary(
        self,
        cfg: HeldoutConfig,
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


def min_p_value(n1: int, n2: int) -> float:
    """The smallest one-sided Mann-Whitney p-value n1 and n2 rows can give: every partition row above
    every reference row, one of C(n1 + n2, n1) equally likely rankings under the null."""
    return 1.0 / math.comb(n1 + n2, n1) if n1 > 0 and n2 > 0 else 1.0


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
        return bool(get_adapter(benchmark_of(partition)).independent_rows)
    except (KeyError, ValueError):
        return False


def _block(bench: BenchmarkFacts) -> str:
    if bench.offset:
        return f"rows {bench.offset}-{bench.offset + (bench.limit or 0) - 1}"
    return f"the first {bench.limit} rows"


def _may_overlap(a: BenchmarkFacts, b: BenchmarkFacts) -> bool:
    """Whether two benchmarks of one partition can share a row (unknown for a random draw: yes)."""
    ra, rb = a.rows, b.rows
    if ra is None or rb is None:
        return True
    ends = [stop for _, stop in (ra, rb) if stop is not None]  # an open block runs to the split's end
    return not ends or max(ra[0], rb[0]) < min(ends)


def _resolved(bench: BenchmarkFacts) -> tuple[str, str, str]:
    """(adapter, config, split) with the adapter's defaults filled in."""
    from contamray.benchmarks import get_adapter

    try:
        a = get_adapter(bench.adapter)
        return (bench.adapter, a.resolve_config(bench.config), a.resolve_split(bench.split))
    except (KeyError, ValueError):
        return (bench.adapter, str(bench.config or ""), str(bench.split or ""))


def partition_of(bench: BenchmarkFacts) -> str:
    """The partition id ``<adapter>/<config>/<split>`` a benchmark reads, the adapter's defaults filled in."""
    return "/".join(_resolved(bench))


def split_sides(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the partition's rows, the reference's rows)."""
    return [r for r in rows if not truthy(r.get("is_reference"))], [r for r in rows if truthy(r.get("is_reference"))]


def _with_rates(verdict: Verdict, own: list[dict], ref: list[dict], column: str, label: str) -> None:
    """Set ``verdict.rate`` to the partition's mean ``column``, put it beside the reference's in ``details``
    (``rate``, ``n_scored``, ``reference_rate``, ``n_reference_scored``) and, with a ``label``, open the summary
    with both."""
    (rate, n), (ref_rate, n_ref) = column_mean(own, column), column_mean(ref, column)
    verdict.rate = rate
    verdict.details.update(rate=rate, n_scored=n, reference_rate=ref_rate, n_reference_scored=n_ref)
    if label:
        shown = "n/a" if rate is None else f"{rate:.0%}"
        versus = f" vs {ref_rate:.0%} of {n_ref} held-out" if ref_rate is not None else ""
        verdict.details["summary"] = f"{label} {shown} of {n}{versus}; " + verdict.details.get("summary", "")


def unit_columns(record: Record) -> dict[str, Any]:
    """The columns of an example row that ``HeldoutTest.reduce`` reads to form sampling units: id,
    partition, split order, declared group or topic, whether the benchmark's rows are independent draws."""
    return {
        "record_id": record.id,
        "partition": record.partition,
        "order": record.order,
        "unit_key": unit_key(record.meta),
        "independent_rows": _independent_rows(record.partition),
    }


def _scored(rows: list[dict], column: str) -> list[tuple[dict, float]]:
    """(row, value) for rows that did not fail and have a finite ``column``."""
    pairs = [(r, finite(r.get(column))) for r in rows if not row_failed(r)]
    return [(r, v) for r, v in pairs if v is not None]


def _split_key(row: Mapping[str, Any]) -> tuple[str, int]:
    """A row's place in split order: partition, then ``order`` (-1 without one)."""
    return str(row.get("partition", "")), _order(row)


def _in_order(pairs: list[tuple[dict, float]]) -> list[tuple[dict, float]]:
    """Scored rows in split order (partition, then ``order``); rows without an order keep theirs."""
    return sorted(pairs, key=lambda p: _split_key(p[0]))


def _order(row: Mapping[str, Any]) -> int:
    value = finite(row.get("order"))
    return int(value) if value is not None else -1


UNIT_SCORES = "_unit_scores"  # a column test's unit scores, taken out of its result before the verdict's details


@dataclass(frozen=True)
class UnitScores:
    """One column's unit scores on each side (``x``: the partition's, ``y``: the reference's) and which rows each
    unit holds (``units``: record ids per unit, per side): columns with equal ``units`` were tested on the same
    units and can be tested jointly (``stats.tests.joint_mann_whitney_greater``)."""

    x: list[float]
    y: list[float]
    units: tuple[tuple[tuple[str, ...], ...], ...]


def _test_column(
    own: list[dict], ref: list[dict], non_members: list[dict], column: str, cfg: HeldoutConfig
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
        # whether a side is a contiguous block of its split is its design: read from all its rows, not only those
        # scored - filtered or failed rows leave gaps that would make a block look like a random sample
        design = [is_contiguous([o for _, o in sorted(map(_split_key, side)) if o >= 0]) for side in (own, ref)]
        units = paired_units(sides, cfg.units, cfg.block_rows, contiguous=design)
        a = unit_means([v for _, v in mine], units[0])
        b = unit_means([v for _, v in theirs], units[1])
        ids = tuple(tuple(tuple(str(side[i][0].get("record_id")) for i in unit) for unit in u.units)
                    for side, u in zip((mine, theirs), units, strict=True))  # fmt: skip
        result[UNIT_SCORES] = UnitScores(a, b, ids)
        test = mann_whitney_greater(a, b, ties="permutation")  # coarse scores (0/1) tie: the exact null
        result.update(p_value=test.p_value, auc_vs_reference=test.detail["auc"], mann_whitney_u=test.statistic,
                      units={"partition": units[0].to_dict(), "reference": units[1].to_dict()},
                      min_p_value=mann_whitney_min_p(a, b), distinct_values=len(set(a) | set(b)))  # fmt: skip
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

