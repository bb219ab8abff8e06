"""From a composed config to a validated plan of cells, before any work starts.

Every name in the config is checked here — models, engine backends, benchmark adapters, methods and
their parameters, the corpus — so a typo fails in a second with the config key and the choices, not
an hour into a sweep. The plan is plain data: the pipeline (``contamray.pipeline.runner``) executes it.

A *cell* is one (model × benchmark partition × method) answer. Open-data methods look at a corpus,
not a model, so their cells carry the corpus label in the model column (``corpus:<kind>``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from contamray.corpus.planted import check_corpus
from contamray.experiments import CONF_DIR
from contamray.methods.base import BenchmarkFacts, Method, get_method, method_names
from contamray.pipeline.heldouts import resolve_heldouts
from contamray.pipeline.settings import check_settings

log = logging.getLogger(__name__)

MODEL_POOL_KEYS = ("num_gpus", "num_cpus", "concurrency", "accelerator_type", "resources", "threads")
BACKENDS = ("auto", "hf", "vllm", "http")
# backends that cannot return the vocabulary mean / std of log p (Min-K%++), and why
NO_VOCAB_STATS = {
    "vllm": "the vLLM backend returns chosen-token log-probabilities only",
    "http": "an OpenAI-compatible API (backend http) returns chosen-token log-probabilities only (at most the "
            "top few), never statistics over the whole vocabulary",
}
# part of every cell hash: raised when what a stored cell means changes (3: three-valued verdicts; 4: long
# texts windowed over token ids in the engine; 6: n-gram methods set template-only matches apart; 7: a chat-form
# reply on a model without a chat template follows the raw text after a space; 8: an LLM Decontaminator example whose
# judge answered neither True nor False is undecided, not clean), so no run reuses a cell computed under older rules
RESULTS_VERSION = 8


class ConfigError(ValueError):
    """A config key is wrong; the message names the key, what was found and the choices."""


@dataclass(frozen=True)
class ModelPlan:
    """One model and how it is hosted (``contamray.serve.hosting``: a Serve deployment, ``concurrency``
    replicas of ``num_gpus`` / ``num_cpus`` each)."""

    name: str
    engine: dict[str, Any]  # EngineSpec fields (source, backend, dtype, ...)
    num_gpus: float = 0.0
    num_cpus: float = 1.0
    concurrency: int = 1
    accelerator_type: str | None = None  # a Ray accelerator type the replicas need (e.g. "A100"); None = any
    inject: dict[str, Any] | None = None  # fine-tune the source on benchmark rows first (contamray.inject)
    # custom Ray resources each replica (and an injected model's fine-tune) needs, e.g. {"big_memory": 1}
    resources: dict[str, float] = field(default_factory=dict)
    # compute threads of each replica's engine (torch); None = its num_cpus (what Ray gives an actor)
    threads: int | None = None
    # a local checkpoint's files (engines.models.checkpoint_digest): retrained in place, it is another model
    files: str | None = None

    @property
    def backend(self) -> str:
        return str(self.engine["backend"])


@dataclass(frozen=True)
class BenchmarkPlan:
    name: str
    adapter: str
    config: str | None
    split: str | None
    limit: int | None
    sample: str = "random"  # "random" (seeded) or "first" (a contiguous block), canonical order either way
    offset: int = 0  # rows of the split skipped before sampling (a held-out after the first `offset` rows)


@dataclass(frozen=True)
class MethodPlan:
    label: str
    method_name: str
    params: dict[str, Any]

    @property
    def method(self) -> Method:
        return get_method(self.method_name)

    @property
    def family(self) -> str:
        return self.method.family

    def config(self) -> Any:
        return self.method.make_config(self.params, where=f"methods.{self.label}")

    def resolved(self) -> dict[str, Any]:
        """Every parameter's value, written in the config or the method's default: what a cell's hash reads, so
        a parameter spelt out at its default hashes as left out, and a default changed in the code is a new
        cell (not a stored one computed under the old default)."""
        return dataclasses.asdict(self.config())

    def roles(self) -> tuple[str, ...]:
        return tuple(self.method.engine_roles_for(self.config()))


@dataclass(frozen=True)
class Cell:
    model: str
    benchmark: str
    method: str  # the method label (key under `methods:`)
    family: str

    @property
    def key(self) -> str:
        return f"{self.model}|{self.benchmark}|{self.method}"


@dataclass
class Plan:
    models: dict[str, ModelPlan]
    benchmarks: dict[str, BenchmarkPlan]
    methods: dict[str, MethodPlan]
    corpus: dict[str, Any]
    judge: ModelPlan | None
    reference_model: ModelPlan | None
    seed: int
    data: dict[str, Any]
    ray: dict[str, Any]
    serve: dict[str, Any] = field(default_factory=dict)  # model hosting: reuse / keep deployments
    cells: list[Cell] = field(default_factory=list)
    # benchmark name -> digest of the rows it loaded (``rows_digest``), set by the runner once the rows
    # are read, so a finished cell is reused only for the very same rows, not just the same config
    row_digests: dict[str, str] = field(default_factory=dict)
    # what the corpus holds right now (``contamray.corpus.fingerprint``: file listing with sizes and
    # mtimes), set by the runner, so an open-data cell is not reused after the corpus files changed
    corpus_digest: str = ""
    # (cell, reason) for every (model x benchmark x method) the plan left out because the method does
    # not apply to the benchmark (``Method.not_applicable``): reported, never silently missing
    skipped: list[tuple[Cell, str]] = field(default_factory=list)
    # plan-time warnings (power, structure), each naming the config key to change; logged by build_plan
    warnings: list[str] = field(default_factory=list)
    # benchmark key -> its held-out's key, as ``benchmarks.<key>.heldout`` named it (``pipeline/heldouts.py``;
    # already merged into each held-out method's ``reference``): kept to name that key in errors
    heldouts: dict[str, str] = field(default_factory=dict)

    @property
    def max_unread(self) -> float:
        """``corpus.max_unread``: the most of the corpus' bytes a scan may leave unread before an open-data "clean"
        becomes inconclusive (``corpus.coverage``)."""
        from contamray.corpus.coverage import DEFAULT_MAX_UNREAD, check_max_unread

        return check_max_unread(self.corpus.get("max_unread", DEFAULT_MAX_UNREAD))

    @property
    def corpus_label(self) -> str:
        return f"corpus:{self.corpus.get('kind', 'none')}"

    def facts(self, benchmark: str) -> BenchmarkFacts:
        """What the plan knows of ``benchmark`` before its rows are loaded."""
        from contamray.benchmarks import get_adapter

        b = self.benchmarks[benchmark]
        task = get_adapter(b.adapter).task
        return BenchmarkFacts(
            name=benchmark, adapter=b.adapter, config=b.config, split=b.split, task=task,
            has_choices=task == "multiple_choice", limit=b.limit, sample=b.sample, offset=b.offset,
        )  # fmt: skip

    def closed_methods(self) -> list[MethodPlan]:
        return [m for m in self.methods.values() if m.family == "closed"]

    def open_methods(self) -> list[MethodPlan]:
        return [m for m in self.methods.values() if m.family == "open"]

    def engine_pools(self) -> list[ModelPlan]:
        """The engine actor pools the run creates: each target model, plus judge / reference models."""
        pools = list(self.models.values()) if self.closed_methods() else []
        roles = {role for m in self.methods.values() for role in m.roles()}
        if "judge" in roles:
            judge = self.pool_for_role("judge", next(iter(self.models), ""))
            if judge not in pools:
                pools.append(judge)
        if "reference" in roles and self.reference_model is not None:
            pools.append(self.reference_model)
        return pools

    def pool_for_role(self, role: str, model: str) -> ModelPlan:
        """The engine pool that answers ``role`` for target ``model``.

        The judge is the top-level ``judge`` model when set, else the target model itself (open-data
        cells have no target: the first model of the run). The reference model is ``reference_model``.
        """
        if role == "judge" and self.judge is not None:
            return self.judge
        if role == "reference":
            if self.reference_model is None:
                raise ConfigError("reference_model: a method needs a reference model; set reference_model")
            return self.reference_model
        if model in self.models:
            return self.models[model]
        return next(iter(self.models.values()))

    def dependencies(self, cell: Cell) -> list[Cell]:
        """Cells whose per-example rows ``cell``'s reduce needs (reference partition, contamination)."""
        mp = self.methods[cell.method]
        method, cfg = mp.method, mp.config()
        deps = []
        ref = method.reference_benchmark(cfg, cell.benchmark)
        if ref:
            deps.append(Cell(cell.model, ref, cell.method, cell.family))
        source = method.contamination_source(cfg)
        if source:
            deps.append(Cell(self.corpus_label, cell.benchmark, source, "open"))
        return deps

    def cell_hash(self, cell: Cell) -> str:
        """A content hash of everything that decides a cell's result (for reuse across runs)."""
        mp = self.methods[cell.method]
        parts: dict[str, Any] = {
            "results": RESULTS_VERSION,
            "benchmark": dataclasses.asdict(self.benchmarks[cell.benchmark]),
            "method": {"label": mp.label, "method_name": mp.method_name, "params": mp.resolved()},
            "seed": self.seed,
            "mirror": bool(self.data.get("mirror_dir")),
            "rows": self.row_digests.get(cell.benchmark, ""),
        }
        if cell.family == "closed":
            parts["model"] = self.models[cell.model].engine
            parts["inject"] = self.models[cell.model].inject
            if self.models[cell.model].files:  # only then: hashes of other sources are those from before the key
                parts["model_files"] = self.models[cell.model].files
        else:
            parts["corpus"] = self.corpus
            parts["corpus_content"] = self.corpus_digest
        for role in mp.roles():
            if role != "target":
                pool = self.pool_for_role(role, cell.model)
                parts[role] = pool.engine
                if pool.files:
                    parts[f"{role}_files"] = pool.files
        parts["dependencies"] = [self.cell_hash(dep) for dep in self.dependencies(cell)]
        blob = json.dumps(parts, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def rows_digest(records: Sequence[Any], failures: Sequence[dict[str, Any]]) -> str:
    """A content hash of a benchmark's loaded rows and failed rows: changes when the data does (a
    hub dataset revised, a mirror file edited), whatever the config says."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(json.dumps(record.to_row(), sort_keys=True, default=str).encode())
    for failure in failures:
        digest.update(json.dumps(failure, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def build_plan(cfg: DictConfig | dict[str, Any]) -> Plan:
    """Validate the composed config and lay out its cells. Raises ConfigError naming the key."""
    c = cfg if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(c, dict)
    try:
        c, heldouts = resolve_heldouts(c)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    try:
        check_settings(c)  # before the methods, whose seeds interpolate run.seed
    except ValueError as err:
        raise ConfigError(str(err)) from None
    seed = int((c.get("run") or {}).get("seed", 0))
    engine_override = (c.get("engine") or {}).get("backend")
    # a source path the driver lacks may be on the model's nodes when the run joins a cluster (_check_source)
    sources = _Sources(on_cluster=bool((c.get("ray") or {}).get("address")))
    models = {
        name: _model_plan(f"models.{name}", name, spec, engine_override, sources)
        for name, spec in (c.get("models") or {}).items()
    }
    benchmarks = {
        name: _benchmark_plan(name, spec) for name, spec in (c.get("benchmarks") or {}).items()
    }
    methods = {
        label: _method_plan(label, spec)
        for label, spec in (c.get("methods") or {}).items()
        if not _unselected_tuning(label, spec)
    }
    if not benchmarks:
        raise ConfigError("benchmarks: no benchmark selected; add one, e.g. benchmark=[gsm8k]")
    if not methods:
        raise ConfigError("methods: no method selected; add one, e.g. method=[guided_prompting]")
    _check_report(c.get("report") or {})
    corpus = dict(c.get("corpus") or {"kind": "none"})
    judge_spec = c.get("judge")
    judge = _model_plan("judge", "judge", judge_spec, engine_override, sources) if judge_spec else None
    ref_spec = c.get("reference_model")
    reference = (
        _model_plan("reference_model", "reference_model", ref_spec, engine_override, sources) if ref_spec else None
    )
    plan = Plan(
        models=models,
        benchmarks=benchmarks,
        methods=methods,
        corpus=corpus,
        judge=judge,
        reference_model=reference,
        seed=seed,
        data=dict(c.get("data") or {}),
        ray=dict(c.get("ray") or {}),
        serve=dict(c.get("serve") or {}),
        heldouts=heldouts,
    )
    plan.warnings += sources.warnings
    read_by = plan.ray.get("corpus_read") or "actors"
    if read_by not in ("actors", "tasks"):
        raise ConfigError(f"ray.corpus_read: {read_by!r} is not one of actors (each match actor reads whole files), "
                          "tasks (Ray Data read tasks feed the match actors)")  # fmt: skip
    closed = plan.closed_methods()
    if closed and not models:
        raise ConfigError(
            f"models: methods {', '.join(m.label for m in closed)} probe a model but no model is "
            "selected; add one, e.g. model=[smollm2_135m]"
        )
    if plan.open_methods() and corpus.get("kind", "none") == "none":
        raise ConfigError(
            f"corpus: methods {', '.join(m.label for m in plan.open_methods())} scan a corpus but "
            "corpus.kind is none; choose corpus=files corpus.paths=[...] or corpus=planted"
        )
    try:
        check_corpus(corpus, benchmarks, scanned=bool(plan.open_methods()))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    try:
        plan.max_unread  # noqa: B018 - checked here, before any work
    except ValueError as err:
        raise ConfigError(str(err)) from None
    _check_roles_and_dependencies(plan)
    _check_injections(plan)
    _check_context(plan)
    said: list[tuple[str, str, str]] = []  # (method label, method name, warning)
    for bench in benchmarks:
        facts = plan.facts(bench)
        for m in methods.values():
            cells = (
                [Cell(model, bench, m.label, "closed") for model in models]
                if m.family == "closed"
                else [Cell(plan.corpus_label, bench, m.label, "open")]
            )
            cfg = m.config()
            reason = m.method.not_applicable(cfg, facts)
            if reason:
                plan.skipped += [(cell, reason) for cell in cells]
                continue
            unscorable = [c for c in cells if m.method.scores_text and _chat_only(models.get(c.model))]
            plan.skipped += [(c, _no_scores_reason(m, models[c.model])) for c in unscorable]
            cells = [c for c in cells if c not in unscorable]
            if not cells:
                continue
            said += [(m.label, m.method.name, w) for w in m.method.plan_warnings(cfg, facts)]
            plan.cells += cells
    plan.warnings += _grouped(said)
    _check_skipped_dependencies(plan)
    for warning in plan.warnings:
        log.warning("plan: %s", warning)
    return plan


def _grouped(said: list[tuple[str, str, str]]) -> list[str]:
    """One line per warning, each naming its method's config key; the same warning from several methods on one
    benchmark (six membership scores on a contiguous block) is one line naming every key, in first-seen order."""
    groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for label, name, text in said:
        rest = text.removeprefix(f"{name} on ")  # what is the same for every method that says it
        key = ("", rest) if rest != text else (label, text)  # a warning worded otherwise stays its method's own
        groups.setdefault(key, []).append((label, text))
    return [
        f"methods.{said_by[0][0]}: {said_by[0][1]}"
        if len(said_by) == 1
        else f"methods.{{{','.join(label for label, _ in said_by)}}}: each on {rest}"
        for (_, rest), said_by in groups.items()
    ]


def _check_skipped_dependencies(plan: Plan) -> None:
    """A cell whose reference partition was skipped could never be reduced: refuse the plan."""
    skipped = {cell.key: reason for cell, reason in plan.skipped}
    for cell in plan.cells:
        for dep in plan.dependencies(cell):
            if dep.key in skipped:
                raise ConfigError(
                    f"methods.{cell.method}: {cell.benchmark} is compared with {dep.benchmark}, but the method does "
                    f"not apply there ({skipped[dep.key]}); choose another reference"
                )


def _check_context(plan: Plan) -> None:
    """A method's ``context_len`` (tokens per scoring window) must fit every model it probes: the model's
    ``max_model_len``, or the context its checkpoint's ``config.json`` declares (a local
    directory or a converted embedded model: ``declared_context``, read without loading the model) when smaller."""
    from contamray.engines.models import declared_context

    contexts: dict[str, int | None] = {}  # source -> declared context: each config.json read once per plan
    for m in plan.closed_methods():
        context_len = getattr(m.config(), "context_len", None)
        if not context_len:
            continue
        for role in ("target", *[r for r in m.roles() if r != "target"]):
            pools = list(plan.models.values()) if role == "target" else [plan.pool_for_role(role, "")]
            for pool in pools:
                limit = pool.engine.get("max_model_len")
                source = str(pool.engine.get("source") or "")
                if pool.backend != "http" and source not in contexts:
                    contexts[source] = declared_context(source)
                own = contexts.get(source) if pool.backend != "http" else None
                declared = bool(own) and (not limit or own < int(limit))  # the checkpoint's context binds
                limit = own if declared else limit
                if not limit and pool.backend == "http":
                    plan.warnings.append(
                        f"methods.{m.label}.context_len: {context_len} tokens per window, and the context of "
                        f"models.{pool.name} (backend http) is known only to its server; set "
                        f"models.{pool.name}.max_model_len so the plan can check it (a window longer than the "
                        "server's context fails every row of the cell)"
                    )
                if limit and pool.backend in ("vllm", "http"):
                    limit = int(limit) - 1  # vLLM (or a server) generates one token: a scored text holds one less
                if limit and int(context_len) > int(limit):
                    where = "judge" if pool is plan.judge else (
                        "reference_model" if pool is plan.reference_model else f"models.{pool.name}"
                    )
                    if declared:
                        raise ConfigError(
                            f"methods.{m.label}.context_len: {context_len} tokens per window, but {where} "
                            f"({pool.engine.get('source')}) has a context of {limit} tokens (its config.json): "
                            f"the engine cannot score such a window; set methods.{m.label}.context_len <= {limit} "
                            "(and stride below it)"
                        )
                    raise ConfigError(
                        f"methods.{m.label}.context_len: {context_len} tokens per window, but {where}.max_model_len "
                        f"is {limit}: the engine would cut every longer window; set methods.{m.label}.context_len "
                        f"<= {limit} (and stride below it) or raise {where}.max_model_len"
                    )


def _check_injections(plan: Plan) -> None:
    for name, model in plan.models.items():
        if not model.inject:
            continue
        from contamray.inject import validate_inject_spec

        try:
            validate_inject_spec(model.inject, f"models.{name}.inject", set(plan.benchmarks))
        except ValueError as err:
            raise ConfigError(str(err)) from None


def _check_report(report: dict[str, Any]) -> None:
    from contamray.report.correction import check_correction

    try:
        check_correction(report.get("correction", "holm"), report.get("alpha", 0.05))
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _check_roles_and_dependencies(plan: Plan) -> None:
    for m in plan.methods.values():
        roles = m.roles()
        where = f"methods.{m.label}"
        if "reference" in roles and plan.reference_model is None:
            raise ConfigError(
                f"{where}: method {m.method_name} compares against a reference model; set reference_model "
                "to a model spec (e.g. reference_model={source: smollm2-135m})"
            )
        if "reference" in roles and m.method.scores_text and _chat_only(plan.reference_model):
            raise ConfigError(f"reference_model: {_no_scores_reason(m, plan.reference_model)}")
        if "judge" in roles and plan.judge is None and not plan.models:
            raise ConfigError(f"{where}: method {m.method_name} needs a judge engine; set judge or add a model")
        if getattr(m.method, "vocab_stats", False):
            _check_vocab_stats(plan, m)
        cfg = m.config()
        if m.method.scores_text and getattr(cfg, "chat", False):
            _check_chat_scores(plan, m)
        if "judge" in roles and m.family == "closed":
            _check_judge(plan, m, cfg)
        for bench in plan.benchmarks:
            ref = m.method.reference_benchmark(cfg, bench)
            if not ref:
                continue
            if ref not in plan.benchmarks:
                raise ConfigError(
                    f"{where}.reference: {ref!r} (the reference of {bench}) is not a benchmark of this run; add it "
                    f"under benchmarks (choices now: {', '.join(plan.benchmarks)})"
                )
            problem = m.method.check_reference(cfg, plan.facts(bench), plan.facts(ref))
            if problem:
                named = f" (benchmarks.{bench}.heldout)" if plan.heldouts.get(bench) == ref else ""
                raise ConfigError(f"{where}.reference{named}: {problem}")
        source = m.method.contamination_source(cfg)
        if source and (source not in plan.methods or plan.methods[source].family != "open"):
            opens = [x.label for x in plan.open_methods()]
            raise ConfigError(
                f"{where}.contamination_from: {source!r} is not an open-data method of this run; "
                f"choices: {', '.join(opens) or 'none (add one, e.g. method=[...,ngram13])'}"
            )


def _chat_only(model: ModelPlan | None) -> bool:
    """A model behind a chat-only API (``api: openai_chat``): it generates, it cannot score text."""
    return model is not None and model.backend == "http" and model.engine.get("api") == "openai_chat"


def _no_scores_reason(m: MethodPlan, model: ModelPlan) -> str:
    return (
        f"{m.method_name} scores text with prompt log-probabilities, and models.{model.name} (api: openai_chat) "
        "serves chat completions only, which return none; probe a local copy of the weights, or a server that "
        "returns prompt log-probabilities (api: vllm or openai), for this method"
    )


def _check_vocab_stats(plan: Plan, m: MethodPlan) -> None:
    """A method that needs the vocabulary statistics (Min-K%++) cannot run on a backend without them."""
    for name, model in plan.models.items():
        reason = NO_VOCAB_STATS.get(model.backend)
        if not reason:
            continue
        fix = (
            f"probe a local copy of the weights with backend hf (a model spec with source: <dir or hub id>), or drop "
            f"{m.method_name} for models.{name}" if model.backend == "http" else f"set models.{name}.backend=hf"
        )
        raise ConfigError(
            f"methods.{m.label}: method {m.method_name} cannot run on models.{name} (backend {model.backend}): it "
            f"needs the vocabulary mean and standard deviation of log p at every position, and {reason}; {fix}"
        )


def _check_chat_scores(plan: Plan, m: MethodPlan) -> None:
    """Scores after a chat-rendered prompt need the model's chat template and token ids: a legacy completions API
    (``api: openai``) has neither (``engines/http.py``)."""
    chat = m.config().chat
    for name, model in plan.models.items():
        if model.backend == "http" and model.engine.get("api") == "openai":
            raise ConfigError(
                f"methods.{m.label}.chat: {str(chat).lower()} scores each answer as the reply to a prompt rendered in "
                f"the model's chat template, and models.{name} (backend http, api: openai) returns neither its chat "
                f"template nor token ids; set models.{name}.api=vllm for a vLLM server (its /tokenize renders the "
                f"template), probe a local copy of the weights, or set methods.{m.label}.chat=false"
            )


def _check_judge(plan: Plan, m: MethodPlan, cfg: Any) -> None:
    """A closed-data method's judge must be a model other than the target it judges, unless the method's
    config asks for self-judging explicitly (``self_judge: true``): a model judging its own completions
    is not the paper's protocol and is biased towards "yes"."""
    if getattr(cfg, "self_judge", False):
        return
    where = f"methods.{m.label}"
    if plan.judge is None:
        raise ConfigError(
            f"{where}: method {m.method_name} needs a judge other than the target model, and `judge` is not set; "
            f"set judge to a model spec (e.g. judge={{source: <hub id or local dir>}}), turn the judge off, or set "
            f"{where}.self_judge=true to let each target judge itself (labelled as such in the verdict)"
        )
    source = plan.judge.engine.get("source")
    same = [name for name, model in plan.models.items() if model.engine.get("source") == source]
    if same:
        raise ConfigError(
            f"{where}: the judge (source {source!r}) is the target model {', '.join(same)}; "
            f"set judge to another model, or {where}.self_judge=true to allow self-judging explicitly"
        )


@dataclass
class _Sources:
    """What checking the model sources of one plan needs beyond each spec: whether the run joins a cluster, and
    the warnings it gives."""

    on_cluster: bool
    warnings: list[str] = field(default_factory=list)


def _check_source(where: str, source: str, sources: _Sources) -> None:
    """``<where>.source`` names a model this plan can load, checked before any work (the engine would find out only
    in a Serve replica, 3 constructor tries into the run): not a mistyped path, a directory without
    ``config.json`` or a bare name neither embedded nor ``org/name`` (the engine's own message); a PEFT adapter's
    base nameable and peft installed (``engines/adapters.py``); a local checkpoint's weight files present and not
    cut short (``engines/checkpoint_files.py``). On a cluster a path this node does not have may be one the model's
    nodes have (a mount of their own): a warning, not an error."""
    from contamray.engines.adapters import check_adapter
    from contamray.engines.checkpoint_files import check_weight_files
    from contamray.engines.models import local_checkpoint, resolve_model_path, source_kind

    key = f"{where}.source"
    kind = source_kind(source)
    try:
        if kind in ("directory", "unknown"):
            path_like = source.strip().startswith(("/", ".", "~")) or "/" in source
            if sources.on_cluster and path_like:
                sources.warnings.append(
                    f"{key}: {source!r} is not a model directory on this node (the driver's); each node that hosts "
                    "the model must have it there (a shared path), or its replica will fail to start"
                )
                return
            resolve_model_path(source, key)  # raises for these kinds, saying what a source may be
        check_adapter(source, key)
        checkpoint = local_checkpoint(source)
        if checkpoint is not None:
            check_weight_files(checkpoint, key)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _model_plan(where: str, name: str, spec: Any, engine_override: str | None, sources: _Sources) -> ModelPlan:
    from contamray.engines import EngineSpec, check_http
    from contamray.engines.models import checkpoint_digest

    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a mapping with at least `source`, got {spec!r}")
    spec = dict(spec)
    pool = {k: spec.pop(k) for k in MODEL_POOL_KEYS if k in spec}
    inject = spec.pop("inject", None)
    known = ({f.name for f in dataclasses.fields(EngineSpec)} - {"name"}) | {"inject"}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; known keys: "
            f"{', '.join(sorted(known | set(MODEL_POOL_KEYS)))}"
        )
    if not spec.get("source"):
        raise ConfigError(f"{where}.source: missing; give a hub id, a local directory or smollm2-135m")
    spec["name"] = name
    if engine_override:
        spec["backend"] = engine_override
    backend = spec.get("backend", "auto")
    if backend not in BACKENDS:
        raise ConfigError(f"{where}.backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    try:
        check_http(spec, where)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if backend == "http" and spec.get("api_key_env") and not os.environ.get(str(spec["api_key_env"])):
        log.warning("%s.api_key_env: the variable %s is not set here; the run's engine replicas need it (export it "
                    "before the run, on every node of a cluster)", where, spec["api_key_env"])  # fmt: skip
    num_gpus = float(pool.get("num_gpus", 0) or 0)
    if backend == "auto":
        # Resolved here, not inside the actor, so the plan states what will run: vLLM on GPU actors,
        # transformers on CPU actors (on CPU the two are close; see ENVIRONMENT.md).
        spec["backend"] = "vllm" if num_gpus > 0 else "hf"
    if str(spec.get("dtype", "auto")).lower() == "auto":
        # resolved here so the plan (and the cell hash) states the dtype that will run; a CPU pool
        # takes this node's answer, on the assumption that the cluster's CPU nodes are alike
        from contamray.engines.hf import native_dtype

        spec["dtype"] = native_dtype(on_gpu=num_gpus > 0)
    _check_tokenizer(where, spec, inject)
    _check_share_prefixes(where, spec)
    if spec["backend"] != "http":
        _check_source(where, str(spec["source"]), sources)
    tensor_parallel = int(spec.get("tensor_parallel_size", 1) or 1)
    if spec["backend"] == "vllm" and num_gpus > 0 and tensor_parallel > num_gpus:
        raise ConfigError(
            f"{where}.tensor_parallel_size: {tensor_parallel} GPUs per engine, but num_gpus is {num_gpus:g}: one "
            f"replica hosts all the shards of its model, so set {where}.num_gpus to {tensor_parallel} (or lower "
            "tensor_parallel_size)"
        )
    concurrency = int(pool.get("concurrency", 1) or 1)
    if concurrency < 1:
        raise ConfigError(f"{where}.concurrency: must be >= 1, got {concurrency}")
    return ModelPlan(
        name=name,
        engine=spec,
        num_gpus=num_gpus,
        num_cpus=float(pool.get("num_cpus", 1) or 0),
        concurrency=concurrency,
        accelerator_type=str(pool["accelerator_type"]) if pool.get("accelerator_type") else None,
        inject=dict(inject) if inject else None,
        resources=_custom_resources(f"{where}.resources", pool.get("resources")),
        threads=_threads(f"{where}.threads", pool.get("threads")),
        files=checkpoint_digest(str(spec["source"])) if spec["backend"] != "http" else None,
    )


def _check_share_prefixes(where: str, spec: dict[str, Any]) -> None:
    """``<where>.share_prefixes``: true (the default) is dropped from the spec, so cell hashes and Serve application
    names stay those of specs written before the key; false stays (answers may differ in the last bits, so cells
    computed with sharing are not reused). It applies to the transformers engine; elsewhere it is said to do nothing."""
    share = spec.get("share_prefixes", True)
    if not isinstance(share, bool):
        raise ConfigError(f"{where}.share_prefixes: expected true or false, got {share!r}")
    if share:
        spec.pop("share_prefixes", None)
    elif spec.get("backend") != "hf":
        log.warning("%s.share_prefixes: false applies to the transformers engine (backend: hf); backend %s reads "
                    "prompts its own way, so the key changes nothing there", where, spec.get("backend"))  # fmt: skip


def _check_tokenizer(where: str, spec: dict[str, Any], inject: Any) -> None:
    """``<where>.tokenizer`` checked, and a local checkpoint without tokenizer files refused before any work
    unless the key names where its tokenizer is (engines/tokenizer.py). An unset key is dropped from the spec, so
    cell hashes and Serve application names stay those of specs written before the key existed."""
    from contamray.engines.tokenizer import missing_tokenizer, no_tokenizer_message

    tokenizer = spec.get("tokenizer")
    if tokenizer in (None, ""):
        spec.pop("tokenizer", None)
        if spec.get("backend") != "http" and missing_tokenizer(str(spec["source"])):
            message = no_tokenizer_message(where, str(spec["source"]))
            if inject:
                message = (f"{where}.source: {spec['source']!r} has no tokenizer files, and its fine-tune (inject) "
                           "saves the source's tokenizer with the weights; save the tokenizer beside them "
                           "(tokenizer.save_pretrained)")  # fmt: skip
            raise ConfigError(message)
        return
    if not isinstance(tokenizer, str):
        raise ConfigError(f"{where}.tokenizer: expected a model source (an embedded name, a directory or a hub id), "
                          f"got {tokenizer!r}")  # fmt: skip
    if inject:
        raise ConfigError(f"{where}.tokenizer: a model with inject is fine-tuned from its source and saved with the "
                          "source's tokenizer; give a source that has its tokenizer and remove the key")  # fmt: skip


def _threads(where: str, value: Any) -> int | None:
    """A model's engine threads per replica, checked: None (its num_cpus) or an integer >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{where}: expected an integer >= 1 (compute threads of each replica's engine) or null (its num_cpus), "
            f"got {value!r}"
        )
    return value


def _custom_resources(where: str, value: Any) -> dict[str, float]:
    """A model's custom Ray resources (``{name: amount}``, amounts > 0), checked; ``{}`` when unset."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping of custom Ray resource names to amounts, got {value!r}")
    out: dict[str, float] = {}
    for key, amount in value.items():
        if str(key) in ("CPU", "GPU", "memory", "object_store_memory"):
            raise ConfigError(f"{where}.{key}: set it with the model's num_cpus / num_gpus, not as a custom resource")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not amount > 0:
            raise ConfigError(f"{where}.{key}: expected a number > 0, got {amount!r}")
        out[str(key)] = float(amount)
    return out


def _benchmark_plan(name: str, spec: Any) -> BenchmarkPlan:
    from contamray.benchmarks import adapter_names, get_adapter

    where = f"benchmarks.{name}"
    if not isinstance(spec, dict) or "adapter" not in spec:
        raise ConfigError(f"{where}: expected a mapping with `adapter` (one of {', '.join(adapter_names())})")
    known = ("adapter", "config", "split", "limit", "sample", "offset", "heldout")  # heldout: pipeline/heldouts.py
    unknown = sorted(set(spec) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")
    try:
        adapter = get_adapter(spec["adapter"])
    except KeyError as err:
        raise ConfigError(f"{where}.adapter: {err.args[0]}") from None
    split = spec.get("split")
    splits = list(getattr(adapter, "splits", []) or [])
    if split is not None and splits and split not in splits:
        raise ConfigError(f"{where}.split: {split!r} is not a split of {spec['adapter']}; choices: {', '.join(splits)}")
    config = spec.get("config")
    configs = list(adapter.all_configs)
    if config is not None and config not in configs:
        raise ConfigError(f"{where}.config: {config!r} is not a config of {spec['adapter']}; choices: "
                          f"{', '.join(configs)}")  # fmt: skip
    limit = spec.get("limit")
    if limit is not None and int(limit) < 1:
        raise ConfigError(f"{where}.limit: must be >= 1 or null (all rows), got {limit}")
    from contamray.benchmarks.loading import SAMPLINGS

    sample = spec.get("sample") or "random"
    if sample not in SAMPLINGS:
        raise ConfigError(
            f"{where}.sample: {sample!r} is not one of {', '.join(SAMPLINGS)} (run.sample sets it for all)"
        )
    offset = spec.get("offset") or 0
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ConfigError(f"{where}.offset: the number of leading rows of the split to skip (an integer >= 0), got "
                          f"{offset!r}")  # fmt: skip
    return BenchmarkPlan(
        name=name,
        adapter=spec["adapter"],
        config=spec.get("config"),
        split=split,
        limit=None if limit is None else int(limit),
        sample=str(sample),
        offset=offset,
    )


def _unselected_tuning(label: str, spec: Any) -> bool:
    """A parameter block an experiment left for a method the command line deselected.

    ``conf/exp/canary.yaml`` tunes e.g. ``methods.sharded_likelihood.num_shards``; with
    ``method=[guided_prompting]`` that block stays without its ``method`` key. It is ignored (with a
    warning) when its label names a method preset of ``conf/method/``; any other mapping without
    ``method`` is an error (``_method_plan``).
    """
    if not isinstance(spec, dict) or "method" in spec:
        return False
    if not (Path(CONF_DIR) / "method" / f"{label}.yaml").is_file():
        return False
    log.warning("methods.%s: parameters set (%s) but the method is not selected (method=[...]); ignored",
                label, ", ".join(sorted(spec)))
    return True


def _method_plan(label: str, spec: Any) -> MethodPlan:
    where = f"methods.{label}"
    if not isinstance(spec, dict) or "method" not in spec:
        raise ConfigError(f"{where}: expected a mapping with `method` (one of {', '.join(method_names())})")
    params = {k: v for k, v in spec.items() if k != "method"}
    try:
        method = get_method(spec["method"])
    except KeyError as err:
        raise ConfigError(f"{where}.method: {err.args[0]}") from None
    try:
        method.make_config(params, where=where)
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err)) from None
    return MethodPlan(label=label, method_name=spec["method"], params=params)
