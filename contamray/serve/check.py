"""An on-demand check, independent of HTTP: a few items, one model, some closed-data methods -> per-item
scores and each method's partition verdict.

The numbers are the batch pipeline's, computed by its own code:

- the plan (model, methods and their parameters, the reference benchmark) is composed from the same
  config tree with the same overrides as a run (``+exp=base model=[m] method=[...] benchmark=[ref]``)
  and validated by ``pipeline.plan.build_plan``;
- the items become ``Record``s of one partition (``<adapter>/api/<split>``, named for the reference's split
  so that a prompt naming the split - DCQ's quiz - asks both sides the same question); each method's engine
  stages run by the runner's own ``pipeline.cells.run_stages`` on the hosted models
  (``contamray.serve.hosting``: the same Serve deployments batch runs use, loaded once and held for the
  replica's life);
- the outputs are scored by the runner's ``ScoreWorker`` on the runner's chunks
  (``cells.chunk_payloads``, ``cells.example_table``), and the partition is reduced by the runner's
  ``cells.reduce_verdict`` (``method.reduce`` then ``method.settle``), in process, with the reference
  partition's rows (``is_reference``) when the method tests against one.

The reference partition (``ReferenceSpec``: an allow-listed benchmark, optional config / split / row
count) is scored once per model, method and spec and kept (``Checker`` holds a small cache). It is
compared as a held-out of the same benchmark (``mode: heldout``) when the items say they come from that
benchmark's adapter (``benchmark``), else as another distribution (``mode: distribution``, which the
verdict labels as such).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from contamray.records import Record, partition_parts
from contamray.serve.config import ServerSettings
from contamray.serve.security import ApiError

log = logging.getLogger("contamray")

ITEMS = "api_items"  # the benchmark key of a request's items inside a check
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # a config or split name: never a path
PLAN_CACHE = 64
REFERENCE_CACHE = 32
_COMPOSE = threading.Lock()  # Hydra's compose API keeps global state: one composition at a time


@dataclass(frozen=True)
class Item:
    """One text to check; ``label`` / ``reference`` / ``choices`` as a benchmark row's (``records.py``)."""

    text: str
    label: str = ""
    reference: str = ""
    choices: tuple[str, ...] = ()
    answer: str = ""
    id: str = ""


@dataclass(frozen=True)
class ReferenceSpec:
    """The partition the items are tested against: an allow-listed benchmark, its config, split and rows."""

    benchmark: str
    config: str | None = None
    split: str | None = None
    rows: int = 20
    sample: str = "random"


@dataclass
class CheckResult:
    model: str
    partition: str
    reference: dict[str, Any] | None
    methods: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return jsonable(dataclasses.asdict(self))


def items_to_records(items: Sequence[Item], adapter: str | None = None, task: str | None = None,
                     split: str = "items") -> list[Record]:
    """The items as Records of one partition (``<adapter>/api/<split>``, or ``api/<split>`` without an adapter).
    ``split`` is the split a prompt that names one (DCQ's quiz, guided prompting) names: the reference's when the
    items are tested against one, so that both sides of the held-out test are asked the same question; else the
    split of the benchmark the items are said to come from."""
    partition = f"{adapter}/api/{split}" if adapter else f"api/{split}"
    ids = [item.id or f"item{i}" for i, item in enumerate(items)]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ApiError(422, "invalid_items", f"items: ids {dupes} appear more than once; give each item its own id")
    blank = [i for i, item in enumerate(items) if not item.text.strip()]
    if blank:
        raise ApiError(422, "invalid_items", f"items {blank}: text is empty or only whitespace; there is nothing to "
                       "score - send the text the model was shown")
    records = []
    for i, (item, rid) in enumerate(zip(items, ids)):
        kind = task or ("multiple_choice" if item.choices else "question_answering")
        records.append(Record(
            id=rid, partition=partition, input=item.text, label=item.label, reference=item.reference or item.text,
            task=kind, choices=tuple(item.choices), answer=item.answer, order=i,
            verbalized=f"{item.text} {item.label}".strip(),
        ))  # fmt: skip
    return records


class Checker:
    """Runs checks for one API replica: composed plans, engine pools and reference rows are kept."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self._plans: OrderedDict[tuple, Any] = OrderedDict()
        self._references: OrderedDict[tuple, Any] = OrderedDict()
        self._engines: Any = None  # the replica's EnginePools, made on the first check
        self._lock = threading.Lock()

    # -- the plan ------------------------------------------------------------------------------
    def check_names(self, model: str, methods: Sequence[str], benchmark: str | None,
                    reference: ReferenceSpec | None) -> None:
        """Allow-lists: a model or benchmark outside them is 403, an unknown method 422 listing the methods."""
        allow = self.settings.allow
        if model not in allow.models:
            raise ApiError(403, "model_not_allowed",
                           f"model {model!r} is not served here; allowed models: {', '.join(allow.models)}")
        unknown = [m for m in methods if m not in allow.methods]
        if unknown or not methods:
            raise ApiError(422, "unknown_method",
                           {"message": f"unknown method(s) {unknown or '(none given)'}; choose from the methods "
                            "listed (GET /v1/methods)", "methods": list(allow.methods)})
        if len(set(methods)) != len(methods):
            raise ApiError(422, "invalid_methods", "methods: a method is listed twice; list each once")
        for name in [b for b in (benchmark, reference.benchmark if reference else None) if b]:
            if name not in allow.benchmarks:
                raise ApiError(403, "benchmark_not_allowed",
                               f"benchmark {name!r} is not served here; allowed: {', '.join(allow.benchmarks)}")
        if reference is not None:
            for field_name in ("config", "split"):
                value = getattr(reference, field_name)
                if value is not None and not SAFE_NAME.match(value):
                    raise ApiError(422, "invalid_reference", f"reference.{field_name}: {value!r} is not a config or "
                                   "split name (letters, digits, _ . -)")
            if not 1 <= reference.rows <= self.settings.limits.max_reference_rows:
                raise ApiError(422, "invalid_reference", f"reference.rows: {reference.rows}; give 1 to "
                               f"{self.settings.limits.max_reference_rows} (limits.max_reference_rows)")
            if reference.sample not in ("random", "first"):
                raise ApiError(422, "invalid_reference", "reference.sample: choose random or first")

    def checked_overrides(self, model: str, methods: Sequence[str], overrides: Sequence[str]) -> tuple[str, ...]:
        """A check's ``key=value`` overrides, checked as a job's are against ``allow.check_keys`` (``*``: one
        of the check's methods): 422 naming the key and the keys allowed, or a value that is not plain."""
        from contamray.serve.jobs import JobSpec, checked_overrides

        spec = JobSpec((model,), (), tuple(methods))
        return tuple(checked_overrides(tuple(overrides), spec, self.settings, self.settings.allow.check_keys))

    def plan(self, model: str, methods: Sequence[str], benchmark: str | None, reference: ReferenceSpec | None,
             overrides: tuple[str, ...] = ()) -> Any:
        """The validated plan of a check (cached): the model's pool, the methods (with the check's ``overrides``
        of their parameters), the reference benchmark."""
        key = (model, tuple(methods), benchmark, reference, overrides)
        with self._lock:
            if key in self._plans:
                self._plans.move_to_end(key)
                return self._plans[key]
        bench = reference.benchmark if reference else (benchmark or self.settings.allow.benchmarks[0])
        args = ["+exp=base", f"model=[{model}]", f"benchmark=[{bench}]", f"method=[{','.join(methods)}]"]
        if self.settings.mirror_dir:
            args.append(f"data.mirror_dir={self.settings.mirror_dir}")
        if reference is not None:
            args += [f"run.limit={reference.rows}", f"run.sample={reference.sample}"]
            args += [f"benchmarks.{bench}.{k}={v}" for k, v in
                     (("config", reference.config), ("split", reference.split)) if v is not None]
        plan = compose_plan(args + list(overrides))
        with self._lock:
            self._plans[key] = plan
            while len(self._plans) > PLAN_CACHE:
                self._plans.popitem(last=False)
        return plan

    # -- the check -----------------------------------------------------------------------------
    def check(self, model: str, methods: Sequence[str], items: Sequence[Item], benchmark: str | None = None,
              reference: ReferenceSpec | None = None, overrides: Sequence[str] = ()) -> CheckResult:
        from contamray.benchmarks import get_adapter

        self.check_names(model, methods, benchmark, reference)
        plan = self.plan(model, methods, benchmark, reference, self.checked_overrides(model, methods, overrides))
        adapter = plan.benchmarks[benchmark].adapter if benchmark and benchmark in plan.benchmarks else None
        if benchmark and adapter is None:
            adapter = _conf_adapter(benchmark)
        ref_rows, ref_failures = self._reference_rows(plan, reference) if reference else ([], [])
        spec = get_adapter(adapter) if adapter else None
        split = "items"  # the split a prompt naming one names: the reference's, else the benchmark's
        if ref_rows:
            split = partition_parts(ref_rows[0].partition)[2]
        elif spec is not None:
            split = spec.resolve_split(plan.benchmarks[benchmark].split if benchmark in plan.benchmarks else None)
        records = items_to_records(items, adapter, spec.task if spec else None, split)
        ref_plan = plan.benchmarks[reference.benchmark] if reference else None
        comparison = None
        if ref_plan is not None:
            comparison = "heldout" if adapter and adapter == ref_plan.adapter else "distribution"
        labels = list(methods)
        method_plans = {label: _with_reference(plan.methods[label], ref_plan, comparison) for label in labels}
        work: dict[str, tuple[Any, list[Record]]] = {}
        cached: dict[str, Any] = {}
        for label, mp in method_plans.items():
            work[f"{label}|items"] = (mp, records)
            if reference and mp.method.uses_reference:
                ref_key = (model, label, _params_key(mp), reference)
                with self._lock:
                    hit = self._references.get(ref_key)
                if hit is not None:
                    cached[label] = hit
                else:
                    work[f"{label}|reference"] = (mp, ref_rows)
        tables = self.score(plan, model, work, {f"{label}|reference": ref_failures for label in labels})
        out = []
        for label, mp in method_plans.items():
            own = tables[f"{label}|items"]
            ref_table = cached.get(label)
            if ref_table is None and f"{label}|reference" in tables:
                ref_table = tables[f"{label}|reference"]
                with self._lock:
                    self._references[(model, label, _params_key(mp), reference)] = ref_table
                    while len(self._references) > REFERENCE_CACHE:
                        self._references.popitem(last=False)
            verdict = reduce_table(mp, own, ref_table)
            out.append({
                "method": label, "method_name": mp.method_name, "family": mp.family,
                "comparison": comparison if ref_table is not None else None,
                "items": [_public_row(r) for r in own.to_dict(orient="records")],
                "verdict": {k: (_public_error(v) if k == "error" else v) for k, v in verdict.items()},
            })  # fmt: skip
        ref_info = None
        if reference is not None and ref_plan is not None:
            ref_info = {"benchmark": reference.benchmark, "adapter": ref_plan.adapter, "config": ref_plan.config,
                        "split": ref_plan.split, "rows": len(ref_rows), "failed_rows": len(ref_failures),
                        "partition": ref_rows[0].partition if ref_rows else None}
        return CheckResult(model=model, partition=records[0].partition if records else "", reference=ref_info,
                           methods=out)

    def _reference_rows(self, plan: Any, reference: ReferenceSpec) -> tuple[list[Record], list[dict]]:
        from contamray.pipeline.runner import load_benchmarks

        try:
            records, failures = load_benchmarks(plan, [reference.benchmark])
        except (FileNotFoundError, KeyError, ValueError) as err:
            raise ApiError(422, "reference_unavailable", f"reference {reference.benchmark!r}: {err}") from None
        return records[reference.benchmark], failures[reference.benchmark]

    def score(self, plan: Any, model: str, work: dict[str, tuple[Any, list[Record]]],
              failures: dict[str, list[dict]]) -> dict[str, Any]:
        """Per-example tables of every cell of ``work`` (cell key -> (MethodPlan, records)): the batch
        pipeline's stages (``pipeline.cells.run_stages``) on the hosted models, then its scoring."""
        from contamray.pipeline.cells import run_stages
        from contamray.pipeline.engine_pool import EnginePools

        with self._lock:
            if self._engines is None:  # held for the replica's life: each model loads once, shared with runs
                self._engines = EnginePools(plan.ray, plan.serve)
            engines = self._engines
        stages = run_stages(plan, model, work, engines, label="api check on")
        return score_cells(work, stages, failures)

    def close(self) -> None:
        with self._lock:
            if self._engines is not None:
                self._engines.close()
                self._engines = None


def compose_plan(overrides: list[str]) -> Any:
    """``build_plan`` of the run config composed with ``overrides``; a ConfigError is the client's 422."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from contamray.pipeline.plan import ConfigError, build_plan
    from contamray.validate.compose import compose_config, to_dict

    try:
        with _COMPOSE:
            cfg = compose_config(overrides, output_dir="api-check")
        return build_plan(to_dict(cfg))
    except ConfigError as err:
        raise ApiError(422, "invalid_config", str(err)) from None
    except (HydraException, OmegaConfBaseException) as err:
        raise ApiError(422, "invalid_config", str(err).splitlines()[0]) from None


def score_cells(work: dict[str, tuple[Any, list[Record]]], stages: Any,
                failures: dict[str, list[dict]]) -> dict[str, Any]:
    """The runner's scoring in process: ``ScoreWorker`` on the runner's chunks, then its per-example table."""
    from contamray.pipeline.actors import ScoreWorker, json_default
    from contamray.pipeline.cells import chunk_payloads, example_table

    worker = ScoreWorker({mp.label: (mp.method_name, mp.params) for mp, _ in work.values()})
    payloads = chunk_payloads(work, stages)
    batch = {
        "cell": [key for key, _ in payloads],
        "method": [work[key][0].label for key, _ in payloads],
        "payload": [json.dumps(p, default=json_default) for _, p in payloads],
    }
    scored = worker(batch) if payloads else {"cell": [], "rows": []}
    rows: dict[str, list[dict]] = {key: [] for key in work}
    for key, blob in zip(scored["cell"], scored["rows"]):
        rows[key].extend(json.loads(blob))
    return {
        key: example_table(key, rows[key], records, failures.get(key, []), error=stages.errors.get(key, ""))
        for key, (_, records) in work.items()
    }


def reduce_table(mp: Any, own: Any, reference: Any | None) -> dict[str, Any]:
    """The runner's reduce (``pipeline.cells.reduce_verdict``) on the items' table, with the reference rows
    appended as ``is_reference``."""
    import pandas as pd

    from contamray.pipeline.cells import reduce_verdict

    table = own
    if reference is not None:
        table = pd.concat([own.assign(is_reference=False), reference.assign(is_reference=True)], ignore_index=True)
    return reduce_verdict(mp.method_name, mp.label, mp.params, table)


def _with_reference(mp: Any, ref_plan: Any | None, comparison: str | None) -> Any:
    """``mp`` testing the items against ``ref_plan`` (``reference`` and ``mode`` set when the method has them)."""
    if ref_plan is None or not mp.method.uses_reference:
        return mp
    params = dict(mp.params, reference={ITEMS: ref_plan.name})
    if mp.method.has_param("mode"):
        params["mode"] = comparison
    return dataclasses.replace(mp, params=params)


def _params_key(mp: Any) -> str:
    return json.dumps({k: v for k, v in mp.params.items() if k not in ("reference", "mode")}, sort_keys=True,
                      default=str)


def _conf_adapter(benchmark: str) -> str:
    from pathlib import Path

    import yaml

    from contamray.experiments import CONF_DIR

    return str(yaml.safe_load((Path(CONF_DIR) / "benchmark" / f"{benchmark}.yaml").read_text())["adapter"])


def _public_error(error: Any) -> Any:
    """An error text without the traceback a scoring worker appends (``actors.ScoreWorker``)."""
    return error.split(" | Traceback", 1)[0] if isinstance(error, str) else error


def _public_row(row: dict[str, Any]) -> dict[str, Any]:
    row = {k: v for k, v in row.items() if k != "member" or v is not None}
    if "error" in row:
        row["error"] = _public_error(row["error"])
    return row


def jsonable(value: Any) -> Any:
    """``value`` with NumPy values as Python ones and NaN / infinity as None (strict JSON)."""
    import numpy as np

    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [jsonable(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
