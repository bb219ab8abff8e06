"""Execute a Plan on Ray: engine actor pools, CPU scoring actors, corpus scans, reducers.

Closed-data cells of one model run together, stage by stage: every cell's requests of a stage go
through one Ray Data pass over that model's engine actor pool (``map_batches`` with
``ActorPoolStrategy``, ``num_gpus``/``num_cpus`` from the model's config), so the pool is shared by
all benchmarks and methods of the model. Open-data cells share one streaming pass over the corpus:
the benchmark indexes are ``ray.put`` once and every corpus batch is matched against all of them in
CPU actors. Engine outputs and corpus matches then go through CPU scoring actors (chunks of a cell),
and one Ray task per cell reduces its per-example table to a Verdict, stored as soon as it is done.
"""

from __future__ import annotations

import json
import logging
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import ray

from contamray.methods.base import Output, Request
from contamray.pipeline.actors import EngineWorker, MatchWorker, ScoreWorker
from contamray.pipeline.plan import Cell, ModelPlan, Plan
from contamray.pipeline.store import ResultStore
from contamray.records import Record

log = logging.getLogger("contamray")
SCORE_CHUNK = 64  # examples per scoring task: small enough to spread, large enough to amortise


@dataclass
class RunResult:
    output_dir: Path
    examples: pd.DataFrame
    partitions: pd.DataFrame
    reused: list[str]
    computed: list[str]


def execute(plan: Plan, output_dir: str | Path, force: bool = False) -> RunResult:
    """Run every cell of ``plan`` not already finished in ``output_dir`` and merge the results."""
    store = ResultStore(output_dir)
    todo = [c for c in plan.cells if force or not store.has(plan.cell_hash(c))]
    reused = [c.key for c in plan.cells if c not in todo]
    for key in reused:
        log.info("reusing finished cell %s", key)
    if todo:
        records, failures = load_benchmarks(plan, {c.benchmark for c in todo})
        closed = [c for c in todo if c.family == "closed"]
        opened = [c for c in todo if c.family == "open"]
        if closed:
            _run_closed(plan, closed, records, failures, store)
        if opened:
            _run_open(plan, opened, records, failures, store, Path(output_dir))
    frames, verdicts = [], []
    for cell in plan.cells:
        examples, verdict = store.load(cell, plan.cell_hash(cell))
        frames.append(examples)
        verdicts.append(verdict)
    store.write_run(frames, verdicts)
    return RunResult(
        output_dir=Path(output_dir),
        examples=pd.read_parquet(Path(output_dir) / "examples.parquet"),
        partitions=pd.DataFrame(verdicts),
        reused=reused,
        computed=[c.key for c in todo],
    )


def load_benchmarks(plan: Plan, names: set[str]) -> tuple[dict[str, list[Record]], dict[str, list[dict]]]:
    """Load the rows of each benchmark once; bad rows become failure rows (or stop when strict)."""
    from contamray.benchmarks import load_records

    records: dict[str, list[Record]] = {}
    failures: dict[str, list[dict]] = {}
    for name in sorted(names):
        b = plan.benchmarks[name]
        result = load_records(
            b.adapter,
            split=b.split,
            config=b.config,
            n=b.limit,
            seed=plan.seed,
            mirror_dir=plan.data.get("mirror_dir"),
            strict=bool(plan.data.get("strict", False)),
        )
        records[name] = list(result.records)
        failures[name] = [_failure_row(f) for f in result.failures]
        for f in failures[name]:
            log.warning("benchmark %s: row %s failed: %s", name, f["record_id"], f["error"])
        log.info("benchmark %s: %d rows, %d failed", name, len(records[name]), len(failures[name]))
    return records, failures


def _failure_row(failure: Any) -> dict[str, Any]:
    row_id = getattr(failure, "row_id", None) or f"{failure.partition}#{failure.row_index}"
    return {"record_id": str(row_id), "partition": failure.partition, "error": str(failure.message)}


# ---------------------------------------------------------------------------------------------
# closed-data: engine passes per model and stage


def _run_closed(
    plan: Plan,
    cells: list[Cell],
    records: dict[str, list[Record]],
    failures: dict[str, list[dict]],
    store: ResultStore,
) -> None:
    for model_name in plan.models:
        model_cells = [c for c in cells if c.model == model_name]
        if not model_cells:
            continue
        outputs: dict[str, dict[str, Output]] = {c.key: {} for c in model_cells}
        request_records: dict[str, dict[str, tuple[str, ...]]] = {c.key: {} for c in model_cells}
        active = list(model_cells)
        cell_errors: dict[str, str] = {}
        stage = 0
        while active:
            by_pool: dict[str, list[tuple[str, Request]]] = defaultdict(list)
            still_active = []
            for cell in active:
                mp = plan.methods[cell.method]
                try:
                    reqs = mp.method.requests(records[cell.benchmark], mp.config(), stage, outputs[cell.key])
                except Exception as err:  # noqa: BLE001 - the cell fails, the run goes on
                    cell_errors[cell.key] = f"requests failed at stage {stage}: {type(err).__name__}: {err}"
                    log.error("cell %s: %s", cell.key, cell_errors[cell.key])
                    continue
                if reqs:
                    still_active.append(cell)
                    for req in reqs:
                        request_records[cell.key][req.key] = req.record_ids
                        by_pool[_pool_for(plan, model_name, req.engine).name].append((cell.key, req))
            for pool_name, items in by_pool.items():
                pool = plan.judge if plan.judge is not None and pool_name == plan.judge.name else plan.models[pool_name]
                log.info("model %s stage %d: %d requests on pool %s", model_name, stage, len(items), pool_name)
                for cell_key, out in run_engine_pass(pool, items, plan.ray):
                    outputs[cell_key][out.key] = out
            active = still_active
            stage += 1
        payloads = []
        for cell in model_cells:
            scope = plan.methods[cell.method].method.score_scope
            size = SCORE_CHUNK if scope == "example" else max(1, len(records[cell.benchmark]))
            for chunk in _chunks(records[cell.benchmark], size):
                ids = {r.id for r in chunk}
                outs = [
                    o.to_row() for key, o in outputs[cell.key].items() if ids & set(request_records[cell.key][key])
                ]
                payloads.append((cell, {"records": [r.to_row() for r in chunk], "outputs": outs}))
        _score_and_reduce(plan, model_cells, payloads, failures, store, cell_errors)


def _pool_for(plan: Plan, model_name: str, role: str) -> ModelPlan:
    if role == "judge" and plan.judge is not None:
        return plan.judge
    return plan.models[model_name]


def run_engine_pass(
    pool: ModelPlan, items: list[tuple[str, Request]], ray_cfg: dict[str, Any]
) -> list[tuple[str, Output]]:
    """One Ray Data pass of requests through an engine actor pool; returns (cell key, Output)."""
    rows = [{"cell": cell_key, "request": json.dumps(req.to_row())} for cell_key, req in items]
    ds = ray.data.from_items(rows).map_batches(
        EngineWorker,
        fn_constructor_kwargs={"engine_spec": dict(pool.engine)},
        **engine_pool_options(pool, ray_cfg),
    )
    return [(row["cell"], Output.from_row(json.loads(row["output"]))) for row in ds.iter_rows()]


def engine_pool_options(pool: ModelPlan, ray_cfg: dict[str, Any]) -> dict[str, Any]:
    """The ``map_batches`` options of a model's engine actor pool (resources from its config)."""
    return {
        "compute": ray.data.ActorPoolStrategy(size=pool.concurrency),
        "num_gpus": pool.num_gpus,
        "num_cpus": pool.num_cpus,
        "batch_size": int(ray_cfg.get("request_batch_size", 32)),
        "batch_format": "numpy",
    }


# ---------------------------------------------------------------------------------------------
# open-data: one streaming pass over the corpus for all cells


def _run_open(
    plan: Plan,
    cells: list[Cell],
    records: dict[str, list[Record]],
    failures: dict[str, list[dict]],
    store: ResultStore,
    output_dir: Path,
) -> None:
    from contamray.corpus import read_corpus
    from contamray.corpus.planted import prepare_corpus

    corpus = prepare_corpus(plan, records, output_dir)
    indexes = []
    for cell in cells:
        mp = plan.methods[cell.method]
        index = mp.method.build_index(records[cell.benchmark], mp.config())
        indexes.append((cell.key, mp.label, mp.method_name, mp.params, ray.put(index)))
    ds = read_corpus(
        corpus["paths"],
        format=corpus.get("format", "auto"),
        text_field=corpus.get("text_field", "text"),
        id_field=corpus.get("id_field"),
    )
    matched = ds.map_batches(
        MatchWorker,
        fn_constructor_kwargs={"indexes": indexes},
        compute=ray.data.ActorPoolStrategy(size=int(plan.ray.get("match_concurrency", 1))),
        batch_size=int(plan.ray.get("corpus_batch_size", 256)),
        batch_format="numpy",
        num_cpus=1,
    )
    matches: dict[str, list[dict]] = defaultdict(list)
    for batch in matched.iter_batches(batch_format="numpy", batch_size=4096):
        for cell_key, match in zip(batch["cell"], batch["match"]):
            matches[str(cell_key)].append(json.loads(match))
    payloads = []
    for cell in cells:
        by_record: dict[str, list[dict]] = defaultdict(list)
        for m in matches[cell.key]:
            by_record[str(m["record_id"])].append(m)
        for chunk in _chunks(records[cell.benchmark], SCORE_CHUNK):
            payloads.append(
                (cell, {"records": [r.to_row() for r in chunk], "matches": [m for r in chunk for m in by_record[r.id]]})
            )
    _score_and_reduce(plan, cells, payloads, failures, store, {})


# ---------------------------------------------------------------------------------------------
# scoring (CPU actors) and reducing (one task per cell)


def _score_and_reduce(
    plan: Plan,
    cells: list[Cell],
    payloads: list[tuple[Cell, dict[str, Any]]],
    failures: dict[str, list[dict]],
    store: ResultStore,
    cell_errors: dict[str, str],
) -> None:
    rows_by_cell: dict[str, list[dict]] = defaultdict(list)
    if payloads:
        items = [
            {"cell": cell.key, "method": cell.method, "payload": json.dumps(p, default=str)}
            for cell, p in payloads
        ]
        methods = {label: (mp.method_name, mp.params) for label, mp in plan.methods.items()}
        scored = ray.data.from_items(items).map_batches(
            ScoreWorker,
            fn_constructor_kwargs={"methods": methods},
            compute=ray.data.ActorPoolStrategy(size=int(plan.ray.get("scoring_concurrency", 1))),
            batch_size=1,
            batch_format="numpy",
            num_cpus=1,
        )
        for row in scored.iter_rows():
            rows_by_cell[str(row["cell"])].extend(json.loads(row["rows"]))
    pending = {}
    for cell in cells:
        rows = rows_by_cell[cell.key] + [dict(f) for f in failures.get(cell.benchmark, [])]
        if cell.key in cell_errors:
            rows = [dict(r, error=r.get("error") or cell_errors[cell.key]) for r in rows]
        table = pd.DataFrame(rows)
        if "error" not in table.columns:
            table["error"] = ""
        table["error"] = table["error"].fillna("")
        mp = plan.methods[cell.method]
        pending[cell.key] = (cell, table, _reduce_cell.remote(mp.method_name, mp.label, mp.params, table))
    for cell, table, ref in pending.values():
        verdict = ray.get(ref)
        store.put(cell, plan.cell_hash(cell), table, verdict)
        log.info(
            "cell %s: contaminated=%s p=%s rate=%s (%d examples, %d failed)",
            cell.key, verdict.get("contaminated"), verdict.get("p_value"), verdict.get("rate"),
            verdict.get("n_examples", 0), verdict.get("n_failed", 0),
        )


@ray.remote(num_cpus=1)
def _reduce_cell(method_name: str, label: str, params: dict[str, Any], table: pd.DataFrame) -> dict[str, Any]:
    from contamray.methods.base import get_method

    method = get_method(method_name)
    cfg = method.make_config(params, where=f"methods.{label}")
    partition = str(table["partition"].iloc[0]) if "partition" in table.columns and len(table) else ""
    try:
        verdict = method.reduce(table, cfg).to_row()
        verdict["error"] = ""
    except Exception as err:  # noqa: BLE001 - a cell that cannot be reduced is reported, not fatal
        n_failed = int((table["error"] != "").sum()) if len(table) else 0
        verdict = {
            "method": method_name, "partition": partition, "statistic": float("nan"), "contaminated": False,
            "p_value": None, "rate": None, "n_examples": len(table), "n_failed": n_failed, "details": {},
            "error": f"reduce failed: {type(err).__name__}: {err}",
        }
    verdict["method_name"] = method_name
    verdict["method"] = label
    return verdict


def _chunks(items: list[Record], size: int) -> list[list[Record]]:
    return [items[i : i + size] for i in range(0, len(items), size)] or [[]]


def seeded_random(seed: int, *parts: Any) -> random.Random:
    """A Random derived from the run seed and names, so each use is independent and reproducible."""
    return random.Random(f"{seed}|" + "|".join(map(str, parts)))
