"""Where work runs on the cluster: engine pools on GPU nodes, CPU work off them when it can be.

``cpu_work_options`` keeps the CPU stages (corpus readers and matchers, scorers, reducers) on nodes
without GPUs whenever the cluster has such nodes with CPUs: a GPU node's CPUs are there to feed its
GPUs (vLLM's actors reserve some, and tokenisation, sampling and the next stage's engine start need
the rest). On a single node, or a cluster of GPU nodes only, nothing is constrained.

Check, without loading any model, where a plan's engine actor pools would run on the cluster:

``reserve_engine_pools`` asks Ray for a placement group per pool with one bundle per engine actor
(``{"GPU": num_gpus, "CPU": num_cpus}``), waits until the cluster can host it, reports the nodes the
bundles landed on and releases them. A dry run (``run.dry_run=true``) prints this, so a sweep on a
GPU cluster is known to fit before a 7B model is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

from contamray.pipeline.plan import ModelPlan, Plan


@dataclass
class PoolPlacement:
    pool: str
    backend: str
    num_gpus: float
    concurrency: int
    nodes: list[str]  # node id per engine actor


def pool_bundles(pool: ModelPlan) -> list[dict[str, float]]:
    bundle = {"CPU": pool.num_cpus, **pool.resources}
    if pool.num_gpus:
        bundle["GPU"] = pool.num_gpus
    return [dict(bundle) for _ in range(pool.concurrency)]


def reserve_engine_pools(plan: Plan, timeout_s: float = 60.0) -> list[PoolPlacement]:
    """Reserve and release each engine pool's resources; raises if the cluster cannot host one."""
    placements = []
    for pool in plan.engine_pools():
        pg = placement_group(pool_bundles(pool), strategy="SPREAD" if pool.num_gpus else "PACK")
        try:
            ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
            if not ready:
                raise RuntimeError(
                    f"models.{pool.name}: the cluster cannot host {pool.concurrency} engine actor(s) with "
                    f"num_gpus={pool.num_gpus}, num_cpus={pool.num_cpus} within {timeout_s:.0f}s; lower "
                    f"models.{pool.name}.concurrency or add GPU nodes (cluster resources: {ray.cluster_resources()})"
                )
            table = placement_group_table(pg)
            nodes = [table["bundles_to_node_id"][i] for i in range(pool.concurrency)]
            placements.append(PoolPlacement(pool.name, pool.backend, pool.num_gpus, pool.concurrency, nodes))
        finally:
            remove_placement_group(pg)
    return placements


def cpu_work_cpus() -> float:
    """The CPUs CPU work may use: those of CPU-only nodes when ``cpu_work_options`` keeps it off GPU nodes,
    else every CPU of the cluster."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    cpu_only = [n["Resources"].get("CPU", 0) for n in alive if not n.get("Resources", {}).get("GPU")]
    if cpu_work_options() and cpu_only:
        return float(sum(cpu_only))
    return float(ray.cluster_resources().get("CPU", 0))


def cpu_work_options() -> dict[str, Any]:
    """Ray options (``label_selector``) that keep a CPU actor or task off GPU nodes; ``{}`` when the
    cluster has no CPU-only node to put it on."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    gpu_nodes = [n["NodeID"] for n in alive if n.get("Resources", {}).get("GPU")]
    cpu_nodes = [n for n in alive if not n.get("Resources", {}).get("GPU") and n.get("Resources", {}).get("CPU")]
    if not gpu_nodes or not cpu_nodes:
        return {}
    return {"label_selector": {"ray.io/node-id": "!in(" + ",".join(gpu_nodes) + ")"}}
