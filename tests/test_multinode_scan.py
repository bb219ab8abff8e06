"""A corpus scan on three nodes with the match pool growing from one actor (issue #16, done-when).

On a ``ray.cluster_utils.Cluster``, 13-gram overlap and METEOR recall for 64 GSM8K rows scan six corpus files
(12 MB of pages of other GSM8K problems, three planted rows), first on the head node alone, then with two more
2-CPU nodes added. The second run starts the match pool at one actor (``ray.match_concurrency=1``) with
its ceiling at the cluster's CPUs (``ray.match_concurrency_max=null``, the default): the match pool
(``pipeline.match_pool``) must grow it, and the actors it adds land on the other nodes. Read back from Ray's
state API: the run's ``MatchWorker`` actors, more than one, on all three nodes; from the scan's log (each output
carries the node id of the actor that matched it): outputs matched on all three. The examples and verdicts must
be those of the single-node run, byte for byte for ``partitions.parquet``.

On a cluster with a GPU node, the embedding methods' matching runs in a stream of its own on actors holding a
share of a GPU (``ray.match_gpu_share``), the other methods' on CPU actors kept off the GPU node; the results
equal an all-CPU scan. The GPU here is Ray's resource only (torch sees no CUDA device, so those actors encode
on their node's CPU): what is tested is the placement; on a real GPU the same actors encode on ``cuda``.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pandas as pd
import pytest
import ray
from ray.util.state import list_actors

from contamray.benchmarks import load_records
from contamray.pipeline.placement import cpu_work_cpus
from contamray.pipeline.plan import build_plan
from contamray.pipeline.runner import load_benchmarks
from contamray.run import run
from tests.test_node_loss import config
from tests.test_worker_loss import tables, write_corpus

pytestmark = pytest.mark.slow

METHODS = "ngram13,meteor_recall"
PAGE = 60  # GSM8K problems per filler document (~32 KB)
DOCS = 60  # per file, six files: 12 MB


def match_actors() -> dict[str, str]:
    """Every ``MatchWorker`` actor Ray knows of (alive or dead): actor id -> node id."""
    actors = list_actors(detail=True, limit=10_000, raise_on_missing_output=False)
    return {a.actor_id: a.node_id for a in actors if "MatchWorker" in (a.class_name or "")}


def test_a_scan_on_three_nodes_grows_its_pool_from_one_and_equals_one_node(
    ray_cluster, tmp_path: Path, mirror_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = load_benchmarks(build_plan(config(Path("unused"), mirror_dir, mirror_dir)), ["gsm8k"])[0]["gsm8k"]
    seen = {r.id for r in rows}
    # near-domain filler: pages of 60 other GSM8K problems pass METEOR's n-gram prefilter for many examples and
    # cost it ~0.15 MB/s per actor on 2 AVX2-only cores (2026-11-27: the 12 MB took 40 s on the head's 2 actors,
    # 61 s on the three nodes' 6), far longer than a new match actor takes to start: the pool grows on any machine
    others = [f"{r.input} {r.label}" for r in load_records("gsm8k", mirror_dir=mirror_dir).records if r.id not in seen]
    filler = tuple(" ".join(others[i : i + PAGE]) for i in range(0, len(others) - PAGE + 1, PAGE))
    corpus = write_corpus(tmp_path / "corpus", rows, docs=DOCS, filler=filler)
    run(config(tmp_path / "one-node", corpus, mirror_dir, pool=(1, None), methods=METHODS))

    nodes = {ray_cluster.head_node.node_id} | {ray_cluster.add_node(num_cpus=2).node_id for _ in range(2)}
    ray_cluster.wait_for_nodes()
    before = set(match_actors())
    with caplog.at_level(logging.INFO, logger="contamray"):
        run(config(tmp_path / "three-nodes", corpus, mirror_dir, pool=(1, None), methods=METHODS))

    actors = {a: node for a, node in match_actors().items() if a not in before}
    assert len(actors) > 1, "the match pool did not grow from 1 actor"
    assert set(actors.values()) == nodes, actors
    (placed,) = re.findall(r"corpus pass 1/1: matched by (\d+) actor\(s\) on (\d+) node\(s\)", caplog.text)
    assert int(placed[0]) > 1 and int(placed[1]) == 3, placed

    assert (tmp_path / "one-node" / "partitions.parquet").read_bytes() == (
        tmp_path / "three-nodes" / "partitions.parquet"
    ).read_bytes()
    one, three = tables(tmp_path / "one-node")[0], tables(tmp_path / "three-nodes")[0]
    pd.testing.assert_frame_equal(one, three)
    ngram = three[three["method"] == "ngram13"]
    assert {r.id for r in rows[:3]} <= set(ngram.loc[ngram["contaminated"].astype(bool), "record_id"])


def test_embedding_matching_runs_on_gpu_actors_and_equals_cpu_matching(ray_cluster, tmp_path, mirror_dir) -> None:
    methods = "ngram13,platypus_embedding"
    rows = load_benchmarks(build_plan(config(Path("unused"), mirror_dir, mirror_dir)), ["gsm8k"])[0]["gsm8k"]
    corpus = write_corpus(tmp_path / "corpus", rows, docs=20)
    cpu = config(tmp_path / "cpu", corpus, mirror_dir, pool=(1, 2), methods=methods)
    cpu.ray.match_gpu_share = 0  # every method on CPU actors
    run(cpu)

    cpus = ray.cluster_resources()["CPU"]
    gpu_node = ray_cluster.add_node(num_cpus=2, num_gpus=1)
    ray_cluster.wait_for_nodes()
    assert cpu_work_cpus() == cpus  # the default match pool ceiling: the CPU actors' CPUs, not the GPU node's
    before = set(match_actors())
    run(config(tmp_path / "gpu", corpus, mirror_dir, pool=(1, 2), methods=methods))  # match_gpu_share: 0.25
    actors = list_actors(detail=True, limit=10_000, raise_on_missing_output=False)
    new = [a for a in actors if "MatchWorker" in (a.class_name or "") and a.actor_id not in before]
    on_gpu = [a for a in new if (a.required_resources or {}).get("GPU")]
    on_cpu = [a for a in new if not (a.required_resources or {}).get("GPU")]
    placed = [(a.node_id, a.required_resources) for a in new]
    assert on_gpu and {a.node_id for a in on_gpu} == {gpu_node.node_id}, placed
    assert all(a.required_resources["GPU"] == 0.25 for a in on_gpu)
    assert on_cpu and gpu_node.node_id not in {a.node_id for a in on_cpu}  # n-grams stay off the GPU node

    cpu_examples, cpu_partitions = tables(tmp_path / "cpu")
    gpu_examples, gpu_partitions = tables(tmp_path / "gpu")
    pd.testing.assert_frame_equal(cpu_examples, gpu_examples)
    pd.testing.assert_frame_equal(cpu_partitions, gpu_partitions)
    embedded = gpu_examples[gpu_examples["method"] == "platypus_embedding"]
    assert {r.id for r in rows[:3]} <= set(embedded.loc[embedded["contaminated"].astype(bool), "record_id"])
