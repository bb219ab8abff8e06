"""llama2_openllm on a fake multi-node cluster: vLLM engine actors land on GPU nodes, no model loaded.

The cluster is real Ray (``ray.cluster_utils.Cluster``: a CPU-only head and two worker nodes that each
advertise one logical GPU). The engine pool is reserved through placement groups, and the exact
actor options the runner gives its engine actors are used for a probe class in place of the engine,
which reports where Ray put it.
"""

from __future__ import annotations

import pytest
import ray
from ray.cluster_utils import Cluster

from contamray.pipeline.placement import reserve_engine_pools
from contamray.serve.hosting import replica_options
from tests.test_config import plan_of


@pytest.fixture(scope="module")
def gpu_cluster():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0})
    gpu_nodes = [cluster.add_node(num_cpus=1, num_gpus=1) for _ in range(2)]
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    yield {n.node_id for n in gpu_nodes}
    ray.shutdown()
    cluster.shutdown()


class WhereAmI:
    """Stands where a model's Serve replica stands (same actor options); reports its node and GPUs
    instead of loading."""

    def answer(self):
        return ray.get_runtime_context().get_node_id(), len(ray.get_gpu_ids())


def test_llama2_openllm_engine_pool_is_vllm_on_gpu_nodes(gpu_cluster):
    plan = plan_of("+exp=llama2_openllm")
    (pool,) = plan.engine_pools()
    assert pool.backend == "vllm" and pool.num_gpus == 1 and pool.concurrency == 2

    placements = reserve_engine_pools(plan, timeout_s=60)
    assert [p.pool for p in placements] == ["llama2_7b"]
    assert set(placements[0].nodes) <= gpu_cluster and len(placements[0].nodes) == 2

    options = replica_options(pool)
    assert options["num_gpus"] == 1
    probes = [ray.remote(WhereAmI).options(**options).remote() for _ in range(pool.concurrency)]
    placed = ray.get([probe.answer.remote() for probe in probes])
    assert {node for node, _ in placed} == gpu_cluster  # one actor per GPU node
    assert all(gpus == 1 for _, gpus in placed)
