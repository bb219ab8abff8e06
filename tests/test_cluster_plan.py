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


def test_llmsanitize_table1_plans_four_gpu_models_and_a_chat_api_for_guided_prompting_only(gpu_cluster):
    """The survey's Table 1 (``+exp=llmsanitize_table1``): four 7B models on vLLM, one GPU per replica, and
    GPT-3.5-turbo through a chat-only API. The chat API returns no prompt log-probabilities, so its sharded
    cells are skipped with that reason; guided prompting runs on all five. A dry run's reservation puts the
    vLLM replicas on the GPU nodes; the API model asks for no GPU."""
    plan = plan_of("+exp=llmsanitize_table1")
    assert list(plan.models) == ["llama2_7b", "qwen1_5_7b", "mistral_7b", "gemma_7b", "gpt35_turbo"]
    benchmarks = {"arc_challenge", "hellaswag", "mmlu", "truthfulqa_gen", "winogrande", "gsm8k"}
    assert set(plan.benchmarks) == benchmarks and all(b.limit == 100 for b in plan.benchmarks.values())
    cells = {(c.model, c.method) for c in plan.cells}
    for model in plan.models:
        assert all(sum(c.model == model and c.method == m for c in plan.cells) == 6 for m in ["guided_prompting"])
    assert ("gpt35_turbo", "sharded_likelihood_oren") not in cells
    assert ("llama2_7b", "sharded_likelihood_oren") in cells and ("gemma_7b", "sharded_likelihood") in cells
    skipped = [(c, r) for c, r in plan.skipped if c.model == "gpt35_turbo"]
    assert len(skipped) == 2 * 6 and all("openai_chat" in r and "prompt log-probabilities" in r for _, r in skipped)

    placements = {p.pool: p for p in reserve_engine_pools(plan, timeout_s=60)}
    for name in ["llama2_7b", "qwen1_5_7b", "mistral_7b", "gemma_7b"]:
        assert placements[name].backend == "vllm" and set(placements[name].nodes) <= gpu_cluster
    assert placements["gpt35_turbo"].backend == "http" and placements["gpt35_turbo"].num_gpus == 0
