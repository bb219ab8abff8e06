"""A worker node removed mid-scan (issue #17, item 1), on a two-node ``ray.cluster_utils.Cluster``.

An open-data run (13-gram overlap and GPT-4 substrings for 64 GSM8K rows, six corpus files of 2.3 MB with
three planted rows, small match batches, two match actors) starts; as soon as a match actor runs a task on the
worker node (a child process of that node's raylet titled ``ray::FileMatchWorker.scan``), that node is removed
(its raylet and every worker on it stop, as when a machine is lost). Until then the head node's CPUs are held by a
placeholder actor, so the match actors start on the worker node whatever the machine's load (without it, the head's
actor could finish the six files before the worker node's had started, and no task would run there); the
placeholder is killed as the node is removed, and Ray restarts the lost actors on the head node and retries their
tasks. The run must finish with the same
``examples.parquet`` (wall-clock aside) and ``partitions.parquet`` as an undisturbed run on the same cluster.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import ray
from ray._private import ray_constants
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from contamray.pipeline.plan import build_plan
from contamray.pipeline.runner import load_benchmarks
from contamray.run import run
from tests.test_config import composed
from tests.test_worker_loss import LONG_FILLER, busy_match_worker, tables, write_corpus

pytestmark = pytest.mark.slow

METHODS = "ngram13,gpt4_substring"  # with LONG_FILLER, ~0.2 s of matching per file: a node can be lost mid-task


@ray.remote
class HoldCpus:
    """Holds the CPUs it is created with (``options(num_cpus=...)``) until killed."""

    def ready(self) -> bool:
        return True


def config(
    out: Path, corpus: Path, mirror: Path, pool: tuple[int, int | None] = (2, 2), methods: str = "ngram13"
):
    """``methods`` (by default 13-gram overlap) for 64 GSM8K rows over ``corpus`` in one pass of 20-document match
    batches, the match pool autoscaling between ``pool`` (None: up to the cluster's CPUs)."""
    low, high = pool
    cfg = composed(
        "model=[]", "benchmark=[gsm8k]", "run.limit=64", f"method=[{methods}]", "corpus=files",
        f"corpus.paths=[{corpus}]", "corpus.id_field=id", "ray.corpus_batch_size=20",
        "ray.corpus_files_per_pass=6", f"ray.match_concurrency={low}",
        f"ray.match_concurrency_max={'null' if high is None else high}", f"data.mirror_dir={mirror}",
    )  # fmt: skip
    cfg.run.output_dir = str(out)
    return cfg


def test_a_worker_node_removed_mid_scan_changes_nothing(ray_cluster, tmp_path, mirror_dir):
    cluster = ray_cluster
    rows = load_benchmarks(build_plan(config(Path("unused"), mirror_dir, mirror_dir)), ["gsm8k"])[0]["gsm8k"]
    corpus = write_corpus(tmp_path / "corpus", rows, filler=LONG_FILLER)
    worker = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    run(config(tmp_path / "undisturbed", corpus, mirror_dir, methods=METHODS))
    raylet = worker.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid

    head = ray.get_runtime_context().get_node_id()
    placeholder = HoldCpus.options(
        num_cpus=2, scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)
    ).remote()
    ray.get(placeholder.ready.remote())  # the head's 2 CPUs are taken: the match actors start on the worker node
    removed: list[str] = []

    def remove_mid_scan() -> None:
        deadline = time.monotonic() + 300
        try:
            while time.monotonic() < deadline:
                if busy_match_worker(raylet) is not None:  # a match task running on the worker node
                    cluster.remove_node(worker)
                    removed.append(worker.node_id)
                    return
                time.sleep(0.005)
        finally:
            ray.kill(placeholder)  # the head's CPUs for the restarted actors (or, timed out, for the run to end)

    thread = threading.Thread(target=remove_mid_scan)
    thread.start()
    run(config(tmp_path / "disturbed", corpus, mirror_dir, methods=METHODS))
    thread.join()
    assert removed, "no match actor ran on the worker node"
    # no engine here: the open-data rows and verdicts are exact, so the tables are the same bytes
    assert (tmp_path / "undisturbed" / "partitions.parquet").read_bytes() == (
        tmp_path / "disturbed" / "partitions.parquet"
    ).read_bytes()
    before, after = tables(tmp_path / "undisturbed")[0], tables(tmp_path / "disturbed")[0]
    pd.testing.assert_frame_equal(before, after)
    flagged = after.assign(c=after["contaminated"].astype(bool)).groupby("method")["c"].sum().to_dict()
    assert flagged == {"ngram13": 3, "gpt4_substring": 3}, flagged  # the three planted rows, by both methods
