"""A real run on a multi-node ``ray.cluster_utils.Cluster``: the model's Serve replica on the GPU node, scoring
actors on CPU nodes, one replica for both stages of the model. The GPU is logical (the node
advertises one; the engine computes on the CPU), which is exactly what Ray's scheduler sees on a real
cluster. Where each actor ran is read back from Ray's state API after the run.
"""

from __future__ import annotations

import pytest
import ray
from ray import serve
from ray.cluster_utils import Cluster
from ray.util.state import list_actors

from contamray.run import run
from tests.test_config import composed


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0})
    gpu_node = cluster.add_node(num_cpus=2, num_gpus=1)
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    yield gpu_node.node_id
    serve.shutdown()  # its deployments and the process's handles to them, with the cluster
    ray.shutdown()
    cluster.shutdown()


def test_engine_actors_on_gpu_nodes_scoring_actors_on_cpu_nodes(cluster, tmp_path, mirror_dir):
    gpu_node = cluster
    cfg = composed(
        "method=[guided_prompting]", "corpus=none", "benchmark=[arc_challenge]", "run.limit=4",
        f"data.mirror_dir={mirror_dir}", "models.smollm2_135m.num_gpus=1", "models.smollm2_135m.backend=hf",
        "methods.guided_prompting.max_tokens=8", "methods.guided_prompting.judge=true",
        "methods.guided_prompting.self_judge=true",
    )
    cfg.run.output_dir = str(tmp_path / "run")
    run(cfg)
    actors = list_actors(detail=True, limit=10_000, raise_on_missing_output=False)
    engine = [a for a in actors if (a.class_name or "").startswith("ServeReplica:contamray-")]
    scoring = [a for a in actors if "ScoreWorker" in (a.class_name or "") + (a.repr_name or "")]
    assert engine and scoring, [a.class_name for a in actors]
    assert {a.node_id for a in engine} == {gpu_node}
    # completions (stage 0) and judge prompts (stage 1, judged by the model itself) went to one Serve
    # replica: the model was loaded once, not once per stage
    assert len(engine) == 1, [(a.class_name, a.state) for a in engine]
    assert gpu_node not in {a.node_id for a in scoring}


def test_a_ray_job_on_several_nodes_refuses_to_write_to_the_drivers_node_only(cluster, tmp_path, monkeypatch):
    """Issue 17 item 6: as the driver of a Ray Job (the job supervisor's environment variable) with no
    ``run.output_root``, a run on this two-node cluster stops before any work, naming the key to set; with
    a root set, it goes on; outside a Ray Job nothing is checked."""
    from contamray.output_root import RAY_JOB_ENV, check_job_output
    from contamray.pipeline.plan import ConfigError

    out = tmp_path / "run"
    check_job_output({"output_root": None}, out)  # not a Ray Job: the user sees the directory
    monkeypatch.setenv(RAY_JOB_ENV, '{"metadata": {"job_submission_id": "raysubmit_x"}}')
    with pytest.raises(ConfigError, match=r"raysubmit_x.*one of 2 nodes: set run\.output_root"):
        check_job_output({"output_root": None}, out)
    check_job_output({"output_root": "s3://bucket/contamray"}, out)


def test_a_planted_corpus_on_several_nodes_is_published_where_every_node_reads_it(cluster, tmp_path, mirror_dir):
    """Issue 16 item 6: the planted corpus is built on the driver's disk; on two nodes with no artifacts root
    the run refuses before any work, naming ``run.artifacts_uri``; with one, the corpus is published there
    (content-addressed, marked complete) and the scan reads it from the URI and finds the planted rows."""
    import json

    import pandas as pd

    from contamray.pipeline.plan import ConfigError

    base = ("method=[ngram13]", "benchmark=[gsm8k]", "run.limit=12", "corpus=planted", "model=[]",
            f"data.mirror_dir={mirror_dir}")  # fmt: skip
    refused = composed(*base)
    refused.run.output_dir = str(tmp_path / "refused")
    with pytest.raises(ConfigError, match=r"corpus=planted: .* 2 nodes .* set run\.artifacts_uri"):
        run(refused)
    cfg = composed(*base, f"run.artifacts_uri=file://{tmp_path}/artifacts")
    cfg.run.output_dir = str(tmp_path / "run")
    run(cfg)
    (published,) = (tmp_path / "artifacts" / "corpus").glob("*/_COMPLETE")
    assert sorted(p.name for p in published.parent.glob("shard-*.jsonl")) == [f"shard-{i:03d}.jsonl" for i in range(4)]
    manifest = json.loads((tmp_path / "run" / "corpus" / "manifest.json").read_text())
    examples = pd.read_parquet(tmp_path / "run" / "examples.parquet")
    found = set(examples.loc[examples["contaminated"].astype(bool), "record_id"])
    assert found == {rid for rid, row in manifest.items() if row["how"] in ("verbatim", "input_only")}
