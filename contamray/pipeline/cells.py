"""One cell's steps between the plan and its verdict, shared by batch runs (``runner``) and on-demand
checks (``contamray.serve.check``), so both compute the same numbers the same way:

- ``run_stages``: a model's cells, stage after stage - each stage's requests of every cell sent at once
  to the hosted models (``EnginePools``), until no method asks for more;
- ``chunk_payloads``: each cell's records and engine outputs cut into scoring chunks (``SCORE_CHUNK``
  examples, or the whole cell for methods scored per partition);
- ``example_table``: a cell's scored rows, failed rows and costs as its per-example table;
- ``reduce_verdict``: the table (with reference rows) as the cell's verdict row;
- ``yardstick_verdict``: the verdict row of a partition that is only another partition's reference;
- ``EngineCosts``: what each example cost the engines.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from contamray.engines.wire import Output, Request
from contamray.methods.base import ERROR, NOT_APPLICABLE, get_method
from contamray.pipeline.engine_pool import EnginePools
from contamray.pipeline.plan import MethodPlan, ModelPlan, Plan
from contamray.records import Record

log = logging.getLogger("contamray")

SCORE_CHUNK = 64  # examples per scoring task: small enough to spread, large enough to amortise

Work = Mapping[str, tuple[MethodPlan, list[Record]]]  # cell key -> (its method, its records)


@dataclass
class Stages:
    """What a model's stages gave each cell: outputs by request key, the records each request stands
    for, and the cells that failed to make requests (with why)."""

    outputs: dict[str, dict[str, Output]] = field(default_factory=dict)
    request_records: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def run_stages(
    plan: Plan,
    model: str,
    work: Work,
    engines: EnginePools,
    target: ModelPlan | None = None,
    costs: EngineCosts | None = None,
    label: str = "model",
) -> Stages:
    """Every cell of ``work`` (all of target ``model``) through its method's request stages.

    Stage ``k`` asks each cell's method for requests given the outputs so far; all of a stage's requests
    of one engine role (target, judge, reference model) go to that model at once (identical requests
    shared, ``EnginePool.answer``). A cell whose ``requests`` raises is recorded in ``errors`` and the
    others go on. ``target`` stands for the plan's model ``model`` (an injected model, fine-tuned first).
    """
    done = Stages(
        outputs={key: {} for key in work}, request_records={key: {} for key in work}, errors={}
    )
    active, stage = list(work), 0
    while active:
        by_pool: dict[str, list[tuple[str, Request]]] = defaultdict(list)
        pools: dict[str, ModelPlan] = {}
        still_active = []
        for key in active:
            mp, records = work[key]
            try:
                reqs = mp.method.requests(records, mp.config(), stage, done.outputs[key])
            except Exception as err:  # noqa: BLE001 - the cell fails, the rest goes on
                done.errors[key] = f"requests failed at stage {stage}: {type(err).__name__}: {err}"
                log.error("cell %s: %s", key, done.errors[key])
                continue
            if reqs:
                still_active.append(key)
            for req in reqs:
                done.request_records[key][req.key] = req.record_ids
                pool = plan.pool_for_role(req.engine, model)
                pool = target if target is not None and pool.name == model else pool
                pools[pool.name] = pool
                by_pool[pool.name].append((key, req))
        for answered, seconds in _ask_pools(engines, pools, by_pool, f"{label} {model} stage {stage}"):
            if costs is not None:
                costs.add_pass(answered, done.request_records, seconds)
            for key, out, _ in answered:
                done.outputs[key][out.key] = out
        active = still_active
        stage += 1
    return done


def _ask_pools(
    engines: EnginePools, pools: dict[str, ModelPlan], by_pool: dict[str, list[tuple[str, Request]]], where: str
) -> list[tuple[list[tuple[str, Output, int]], float]]:
    """One stage's requests on each model it asks (answers and seconds per model, in ``by_pool``'s order).

    The models of a stage (a target and its reference model, two targets' shared judge ...) answer at once when
    the cluster has room for all of them (``EnginePools.room_for``: those not up fit its free resources), each
    on its own replicas: the stage takes its slowest model's time, and a model not up yet loads while the others
    answer. Otherwise one after the other, as a cluster that hosts one model at a time needs (a model waiting
    for resources a busy one holds would wait for the whole stage). Every model's part ends before an error of
    one is raised (the answers of the others are kept, ``EnginePool.answer``)."""

    def ask(name: str) -> tuple[list[tuple[str, Output, int]], float]:
        items = by_pool[name]
        log.info("%s: %d requests on model %s", where, len(items), name)
        started = time.perf_counter()
        answered = engines.get(pools[name]).answer(items, label=f"{where} on {name}")
        return answered, time.perf_counter() - started

    names = list(by_pool)
    if len(names) < 2 or not engines.room_for([pools[n] for n in names]):
        return [ask(n) for n in names]
    log.info("%s: models %s answer side by side", where, ", ".join(names))
    with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="stage") as pool:
        futures = [pool.submit(ask, n) for n in names]
        wait(futures)
    return [f.result() for f in futures]  # the first error, once every model's part has ended


def chunk_payloads(work: Work, stages: Stages) -> list[tuple[str, dict[str, Any]]]:
    """(cell key, scoring payload) per chunk of each cell: its records and the outputs that stand for them."""
    payloads = []
    for key, (mp, records) in work.items():
        size = SCORE_CHUNK if mp.method.score_scope == "example" else max(1, len(records))
        for chunk in chunks(records, size):
            ids = {r.id for r in chunk}
            outs = [
                o.to_row()
                for k, o in stages.outputs[key].items()
                if ids & set(stages.request_records[key][k])
            ]
            payloads.append((key, {"records": [r.to_row() for r in chunk], "outputs": outs}))
    return payloads


def example_table(
    key: str,
    rows: list[dict[str, Any]],
    records: list[Record],
    failures: list[dict[str, Any]],
    error: str = "",
    members: set[str] | None = None,
    costs: EngineCosts | None = None,
) -> pd.DataFrame:
    """Cell ``key``'s per-example table: its scored rows plus its benchmark's failed rows, every row marked
    with the cell's ``error`` when it failed as a whole, membership truth and engine costs added."""
    rows = rows + [dict(f) for f in failures]
    if error:
        rows = [dict(r, error=r.get("error") or error) for r in rows]
    table = pd.DataFrame(rows)
    if "error" not in table.columns:
        table["error"] = ""
    table["error"] = table["error"].fillna("").astype(str)
    add_membership(table, records, members)
    if costs is not None and "record_id" in table.columns:
        costs.add_columns(key, table)
    return table


def add_membership(table: pd.DataFrame, records: list[Record], members: set[str] | None) -> None:
    """Per-example membership truth as a ``member`` column: the rows an injected model trained on
    (``members``), else the records' own ``meta["member"]`` when a dataset declares it."""
    if "record_id" not in table.columns:
        return
    if members is not None:
        table["member"] = table["record_id"].isin(members)
        return
    declared = {r.id: r.meta["member"] for r in records if "member" in r.meta}
    if declared:
        table["member"] = table["record_id"].map(lambda rid: declared.get(rid))


def reduce_verdict(method_name: str, label: str, params: dict[str, Any], table: pd.DataFrame) -> dict[str, Any]:
    """The verdict row of one cell from its table (reference rows marked ``is_reference``): the method's
    ``reduce`` then ``settle``; a reduce that raises is reported as the cell's error, not raised."""
    method = get_method(method_name)
    cfg = method.make_config(params, where=f"methods.{label}")
    own = table[~table["is_reference"].astype(bool)] if "is_reference" in table.columns else table
    names = own["partition"].dropna() if "partition" in own.columns else pd.Series(dtype=str)
    partition = str(names.iloc[0]) if len(names) else ""
    try:
        verdict = method.settle(method.reduce(table, cfg), cfg).to_row()
        verdict["error"] = ""
    except Exception as err:  # noqa: BLE001 - a cell that cannot be reduced is reported, not fatal
        n_failed = int((own["error"] != "").sum()) if len(own) else 0
        verdict = {
            "method": method_name,
            "partition": partition,
            "statistic": float("nan"),
            "contaminated": False,
            "p_value": None,
            "rate": None,
            "n_examples": len(own),
            "n_failed": n_failed,
            "details": {},
            "decision": ERROR,
            "reason": "",
            "error": f"reduce failed: {type(err).__name__}: {err}",
        }
    verdict["method_name"] = method_name
    verdict["method"] = label
    return verdict


def yardstick_verdict(verdict: dict[str, Any], label: str, served: list[str]) -> dict[str, Any]:
    """``verdict`` of a partition that is the held-out reference of the benchmark keys ``served`` for method
    ``label`` and has no reference of its own: not tested (``not_applicable``) and said so - its rows are the
    yardstick those partitions are compared with (assumed unseen), not a question the method answers. Its
    scores, counts and errors stay; a reduce that failed stays an error."""
    if verdict.get("decision") == ERROR:
        return verdict
    keys = ", ".join(served)
    why = (
        f"not tested: the held-out reference of {keys} for {label} - its rows are the yardstick "
        f"{'that partition is' if len(served) == 1 else 'those partitions are'} compared with, assumed unseen; to "
        f"test it too, map its key to a held-out of its own in methods.{label}.reference"
    )
    details = dict(verdict.get("details") or {})
    rows = verdict.get("n_examples", 0)
    details["summary"] = f"{label}: {rows} scored rows, the held-out reference of {keys} -> not tested"
    details["reference_of"] = list(served)
    return {**verdict, "decision": NOT_APPLICABLE, "contaminated": False, "p_value": None, "reason": why,
            "details": details}  # fmt: skip


def chunks(items: list[Record], size: int) -> list[list[Record]]:
    return [items[i : i + size] for i in range(0, len(items), size)] or [[]]


class EngineCosts:
    """What each example cost: engine tokens processed and a share of the compute seconds.

    A request's tokens (scored tokens, or prompt + completion for a generation) are split evenly among
    the records it serves; a pass's wall time among its requests in proportion to their tokens. An
    open-data cell's own work (building its benchmark index, its method's ``match`` over every corpus
    batch, summed over the workers) is shared evenly by its examples (``add_shared``); the corpus
    reading all cells share is not counted. Stored per example (``engine_tokens``,
    ``engine_seconds``), summed per cell into the verdict (``engine_tokens``, ``seconds``).

    Also what the engine left out: ``truncated_tokens`` per example is the sum, over the requests that
    stand for it, of each request's ``Output.truncated`` (tokens of a text or prompt beyond the
    model's context). It is not split: a request for a whole shard that lost tokens marks every
    example of the shard with its full count (the engine does not know which examples lost them), so
    a cell's total is a sum over requests, not over these rows. 0 when everything was read.
    """

    def __init__(self) -> None:
        self.tokens: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.truncated: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def add_pass(
        self,
        answered: list[tuple[str, Output, int]],
        request_records: dict[str, dict[str, tuple[str, ...]]],
        seconds: float,
    ) -> None:
        """``answered``: (cell key, Output, how many requests of the pass it answered - ``Dedup.expand``);
        an answer shared by k requests charges each a k-th of its tokens and seconds."""
        total = sum(max(out.num_tokens, 1) / shares for _, out, shares in answered) or 1
        for cell_key, out, shares in answered:
            ids = request_records.get(cell_key, {}).get(out.key) or ()
            for rid in ids:
                self.tokens[cell_key][rid] += out.num_tokens / shares / len(ids)
                self.seconds[cell_key][rid] += seconds * max(out.num_tokens, 1) / shares / total / len(ids)
                self.truncated[cell_key][rid] += int(out.truncated)

    def add_shared(self, cell_key: str, record_ids: list[str], seconds: float) -> None:
        """``seconds`` of work done for the whole cell, split evenly among its examples."""
        for rid in record_ids:
            self.seconds[cell_key][rid] += seconds / len(record_ids)

    def add_columns(self, cell_key: str, table: pd.DataFrame) -> None:
        tokens, seconds = self.tokens.get(cell_key, {}), self.seconds.get(cell_key, {})
        table["engine_tokens"] = table["record_id"].map(lambda rid: tokens.get(str(rid), 0.0)).astype(float)
        table["engine_seconds"] = table["record_id"].map(lambda rid: seconds.get(str(rid), 0.0)).astype(float)
        truncated = self.truncated.get(cell_key, {})
        table["truncated_tokens"] = table["record_id"].map(lambda rid: truncated.get(str(rid), 0)).astype("int64")
