"""What a detection method is, as code, and the registry that finds methods by name.

A method is one module holding one class with a ``Config`` dataclass and pure steps, so the Ray
pipeline (``contamray.pipeline``) stays generic and a method can be tested without Ray or a model.

Closed-data methods (the model is probed; ``family = "closed"``):

- ``requests(records, cfg, stage, outputs) -> list[Request]``: prompts to generate or texts to score.
  Methods with several rounds (guided prompting's judge, Algorithm 2) look at the ``outputs`` of
  earlier stages; an empty list ends the rounds.
- ``score(records, outputs, cfg) -> list[dict]``: one row of columns per example (CPU, no model).
- ``reduce(table, cfg) -> Verdict``: the partition-level statistic, p-value or rate, and decision.

Open-data methods (the corpus is scanned; ``family = "open"``):

- ``build_index(records, cfg)``: a picklable index of the benchmark side, ``ray.put`` once;
- ``match(docs, index, cfg) -> list[dict]``: match rows for a batch of corpus documents
  (``doc_id``, ``text``); each row names ``record_id`` and ``doc_id`` plus method columns;
- ``score(records, matches, cfg) -> list[dict]`` and ``reduce(table, cfg) -> Verdict`` as above.

The engine's wire types (``Sampling``, ``Request``, ``Output``) live in ``contamray.engines.wire``, so
engines never import methods; they are re-exported here for the methods that build requests and read
outputs (``from contamray.methods.base import Request`` keeps working).

Every per-example row carries ``record_id``, ``partition`` and ``error`` (empty when fine): a row
that fails is kept with its error, never dropped, and ``reduce`` counts it in ``n_failed``.

What ``reduce`` may see beyond its own rows (the runner provides it; all cells are scored before any
is reduced):

- ``reference_benchmark(cfg, benchmark)`` (default: ``cfg.reference`` if the Config has it, one key or
  a mapping benchmark -> key): the key of a benchmark under ``benchmarks:`` known to be unseen
  (``check_reference`` may refuse a reference that cannot serve, e.g. another dataset). The runner
  scores it with the same method and model and appends its rows to the table with
  ``is_reference=True`` (own rows ``False``);
- ``contamination_source(cfg)`` (default: ``cfg.contamination_from``): the label of an open-data
  method of the run; its per-example ``contaminated`` and ``contamination_type`` for the same
  benchmark are merged into the table on ``record_id`` (clean-vs-dirty evaluation);
- a record's ``meta["member"]`` (set by injection manifests) arrives as a ``member`` column when any
  record of the partition has it, for instance-level ROC AUC.

Open-data methods that need a model (e.g. an LLM judge over retrieved candidates) list ``"judge"``
in ``engine_roles_for(cfg)`` and implement ``judge_requests(records, matches, cfg)``; the runner sends
those to the judge engine and calls ``score(records, matches, cfg, outputs=...)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from contamray.engines.wire import Output, Request, Sampling  # noqa: F401 - re-exported for methods
from contamray.methods.param_types import check_param_types
from contamray.records import Record

ENGINE_ROLES = ("target", "judge", "reference")


DECISIONS = ("contaminated", "clean", "inconclusive")
# a cell the plan skipped (the method does not apply to the benchmark), and a cell whose reduce failed
NOT_APPLICABLE = "not_applicable"
ERROR = "error"


def every_row_failed(n_rows: int, example: str | None = None) -> str:
    """The inconclusive reason of a partition none of whose ``n_rows`` rows was scored (``example``: one error)."""
    where = f"e.g. {example}" if example else "see details.errors and the examples' error column"
    return f"every row failed ({n_rows} of {n_rows}; {where})"


def decision_at(p_value: float | None, alpha: float, reason: str = "") -> str:
    """A test's decision: inconclusive when it cannot decide (a ``reason``, or no p-value), else contaminated at
    ``p_value <= alpha`` and clean above."""
    if reason or p_value is None:
        return "inconclusive"
    return "contaminated" if p_value <= alpha else "clean"


@dataclass
class Verdict:
    """The partition-level answer of one method: was this partition in the training data?

    ``decision`` is three-valued: ``contaminated``, ``clean``, or ``inconclusive`` when the data
    cannot tell (too few rows or shards for the test's power, too many failed rows, a null the data
    makes not credible); ``reason`` then says why and what to change. ``contaminated`` is kept as
    the boolean ``decision == "contaminated"`` (an inconclusive verdict is not a "clean" one).
    Give either: a verdict built with only ``contaminated`` decides ``clean`` when it is False.
    ``rate`` is always a fraction in [0, 1] (share of examples found contaminated); ``p_value`` is
    None for methods that measure rather than test. ``min_p``: the smallest p-value the test could have
    given on these data, whatever the outcome (an exact permutation null has finitely many arrangements,
    ties remove some, a Monte Carlo null of B draws stops at 1 / (B + 1)); None where the method does not
    say (a continuous test's p can reach 0). The report reads it to say which cells no outcome could have
    flagged once the grid's multiple-testing correction is applied.
    """

    method: str
    partition: str
    statistic: float
    contaminated: bool = False
    p_value: float | None = None
    rate: float | None = None
    n_examples: int = 0
    n_failed: int = 0
    details: dict[str, Any] = field(default_factory=dict)
    decision: str = ""
    reason: str = ""
    min_p: float | None = None

    def __post_init__(self) -> None:
        if not self.decision:
            self.decision = "contaminated" if self.contaminated else "clean"
        if self.decision not in DECISIONS:
            raise ValueError(f"Verdict.decision: {self.decision!r} is not one of {', '.join(DECISIONS)}")
        if self.decision == "inconclusive" and not self.reason:
            raise ValueError("an inconclusive Verdict needs a reason (what the data lacked and what to change)")
        self.contaminated = self.decision == "contaminated"

    def make_inconclusive(self, reason: str) -> Verdict:
        """This verdict, undecided: the statistic and p-value stay as evidence, the decision does not."""
        self.decision, self.reason, self.contaminated = "inconclusive", reason, False
        return self

    def to_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Outputs:
    """What a method writes per example, declared so the report and the scoreboard never guess.

    ``score``: the per-example column the report plots (the evidence the partition decision rests
    on); ``membership``: the per-example column ranking examples by how likely they were seen
    (higher = member), used for instance-level ROC AUC; None where the method decides per partition
    only (shards, accuracy gaps). Both name columns of the method's ``score()`` rows.
    """

    score: str | None
    score_label: str = ""
    membership: str | None = None
    missing_as: float | None = None  # what an empty score cell means (e.g. 0.0: nothing matched); None: not scored


@dataclass(frozen=True)
class Applies:
    """Where a method applies; the plan skips other (method x benchmark) pairs with the reason.

    ``tasks``: the Record task types it can work on (empty = all); ``needs_choices``: it reads the
    options of multiple-choice items; ``min_rows``: rows its partition test needs to have any power
    (fewer gives ``inconclusive``; the plan warns when ``limit`` is below it).
    """

    tasks: tuple[str, ...] = ()
    needs_choices: bool = False
    min_rows: int = 1


@dataclass(frozen=True)
class BenchmarkFacts:
    """What the plan knows of a benchmark before loading it (for applicability and power checks)."""

    name: str  # key under `benchmarks:`
    adapter: str
    config: str | None
    split: str | None
    task: str
    has_choices: bool
    limit: int | None
    sample: str
    offset: int = 0  # leading rows of the split skipped

    @property
    def rows(self) -> tuple[int, int | None] | None:
        """The split's rows this benchmark reads when that is known before loading, as ``(start, stop)``: a
        contiguous block, or every row from ``offset`` (``stop`` None); None for a random draw, which may
        hold any row of the split."""
        if self.sample == "first" and self.limit is not None:
            return (self.offset, self.offset + self.limit)
        if self.limit is None:
            return (self.offset, None)
        return None

    @property
    def dataset(self) -> tuple[str, str | None]:
        """The data distribution the rows come from: adapter and config (splits of one config differ in
        nothing but the split, so a held-out split is i.i.d. only when the dataset says so)."""
        return (self.adapter, self.config)


class Method:
    """Base class: subclasses set ``name``, ``family``, ``Config`` and implement the steps."""

    name: ClassVar[str] = ""
    family: ClassVar[Literal["closed", "open"]] = "closed"
    Config: ClassVar[type] = object
    engine_roles: ClassVar[tuple[str, ...]] = ("target",)
    # "example": score() may see any chunk of a partition's records; "partition": it needs them all
    # at once (e.g. a test over shards of the whole partition).
    score_scope: ClassVar[Literal["example", "partition"]] = "example"
    outputs: ClassVar[Outputs] = Outputs(score=None)
    applies: ClassVar[Applies] = Applies()
    # above this share of failed rows the partition decision is ``inconclusive``: the rows left are not
    # the partition any more (a failure is rarely independent of the text: long, empty, odd encodings)
    max_failed_share: ClassVar[float] = 0.5
    # it asks engines for prompt log-probabilities (``kind="score"`` requests): the plan skips it on a model
    # that cannot give them (a chat-only API, ``api: openai_chat``), with the reason
    scores_text: ClassVar[bool] = False

    def has_param(self, name: str) -> bool:
        """Its Config has a parameter ``name``."""
        return any(f.name == name for f in dataclasses.fields(self.Config))

    @property
    def uses_reference(self) -> bool:
        """It compares each partition with a reference partition: its Config has ``reference``."""
        return self.has_param("reference")

    def make_config(self, params: dict[str, Any] | None, where: str = "") -> Any:
        """Build ``Config`` from a plain dict, naming the config key on an unknown parameter."""
        params = dict(params or {})
        known = {f.name for f in dataclasses.fields(self.Config)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(
                f"{where or 'method ' + self.name}: unknown parameter(s) {', '.join(unknown)} for "
                f"method {self.name!r}; known parameters: {', '.join(sorted(known))}"
            )
        check_param_types(self.Config, params, where or f"methods.{self.name}")
        return self.Config(**params)

    def engine_roles_for(self, cfg: Any) -> tuple[str, ...]:
        """The engine roles this configuration needs (e.g. a judge only when enabled)."""
        return self.engine_roles

    def not_applicable(self, cfg: Any, bench: BenchmarkFacts) -> str | None:
        """Why this method does not apply to ``bench`` (the plan skips the pair), or None."""
        a = self.applies
        if a.tasks and bench.task not in a.tasks:
            return f"{self.name} works on {', '.join(a.tasks)} benchmarks; {bench.name} is {bench.task}"
        if a.needs_choices and not bench.has_choices:
            return f"{self.name} reads the options of multiple-choice items; {bench.name} ({bench.task}) has none"
        return None

    def plan_warnings(self, cfg: Any, bench: BenchmarkFacts) -> list[str]:
        """Plan-time warnings for ``bench`` (e.g. too few rows for the test's power), each naming the fix."""
        need = self.applies.min_rows
        if bench.limit is not None and bench.limit < need:
            return [
                f"{self.name} on {bench.name}: run.limit={bench.limit} rows, but its test needs >= {need} to have "
                f"any power; the verdict will be inconclusive - raise benchmarks.{bench.name}.limit (or run.limit) "
                f"to >= {need}"
            ]
        return []

    def settle(self, verdict: Verdict, cfg: Any) -> Verdict:
        """The checks every partition decision passes after ``reduce``: rows that failed."""
        if verdict.decision == "inconclusive":
            return verdict
        if verdict.n_examples <= 0:
            return verdict.make_inconclusive("the partition has no rows: nothing to decide on")
        if verdict.n_failed >= verdict.n_examples:
            return verdict.make_inconclusive(every_row_failed(verdict.n_examples))
        share = verdict.n_failed / verdict.n_examples
        if share > self.max_failed_share:
            return verdict.make_inconclusive(
                f"{verdict.n_failed} of {verdict.n_examples} rows failed ({share:.0%} > {self.max_failed_share:.0%}): "
                "the rows left need not represent the partition; fix the failures (see the error column)"
            )
        return verdict

    def reference_benchmark(self, cfg: Any, benchmark: str) -> str | None:
        """Benchmark key whose rows ``reduce`` compares ``benchmark``'s against (known unseen), or None.

        ``cfg.reference`` is one key for every benchmark, or a mapping benchmark -> key; a benchmark is
        never its own reference.
        """
        ref = getattr(cfg, "reference", None)
        if isinstance(ref, Mapping):
            ref = ref.get(benchmark)
        return str(ref) if ref and ref != benchmark else None

    def served_as_reference(self, cfg: Any, benchmark: str, benchmarks: Iterable[str]) -> list[str]:
        """The keys of ``benchmarks`` whose reference is ``benchmark`` when ``benchmark`` has none of its own
        (a yardstick: its rows are compared with, never tested), else []."""
        if self.reference_benchmark(cfg, benchmark):
            return []
        return [b for b in benchmarks if b != benchmark and self.reference_benchmark(cfg, b) == benchmark]

    def check_reference(self, cfg: Any, bench: BenchmarkFacts, reference: BenchmarkFacts) -> str | None:
        """Why ``reference`` cannot serve as ``bench``'s reference partition (the plan refuses), or None."""
        return None

    def contamination_source(self, cfg: Any) -> str | None:
        """Label of the open-data method whose per-example contamination ``reduce`` needs, or None."""
        return getattr(cfg, "contamination_from", None) or None

    # closed-data steps
    def requests(
        self, records: list[Record], cfg: Any, stage: int, outputs: dict[str, Output]
    ) -> list[Request]:
        raise NotImplementedError

    # open-data steps
    def build_index(self, records: list[Record], cfg: Any) -> Any:
        raise NotImplementedError

    def match(self, docs: list[dict[str, Any]], index: Any, cfg: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    def fold(self, rows: list[dict[str, Any]], cfg: Any) -> list[dict[str, Any]]:
        """Open-data methods: ``rows`` (match rows, earlier folds' rows, or both) folded into the few rows per
        example that ``score`` needs, so a corpus scan's memory grows with the benchmark, not with how often
        the corpus copies it. The contract (``contamray.methods.open.common.FOLD_CONTRACT``) is checked for
        every open-data method by ``tests/fold_check.py``."""
        raise NotImplementedError

    def judge_requests(self, records: list[Record], matches: list[dict[str, Any]], cfg: Any) -> list[Request]:
        """Open-data methods with a judge: prompts about the retrieved candidates."""
        raise NotImplementedError

    # both families
    def score(self, records: list[Record], evidence: Any, cfg: Any, **extra: Any) -> list[dict[str, Any]]:
        """Per-example rows from ``evidence``: engine outputs by key (closed) or match rows (open)."""
        raise NotImplementedError

    def reduce(self, table: Any, cfg: Any) -> Verdict:
        raise NotImplementedError


_REGISTRY: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: make a method findable by its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def get_method(name: str) -> Method:
    """The method registered as ``name``; the error lists the registered names."""
    _load_builtin_methods()
    if name not in _REGISTRY:
        raise KeyError(
            f"unknown method {name!r}; registered methods: {', '.join(sorted(_REGISTRY))}"
        )
    return _REGISTRY[name]()


def method_names() -> list[str]:
    _load_builtin_methods()
    return sorted(_REGISTRY)


def _load_builtin_methods() -> None:
    import importlib
    import pkgutil

    import contamray.methods.closed as closed
    import contamray.methods.open as open_

    for package in (closed, open_):
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{info.name}")
