"""An injected model's fine-tune runs as a Ray task with the model config's resources (issue #16, item 6).

On a ``ray.cluster_utils.Cluster`` of the driver's 2-CPU head and one 2-CPU ``trainer`` node (a custom resource
only that node has, and its own ``CONTAMRAY_CACHE``: its own disk, as far as the run can tell), a real run
injects 4 synthetic-facts rows (2 copies, no background, 64-token blocks: two optimiser steps) into the
embedded model whose config asks for ``resources: {trainer: 1}``, and scores the rows with perplexity. The
fine-tune must run on the trainer node as the task ``finetune:models.canary.inject`` with the node's 2 CPUs
and the custom resource, its progress and losses in its log; the checkpoint lands in the trainer's cache and is
published under the artifacts root, never on the driver's disk; the engine replica loads it from the URI (its
node's fetch cache holds the published weights, which differ from the base model's); the examples carry the
manifest's truth (every scored row a member) and no error. The next run's driver reuses the published fine-tune
without a task.
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

import pandas as pd
import pytest
from ray import serve
from ray.util.state import get_log, list_tasks

from contamray.engines.models import EMBEDDED_MODELS, ensure_converted
from contamray.pipeline.injections import Injections
from contamray.pipeline.plan import build_plan
from contamray.pipeline.runner import load_benchmarks
from contamray.run import run
from tests.test_config import composed

pytestmark = pytest.mark.slow

TASK = "finetune:models.canary.inject"


def node_cache(root: Path) -> Path:
    """A node's ``CONTAMRAY_CACHE`` holding only the converted base model (linked: no 35 s conversion)."""
    base = ensure_converted(EMBEDDED_MODELS["smollm2-135m"])
    (root / "models").mkdir(parents=True)
    (root / "models" / base.name).symlink_to(base)
    return root


def config(out: Path, artifacts: Path, mirror: Path):
    cfg = composed(
        "model=[canary]", "benchmark=[synthetic_facts]", "method=[perplexity]", "corpus=none", "run.limit=4",
        f"data.mirror_dir={mirror}", f"run.artifacts_uri=file://{artifacts}", "+models.canary.resources={trainer:1}",
        "models.canary.inject.partitions=[{benchmark:synthetic_facts,duplication:2}]",
        "models.canary.inject.background.docs=0", "models.canary.inject.max_length=64",
    )  # fmt: skip
    cfg.run.output_dir = str(out)
    return cfg


def test_the_fine_tune_runs_on_the_node_the_model_asks_for_and_engines_load_it_from_the_artifacts_uri(
    ray_cluster, tmp_path: Path, mirror_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer_cache = node_cache(tmp_path / "trainer-cache")
    trainer = ray_cluster.add_node(
        num_cpus=2, resources={"trainer": 2}, env_vars={"CONTAMRAY_CACHE": str(trainer_cache)}
    )
    ray_cluster.wait_for_nodes()
    monkeypatch.setenv("CONTAMRAY_CACHE", str(node_cache(tmp_path / "driver-cache")))
    artifacts = tmp_path / "artifacts"
    try:
        run(config(tmp_path / "run", artifacts, mirror_dir))
    finally:
        serve.shutdown()

    (task,) = [t for t in list_tasks(filters=[("name", "=", TASK)], detail=True, raise_on_missing_output=False)]
    assert task.node_id == trainer.node_id and task.state == "FINISHED"
    assert task.required_resources == {"CPU": 2.0, "trainer": 1.0}  # the model's resources, the node's CPUs
    # its progress reached its stderr (which Ray forwards to the driver's output): before, a worker dropped it
    said = "".join(get_log(task_id=task.task_id, suffix="err", node_id=task.node_id))
    # the time as progress.format_seconds writes it: 42s, 1m14s, 1h02m
    took = r"(\d+s|\d+m\d\ds|\d+h\d\dm)\b"
    done = r"INFO fine-tune of \S+ \(\d+ blocks x 1 epochs, float32\): done (\d+)/\1 steps in " + took
    assert re.search(done, said), said[-2000:]
    assert re.search(r"INFO finetune epoch 1/1: mean loss \d", said), said[-2000:]

    (published,) = (artifacts / "injected").glob("*/_COMPLETE")
    key = published.parent.name
    assert (trainer_cache / "injected" / key / "manifest.json").is_file()
    assert not (tmp_path / "driver-cache" / "injected" / key).exists()  # trained and read on the other node only
    weights = (published.parent / "model.safetensors").read_bytes()
    base = ensure_converted(EMBEDDED_MODELS["smollm2-135m"])
    assert hashlib.sha256(weights).digest() != hashlib.sha256((base / "model.safetensors").read_bytes()).digest()
    uri = f"file://{artifacts}/injected/{key}"
    fetched = trainer_cache / "artifacts" / hashlib.sha256(uri.encode()).hexdigest()[:20]
    assert (fetched / "model.safetensors").read_bytes() == weights  # the replica loaded it from the URI

    examples = pd.read_parquet(tmp_path / "run" / "examples.parquet")
    assert len(examples) == 4 and not examples["error"].fillna("").astype(bool).any()
    assert examples["member"].astype(bool).all()  # the truth, read from the manifest at the URI

    # a fine-tune published under the artifacts root is reused by the next run's driver: no second task
    plan = build_plan(config(tmp_path / "again", artifacts, mirror_dir))
    injections = Injections(plan, lambda names: load_benchmarks(plan, names)[0], f"file://{artifacts}")
    again = injections.engine_pool("canary")
    assert again.engine["source"] == uri and injections.members("canary") == set(examples["record_id"])
    assert len(list_tasks(filters=[("name", "=", TASK)], raise_on_missing_output=False)) == 1


def test_a_stopped_run_cancels_its_fine_tune_and_keeps_no_checkpoint(ray_cluster, tmp_path: Path, mirror_dir: Path,
                                                                       monkeypatch: pytest.MonkeyPatch):
    """Ctrl-C while an injected model is fine-tuned (``EnginePools.stopping`` set): the driver stops waiting for
    the task at once, cancels it and raises ``RunInterrupted`` - it used to wait for the whole fine-tune - and no
    checkpoint is published (a fine-tune cut short is never taken for one)."""
    import threading

    from contamray.interrupts import RunInterrupted

    monkeypatch.setenv("CONTAMRAY_CACHE", str(node_cache(tmp_path / "cache")))
    artifacts = tmp_path / "artifacts"
    cfg = composed(
        "model=[canary]", "benchmark=[synthetic_facts]", "method=[perplexity]", "corpus=none", "run.limit=4",
        f"data.mirror_dir={mirror_dir}", f"run.artifacts_uri=file://{artifacts}",
        "models.canary.inject.partitions=[{benchmark:synthetic_facts,duplication:2}]",
        "models.canary.inject.epochs=2000", "models.canary.inject.background.docs=0",
        "models.canary.inject.max_length=64",
    )  # fmt: skip
    cfg.run.output_dir = str(tmp_path / "run")
    plan = build_plan(cfg)
    injections = Injections(plan, lambda names: load_benchmarks(plan, names)[0], f"file://{artifacts}")
    stopping, raised = threading.Event(), []

    def fine_tune() -> None:
        try:
            injections.engine_pool("canary", stopping=stopping)
        except RunInterrupted as err:
            raised.append(err)

    worker = threading.Thread(target=fine_tune)
    worker.start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not [
        t for t in list_tasks(filters=[("name", "=", TASK), ("state", "=", "RUNNING")], raise_on_missing_output=False)
    ]:
        time.sleep(0.2)
    time.sleep(5)  # training: 2,000 epochs of 2 steps would take a quarter of an hour on 2 cores
    stopping.set()
    worker.join(timeout=120)
    assert not worker.is_alive() and len(raised) == 1 and "fine-tune cancelled" in str(raised[0])
    assert not list(artifacts.glob("injected/*/_COMPLETE"))
