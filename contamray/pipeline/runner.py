"""Execute a Plan on Ray: engine actor pools, CPU scoring actors, corpus scans, reducers.

Two phases, each stored as it finishes so an interrupted run loses nothing it computed:

1. **Score.** Closed-data cells of one model run together, stage by stage: every cell's requests of
   a stage go to the model's Serve deployment (``contamray.serve.hosting``; ``num_gpus``/``num_cpus``
   and ``concurrency`` replicas from the model's config), loaded once for the run and shared by all
   benchmarks and methods of the model, and by every target that uses it as judge or reference
   model; target models run concurrently.
   Open-data cells share one streaming pass over the corpus: the benchmark indexes are ``ray.put``
   once and every corpus batch is matched against all of them in CPU actors. Engine outputs and
   corpus matches go through CPU scoring actors (chunks of a cell); each cell's per-example table is
   stored (``cells/<hash>/examples.parquet``).
2. **Reduce.** One Ray task per cell turns its table — plus the rows of the cells it depends on (a
   reference partition, an open-data method's contamination labels) — into a Verdict, stored
   (``verdict.json``). A cell with a verdict is finished and reused by the next run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import ray

from contamray.artifacts import artifacts_root
from contamray.corpus.coverage import CorpusCoverage, coverage_of, with_coverage
from contamray.corpus.fingerprint import corpus_fingerprint
from contamray.engines.wire import Output, Request
from contamray.interrupts import STOPPED, RunInterrupted
from contamray.methods.base import NOT_APPLICABLE
from contamray.pipeline.actors import ScoreWorker, json_default
from contamray.pipeline.answers import AnswerJournal
from contamray.pipeline.cells import (
    SCORE_CHUNK,
    EngineCosts,
    chunk_payloads,
    chunks,
    example_table,
    reduce_verdict,
    run_stages,
    yardstick_verdict,
)
from contamray.pipeline.corpus_scan import scan_corpus
from contamray.pipeline.engine_pool import EnginePools
from contamray.pipeline.injections import Injections
from contamray.pipeline.placement import cpu_work_options
from contamray.pipeline.plan import Cell, ModelPlan, Plan, rows_digest
from contamray.pipeline.progress import Progress
from contamray.pipeline.store import CORPUS_ERRORS, ResultStore
from contamray.records import Record

log = logging.getLogger("contamray")
# One benchmark load at a time per process: concurrent multirun jobs share the driver, and `datasets`
# (its tqdm thread_map lock) fails when two threads load at once.
_LOADING = threading.Lock()


@dataclass
class RunResult:
    output_dir: Path
    examples: pd.DataFrame
    partitions: pd.DataFrame
    reused: list[str]
    computed: list[str]


def execute(
    plan: Plan,
    output_dir: str | Path,
    force: bool = False,
    cells_uri: str | None = None,
    artifacts_uri: str | None = None,
    earlier: Sequence[str] = (),
) -> RunResult:
    """Run every cell of ``plan`` not already finished and merge the results into ``output_dir``.

    Finished cells live under ``cells_uri`` (default ``output_dir/cells``; any fsspec URI); a cell finished under
    one of the ``earlier`` cells roots (earlier runs', newest first: ``output_root.earlier_cells``) is copied in and
    reused. Injected checkpoints and a planted corpus are published under the artifacts root
    (``contamray.artifacts``: ``artifacts_uri``, else ``<cells_uri>/artifacts`` for a URI) for workers on any node.
    """
    artifacts = artifacts_root(artifacts_uri, cells_uri)
    store = ResultStore(output_dir, cells_root=cells_uri)
    # the rows are read first: a cell is finished only for the same config *and* the same rows
    records, failures = load_benchmarks(plan, {c.benchmark for c in plan.cells})
    plan.row_digests = {name: rows_digest(records[name], failures[name]) for name in records}
    if any(c.family == "open" for c in plan.cells):  # likewise the same corpus files, not just paths
        plan.corpus_digest = corpus_fingerprint(plan.corpus, plan.row_digests)
    hashes = {c: plan.cell_hash(c) for c in plan.cells}
    answers = AnswerJournal(f"{store.cells_uri}/answers")  # what a run stopped mid-stage had been answered
    if force:
        for cell in plan.cells:
            store.discard(hashes[cell])
        answers.clear()
    elif earlier:
        adopted = store.adopt(list(hashes.values()), list(earlier))
        for root, n in Counter(adopted.values()).items():
            log.info("reusing %d cell(s) an earlier run of this name finished (%s; run.reuse_earlier=false computes "
                     "them again here)", n, root.rstrip("/").removesuffix("/cells"))  # fmt: skip
    store.track(list(hashes.values()))
    todo = [c for c in plan.cells if not store.has(hashes[c])]
    reused = [c.key for c in plan.cells if c not in todo]
    for key in reused:
        log.info("reusing finished cell %s", key)
    # every cell a reduce needs must be scored, even when it is only a dependency
    needed = {dep for c in todo for dep in plan.dependencies(c)} | set(todo)
    to_score = [c for c in plan.cells if c in needed and not store.has_examples(hashes[c])]
    for cell in todo:
        if cell not in to_score:
            log.info("reusing scored cell %s (its examples are stored; reducing it)", cell.key)
    injections = Injections(plan, lambda names: load_benchmarks(plan, names)[0], artifacts)
    try:
        if to_score:
            closed = [c for c in to_score if c.family == "closed"]
            opened = [c for c in to_score if c.family == "open"]
            with EnginePools(plan.ray, plan.serve, answers=answers) as engines:  # each model loads once for the run
                if opened:  # first: closed cells may depend on open ones, never the other way round
                    _score_open(plan, opened, records, failures, store, Path(output_dir), engines, injections,
                                artifacts)  # fmt: skip
                if closed:
                    _score_closed(plan, closed, records, failures, store, injections, engines)
        _reduce(plan, [c for c in todo if not store.has(hashes[c])], store, injections)
        answers.clear()  # every cell is stored: the batches a stopped run kept are no longer needed
    except (*STOPPED, RunInterrupted):  # Ctrl-C, SIGTERM (a sweep's job: stop_all): what is stored stays
        done, total = store.interrupted()
        log.warning(
            "interrupted: %d of %d cells finished and stored under %s, %d answered batches kept (a run on the same "
            "cells computes neither again)", done, total, store.cells_uri, answers.count(),
        )  # fmt: skip
        raise
    frames, verdicts = [], []
    for cell in plan.cells:
        examples, verdict = store.load(cell, hashes[cell])
        verdict = as_filed(plan, cell, verdict)  # a cell stored before references were filed as such
        frames.append(examples)
        verdicts.append(verdict)
    verdicts += [skipped_verdict(plan, cell, reason, records) for cell, reason in plan.skipped]
    store.write_run(frames, verdicts)
    store.finish()
    return RunResult(
        output_dir=Path(output_dir),
        examples=pd.read_parquet(Path(output_dir) / "examples.parquet"),
        partitions=pd.DataFrame(verdicts),
        reused=reused,
        computed=[c.key for c in todo],
    )


def load_benchmarks(plan: Plan, names: Iterable[str]) -> tuple[dict[str, list[Record]], dict[str, list[dict]]]:
    """Load the rows of each benchmark once; bad rows become failure rows (or stop when strict). Rows carry
    their key's partition id (``partition_ids``: two keys reading one split are two partitions)."""
    from contamray.benchmarks import load_records, partition_ids

    records: dict[str, list[Record]] = {}
    failures: dict[str, list[dict]] = {}
    ids = partition_ids(plan.benchmarks)
    for name in sorted(set(names)):
        b = plan.benchmarks[name]
        with _LOADING:
            result = load_records(
                b.adapter,
                split=b.split,
                config=b.config,
                n=b.limit,
                seed=plan.seed,
                mirror_dir=plan.data.get("mirror_dir"),
                strict=bool(plan.data.get("strict", False)),
                sample=b.sample,
                offset=b.offset,
            )
        records[name] = list(result.records)
        failures[name] = [_failure_row(f) for f in result.failures]
        if ids[name] != result.partition:  # another key reads the same split (``partition_ids``)
            records[name] = [dataclasses.replace(r, partition=ids[name]) for r in records[name]]
            failures[name] = [{**f, "partition": ids[name]} for f in failures[name]]
        for f in failures[name]:
            log.warning("benchmark %s: row %s failed: %s", name, f["record_id"], f["error"])
        log.info("benchmark %s: %d rows, %d failed", name, len(records[name]), len(failures[name]))
    return records, failures


def _failure_row(failure: Any) -> dict[str, Any]:
    row_id = getattr(failure, "row_id", None) or f"{failure.partition}#{failure.row_index}"
    return {"record_id": str(row_id), "partition": failure.partition, "error": str(failure.message)}


# ---------------------------------------------------------------------------------------------
# closed-data: engine passes per model and stage, models concurrently


def _score_closed(
    plan: Plan,
    cells: list[Cell],
    records: dict[str, list[Record]],
    failures: dict[str, list[dict]],
    store: ResultStore,
    injections: Injections,
    engines: EnginePools,
) -> None:
    models = [m for m in plan.models if any(c.model == m for c in cells)]
    with ThreadPoolExecutor(max_workers=max(1, len(models)), thread_name_prefix="model") as pool:
        futures = [
            pool.submit(
                _score_closed_model,
                plan, m, [c for c in cells if c.model == m], records, failures, store, injections, engines,
            )  # fmt: skip
            for m in models
        ]
        try:
            for future in futures:
                future.result()
        except STOPPED:  # Ctrl-C, SIGTERM: every model's stage stops (``EnginePools.stop``), keeping its answers
            engines.stop()
            raise


def _score_closed_model(
    plan: Plan,
    model_name: str,
    cells: list[Cell],
    records: dict[str, list[Record]],
    failures: dict[str, list[dict]],
    store: ResultStore,
    injections: Injections,
    engines: EnginePools,
) -> None:
    # an injected model is fine-tuned here, once (cancelled by Ctrl-C: ``engines.stopping``)
    target = injections.engine_pool(model_name, engines.make_room, engines.stopping)
    costs = EngineCosts()
    work = {c.key: (plan.methods[c.method], records[c.benchmark]) for c in cells}
    # the run holds its models (``EnginePools``): a judge or reference model serves every target
    stages = run_stages(plan, model_name, work, engines, target=target, costs=costs)
    by_key = {c.key: c for c in cells}
    payloads = [(by_key[key], payload) for key, payload in chunk_payloads(work, stages)]
    engines.make_room(cpus=float(plan.ray.get("scoring_concurrency", 1)))  # idle models make way for the scorers
    _score_cells(plan, cells, payloads, records, failures, store, stages.errors, injections.members(model_name), costs)
    _reduce(plan, _ready_to_reduce(plan, cells, store), store, injections)


# ---------------------------------------------------------------------------------------------
# open-data: one streaming pass over the corpus for all cells

MAX_LOGGED_CORPUS_ERRORS = 20


def _score_open(
    plan: Plan,
    cells: list[Cell],
    records: dict[str, list[Record]],
    failures: dict[str, list[dict]],
    store: ResultStore,
    output_dir: Path,
    engines: EnginePools,
    injections: Injections,
    artifacts: str | None = None,
) -> None:
    """Scan the corpus for the open-data ``cells`` and store their scored rows, each with what the scan could not
    read (``corpus.coverage``: stored before the rows, so whichever run reduces the cell says it)."""
    from contamray.corpus.planted import prepare_corpus

    corpus = prepare_corpus(plan, records, output_dir, artifacts)
    scanned = scan_corpus(plan, cells, records, corpus, store)
    matches = scanned.matches
    _report_corpus_errors(scanned.errors, output_dir)
    coverage = coverage_of(scanned.errors, scanned.sizes).to_json()
    for cell in cells:
        store.put_coverage(plan.cell_hash(cell), coverage)
    costs = EngineCosts()
    for cell in cells:
        costs.add_shared(cell.key, [r.id for r in records[cell.benchmark]], scanned.seconds.get(cell.key, 0.0))
    judged = _judge_open_cells(plan, cells, records, matches, costs, engines, injections)
    payloads = []
    for cell in cells:
        by_record: dict[str, list[dict]] = defaultdict(list)
        for m in matches[cell.key]:
            by_record[str(m["record_id"])].append(m)
        scope = plan.methods[cell.method].method.score_scope
        size = SCORE_CHUNK if scope == "example" else max(1, len(records[cell.benchmark]))
        for chunk in chunks(records[cell.benchmark], size):
            payload: dict[str, Any] = {
                "records": [r.to_row() for r in chunk],
                "matches": [m for r in chunk for m in by_record[r.id]],
            }
            if cell.key in judged:
                payload["outputs"] = [o.to_row() for o in judged[cell.key]]
            payloads.append((cell, payload))
    _score_cells(plan, cells, payloads, records, failures, store, {}, costs=costs)


def _report_corpus_errors(errors: list[dict[str, str]], output_dir: Path) -> None:
    """Corpus rows the scan skipped, by path and line: logged here (the first few) and all written to
    ``corpus_errors.jsonl`` in the run's output directory."""
    path = output_dir / CORPUS_ERRORS
    if not errors:
        path.unlink(missing_ok=True)
        return
    errors = sorted(errors, key=lambda e: e["where"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in errors))
    for e in errors[:MAX_LOGGED_CORPUS_ERRORS]:
        log.warning("corpus: skipped %s: %s", e["where"], e["error"])
    log.warning(
        "corpus: %d bad row(s) skipped, the scan went on with the rest; all are listed in %s", len(errors), path
    )


def _judge_open_cells(
    plan: Plan,
    cells: list[Cell],
    records: dict[str, list[Record]],
    matches: dict[str, list[dict]],
    costs: EngineCosts,
    engines: EnginePools,
    injections: Injections,
) -> dict[str, list[Output]]:
    """Open-data methods with an LLM judge: their prompts about retrieved candidates, answered. With no
    ``judge`` configured the run's first model judges, as its closed-data stages host it (an injected
    model's fine-tuned checkpoint): one deployment of it serves both."""
    items: dict[str, list[tuple[str, Request]]] = defaultdict(list)
    request_records: dict[str, dict[str, tuple[str, ...]]] = defaultdict(dict)
    pools: dict[str, ModelPlan] = {}
    for cell in cells:
        mp = plan.methods[cell.method]
        if "judge" not in mp.roles():
            continue
        judge = plan.pool_for_role("judge", "")
        if judge.name in plan.models:  # the target itself judges
            judge = injections.engine_pool(judge.name, engines.make_room, engines.stopping)
        for req in mp.method.judge_requests(records[cell.benchmark], matches[cell.key], mp.config()):
            pools[judge.name] = judge
            items[judge.name].append((cell.key, req))
            request_records[cell.key][req.key] = req.record_ids
    judged: dict[str, list[Output]] = {c.key: [] for c in cells if "judge" in plan.methods[c.method].roles()}
    for pool_name, pool_items in items.items():
        log.info("judging %d open-data candidates on model %s", len(pool_items), pool_name)
        started = time.perf_counter()
        answered = engines.get(pools[pool_name]).answer(pool_items, label=f"open-data judge on {pool_name}")
        costs.add_pass(answered, request_records, time.perf_counter() - started)
        for cell_key, out, _ in answered:
            judged[cell_key].append(out)
    if items:
        engines.make_room(cpus=float(plan.ray.get("scoring_concurrency", 1)))  # idle models make way for the scorers
    return judged


# ---------------------------------------------------------------------------------------------
# scoring (CPU actors)


def _score_cells(
    plan: Plan,
    cells: list[Cell],
    payloads: list[tuple[Cell, dict[str, Any]]],
    records: dict[str, list[Record]],
    failures: dict[str, list[dict]],
    store: ResultStore,
    cell_errors: dict[str, str],
    members: set[str] | None = None,
    costs: EngineCosts | None = None,
) -> None:
    rows_by_cell: dict[str, list[dict]] = defaultdict(list)
    if payloads:
        items = [
            {"seq": seq, "cell": cell.key, "method": cell.method, "payload": json.dumps(p, default=json_default)}
            for seq, (cell, p) in enumerate(payloads)
        ]
        methods = {label: (mp.method_name, mp.params) for label, mp in plan.methods.items()}
        scored = ray.data.from_items(items).map_batches(
            ScoreWorker,
            fn_constructor_kwargs={"methods": methods},
            compute=ray.data.ActorPoolStrategy(size=int(plan.ray.get("scoring_concurrency", 1))),
            batch_size=1,
            batch_format="numpy",
            num_cpus=1,
            **cpu_work_options(),
        )
        chunks_done: list[tuple[int, str, list[dict]]] = []
        with Progress(f"scoring {_models_of(cells)}", len(items), unit="chunks") as progress:
            for row in scored.iter_rows():
                chunks_done.append((int(row["seq"]), str(row["cell"]), json.loads(row["rows"])))
                progress.update(1)
        # in payload order, whichever scoring actor finished first: the same tables for 1 or n actors
        for _, cell_key, rows in sorted(chunks_done, key=lambda c: c[0]):
            rows_by_cell[cell_key].extend(rows)
    for cell in cells:
        table = example_table(
            cell.key,
            rows_by_cell[cell.key],
            records.get(cell.benchmark, []),
            failures.get(cell.benchmark, []),
            error=cell_errors.get(cell.key, ""),
            members=members,
            costs=costs,
        )
        store.put_examples(cell, plan.cell_hash(cell), table)


def _models_of(cells: list[Cell]) -> str:
    """The models (or corpus) of ``cells``, for a progress label."""
    return ", ".join(sorted({c.model for c in cells}))


def _ready_to_reduce(plan: Plan, cells: list[Cell], store: ResultStore) -> list[Cell]:
    """Unreduced cells that ``cells`` just made reducible (scored, with every dependency scored)."""
    return [
        c
        for c in plan.cells
        if not store.has(plan.cell_hash(c))
        and store.has_examples(plan.cell_hash(c))
        and all(store.has_examples(plan.cell_hash(d)) for d in plan.dependencies(c))
        and (c in cells or any(d in cells for d in plan.dependencies(c)))
    ]


def cell_cost(examples: pd.DataFrame) -> dict[str, float]:
    """A cell's engine cost from its reduce input: its own examples, not the reference rows beside them
    (empty when the cell used no engine)."""
    if "engine_tokens" not in examples.columns:
        return {}
    if "is_reference" in examples.columns:
        examples = examples[~examples["is_reference"].fillna(False).astype(bool)]
    return {
        "engine_tokens": float(pd.to_numeric(examples["engine_tokens"], errors="coerce").sum()),
        "seconds": float(pd.to_numeric(examples["engine_seconds"], errors="coerce").sum()),
    }


# ---------------------------------------------------------------------------------------------
# reducing (one task per cell, with the rows of the cells it depends on)


def _reduce(plan: Plan, cells: list[Cell], store: ResultStore, injections: Injections | None = None) -> None:
    """Reduce ``cells`` to verdicts and store them. An open-data verdict says what the corpus scan that scored it
    could not read, undecided when that may hold its rows (``corpus.coverage.with_coverage``), and keeps saying it
    when its cell is reused."""
    pending = []
    reduce_task = ray.remote(num_cpus=1)(reduce_verdict).options(**cpu_work_options())
    for cell in cells:
        table = reduce_input(plan, cell, store)
        mp = plan.methods[cell.method]
        own = table[~table["is_reference"].astype(bool)] if "is_reference" in table.columns else table
        ids = list(own["record_id"].astype(str)) if "record_id" in own.columns else []
        pending.append((cell, cell_cost(table), ids, reduce_task.remote(mp.method_name, mp.label, mp.params, table)))
    if not pending:
        return
    progress = Progress(f"reducing {_models_of(cells)}", len(pending), unit="cells")
    for cell, cost, ids, ref in pending:
        verdict = ray.get(ref)
        progress.update(1)
        verdict = as_filed(plan, cell, verdict)
        verdict.update(cost)
        verdict = _with_scan_coverage(plan, cell, verdict, store)
        if injections is not None and cell.family == "closed":
            truth = injections.truth(cell.model, ids)  # the cell's own rows: was the model trained on any?
            if truth is not None:
                verdict["truth"] = truth
        store.put_verdict(cell, plan.cell_hash(cell), verdict)
        log.info(
            "cell %s: decision=%s p=%s rate=%s (%d examples, %d failed)%s%s",
            cell.key,
            verdict.get("decision"),
            verdict.get("p_value"),
            verdict.get("rate"),
            verdict.get("n_examples", 0),
            verdict.get("n_failed", 0),
            f" ERROR {verdict['error']}" if verdict.get("error") else "",
            f" ({verdict['reason']})" if verdict.get("reason") else "",
        )
    progress.close()


def _with_scan_coverage(plan: Plan, cell: Cell, verdict: dict[str, Any], store: ResultStore) -> dict[str, Any]:
    """``verdict`` with what the corpus scan behind it could not read (``corpus.coverage``): an open-data cell's own
    scan, deciding; the scan that labelled a closed-data cell's rows (``Method.contamination_source``), stated."""
    if cell.family == "open":
        source, max_unread = cell, plan.max_unread
    else:
        mp = plan.methods[cell.method]
        label = mp.method.contamination_source(mp.config())
        if not label:
            return verdict
        source, max_unread = Cell(plan.corpus_label, cell.benchmark, label, "open"), None
    stored = store.get_coverage(plan.cell_hash(source))
    return with_coverage(verdict, CorpusCoverage.from_json(stored) if stored is not None else None, max_unread)


def as_filed(plan: Plan, cell: Cell, verdict: dict[str, Any]) -> dict[str, Any]:
    """``verdict`` as the run files it: a partition that is only the held-out reference of others for the cell's
    method is not tested (``cells.yardstick_verdict``); any other verdict as the method gave it."""
    mp = plan.methods[cell.method]
    served = mp.method.served_as_reference(mp.config(), cell.benchmark, plan.benchmarks)
    return yardstick_verdict(verdict, mp.label, served) if served else verdict


def reduce_input(plan: Plan, cell: Cell, store: ResultStore) -> pd.DataFrame:
    """The table a cell's reduce sees: its own rows, reference rows, merged contamination labels."""
    own = store.load_examples(plan.cell_hash(cell))
    mp = plan.methods[cell.method]
    cfg = mp.config()
    ref = mp.method.reference_benchmark(cfg, cell.benchmark)
    if ref:
        reference = store.load_examples(plan.cell_hash(Cell(cell.model, ref, cell.method, cell.family)))
        own = pd.concat([own.assign(is_reference=False), reference.assign(is_reference=True)], ignore_index=True)
    source = mp.method.contamination_source(cfg)
    if source:
        labels = store.load_examples(plan.cell_hash(Cell(plan.corpus_label, cell.benchmark, source, "open")))
        keep = [c for c in ("record_id", "contaminated", "contamination_type", "error") if c in labels.columns]
        # the scan's own error on a row, so that a row it failed on is not read as "clean"
        labels = labels[keep].drop_duplicates("record_id").rename(columns={"error": "contamination_error"})
        merged = [c for c in labels.columns if c != "record_id"]
        own = own.drop(columns=[c for c in merged if c in own.columns]).merge(labels, on="record_id", how="left")
    return own


def skipped_verdict(plan: Plan, cell: Cell, reason: str, records: dict[str, list[Record]]) -> dict[str, Any]:
    """The row of a (model x benchmark x method) the plan skipped: present in every table, with the reason."""
    rows = records.get(cell.benchmark) or []
    mp = plan.methods[cell.method]
    return {
        "method": cell.method, "method_name": mp.method_name, "model": cell.model, "benchmark": cell.benchmark,
        "partition": rows[0].partition if rows else cell.benchmark, "statistic": float("nan"), "contaminated": False,
        "p_value": None, "rate": None, "n_examples": 0, "n_failed": 0, "details": {}, "decision": NOT_APPLICABLE,
        "reason": f"not applicable: {reason}", "error": "",
    }  # fmt: skip
