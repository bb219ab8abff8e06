"""Check, without loading any model, where a plan's engine actor pools would run on the cluster.

``reserve_engine_pools`` asks Ray for a placement group per pool with one bundle per engine actor
(``{"GPU": num_gpus, "CPU": num_cpus}``), waits until the cluster can host it, reports the nodes the
bundles landed on and releases them. A dry run (``run.dry_run=true``) prints this, so a sweep on a
GPU cluster is known to fit before a 7B model is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    bundle = {"CPU": pool.num_cpus}
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
