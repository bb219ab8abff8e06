"""Models with known contamination inside a run: fine-tune on benchmark rows first, then probe.

A model config with ``inject: {...}`` (see ``contamray.inject``) is not loaded as it is: before its
engine pool starts, its ``source`` is fine-tuned on the rows the spec names — the run's own records of
those benchmarks, so the ids the model saw are the ids the methods score — and the engine loads the
result. The injection is cached by content hash, so re-runs and reduce-only passes get it back at once.
Its truth flows into the results: a ``member`` column per example (the model trained on this row) and a
``truth`` field per verdict (this partition was injected).

Where the fine-tune runs: the driver reads the rows and builds the training stream; the training is a Ray
task (``finetune_task``) with the resources the model config asks for its replicas (``num_gpus``,
``accelerator_type``, custom ``resources``; ``finetune_options``). On a GPU it takes the replica's
``num_cpus``; on CPU a fine-tune is compute-bound on every core it gets, so it asks for all the CPUs of the
largest node that has the model's other resources (what the fine-tune in the driver used to take without
telling Ray), and torch computes on that many threads (Ray would give it ``OMP_NUM_THREADS`` only). Idle
models of the run make way for it first. The task writes the checkpoint into its node's cache
(``$CONTAMRAY_CACHE/injected/<key>``) and, with an artifacts root, publishes it there
(``<root>/injected/<key>``, ``contamray.artifacts``): replicas on any node fetch it from the URI, and the
driver reads the manifest from it when the task ran on another node.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contamray.artifacts import publish_dir
from contamray.pipeline.plan import ModelPlan, Plan
from contamray.records import Record

if TYPE_CHECKING:
    from contamray.inject.prepare import InjectedModel, TrainJob

log = logging.getLogger("contamray")

WAIT_LOG_S = 30.0  # how often the driver says the fine-tune is still running (or waiting for resources)
STOP_POLL_S = 0.5  # how often the driver looks whether the run was stopped (Ctrl-C) while a fine-tune runs


def injection_cache_dir() -> str:
    base = os.environ.get("CONTAMRAY_CACHE")
    root = Path(base) if base else Path.home() / ".cache" / "contamray"
    return str(root / "injected")


def injected_benchmarks(spec: dict[str, Any]) -> list[str]:
    """The benchmark keys an injection spec trains on."""
    return sorted({str(p["benchmark"]) for p in spec.get("partitions", []) if "benchmark" in p})


class Injections:
    """Per-run, thread-safe access to each injected model (prepared once, then cached)."""

    def __init__(
        self, plan: Plan, load: Callable[[list[str]], dict[str, list[Record]]], artifacts: str | None = None
    ) -> None:
        self.plan = plan
        self.load = load
        self.artifacts = artifacts  # where every node reads the checkpoints (contamray.artifacts), or None
        self._done: dict[str, Any] = {}
        self._lock = threading.Lock()

    def get(
        self, model_name: str, make_room: Callable[..., None] | None = None, stopping: threading.Event | None = None
    ) -> Any | None:
        """The model's ``InjectedModel`` (cached, or fine-tuned now as a Ray task; ``make_room(cpus=, gpus=)``
        frees what idle models of the run hold first; ``stopping`` set - Ctrl-C - cancels the fine-tune), or None
        when the model is not an injection."""
        model = self.plan.models.get(model_name)
        if model is None or not model.inject:
            return None
        with self._lock:
            if model_name not in self._done:
                from contamray.inject import prepare_injected_model

                records = self.load(injected_benchmarks(model.inject))
                self._done[model_name] = prepare_injected_model(
                    str(model.engine["source"]),
                    model.inject,
                    records,
                    injection_cache_dir(),
                    self.plan.seed,
                    self.plan.data.get("mirror_dir"),
                    where=f"models.{model_name}.inject",
                    artifacts=self.artifacts,
                    train=lambda job: finetune_on_cluster(job, model, self.artifacts, make_room, stopping=stopping),
                )
            return self._done[model_name]

    def engine_pool(
        self, model_name: str, make_room: Callable[..., None] | None = None, stopping: threading.Event | None = None
    ) -> ModelPlan:
        """The model's pool, loading the injected checkpoint when the model is an injection."""
        model = self.plan.models[model_name]
        injected = self.get(model_name, make_room, stopping)
        if injected is None:
            return model
        source = injected.published or str(injected.path)
        if self.artifacts and not injected.published:  # replicas on any node fetch it from the artifacts root
            from contamray.inject.prepare import published_uri

            source = publish_dir(injected.path, published_uri(self.artifacts, injected.manifest["key"]))
        return dataclasses.replace(model, engine={**model.engine, "source": source})

    def members(self, model_name: str) -> set[str] | None:
        injected = self.get(model_name)
        return None if injected is None else set(injected.member_ids)

    def truth(self, model_name: str, record_ids: Iterable[str]) -> bool | None:
        """Whether the model was trained on any of these rows (a cell's own): None for a model not injected. By
        rows, not by partition: two benchmark keys may read one split (a held-out after the tested rows)."""
        members = self.members(model_name)
        return None if members is None else any(str(r) in members for r in record_ids)


def finetune_options(
    model: ModelPlan, available_cpus: float | None = None, nodes: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Ray options of the fine-tune task of ``model`` (see the module docstring): its replicas' GPUs,
    accelerator type and custom resources; CPUs: the replica's on a GPU, else every CPU of the largest node
    that has the rest - but no more than ``available_cpus`` (what the cluster has free: a deployment outside
    the run holding a CPU of a one-node cluster must not make the fine-tune wait for ever), nor fewer than
    the replica's. ``nodes``: ``ray.nodes()`` (read from the cluster when not given)."""
    import ray

    from contamray.serve.hosting import replica_options

    options = replica_options(model)
    if not model.num_gpus:
        need = dict(model.resources)
        if model.accelerator_type:
            need[f"accelerator_type:{model.accelerator_type}"] = 0.001
        cpus = [
            float(node["Resources"].get("CPU", 0))
            for node in (ray.nodes() if nodes is None else nodes)
            if node.get("Alive") and all(node["Resources"].get(k, 0) >= v for k, v in need.items())
        ]
        largest = max(cpus, default=model.num_cpus)
        free = largest if available_cpus is None else available_cpus
        options["num_cpus"] = max(model.num_cpus, min(largest, free))
    return options


def finetune_task(job: TrainJob, cache_dir: str | None, publish_to: str | None) -> tuple[str, str, dict[str, Any]]:
    """The body of the fine-tune task: torch on as many threads as the task has CPUs, the checkpoint trained
    into this node's cache (or found there), published to ``publish_to``; returns (node id, local path,
    manifest). Its progress (steps done / total, rate, ETA) and epoch losses reach the driver's output
    through the task's stderr."""
    import ray

    from contamray.inject.prepare import train_injected
    from contamray.logs import log_to_stderr
    from contamray.ray_threads import limit_torch_threads

    log_to_stderr()
    limit_torch_threads()
    injected = train_injected(job, cache_dir or injection_cache_dir())
    if publish_to:
        publish_dir(injected.path, publish_to)
    return ray.get_runtime_context().get_node_id(), injected.path, injected.manifest


def finetune_on_cluster(
    job: TrainJob,
    model: ModelPlan,
    artifacts: str | None,
    make_room: Callable[..., None] | None = None,
    cache_dir: str | None = None,
    stopping: threading.Event | None = None,
) -> InjectedModel:
    """Run ``job`` (``contamray.inject.prepare.TrainJob``) as a Ray task with ``finetune_options(model)``; the
    ``InjectedModel`` it made: read where it lies on this node, or from its artifacts URI when the task ran
    on another one. ``cache_dir`` is the task node's cache (default: its ``$CONTAMRAY_CACHE/injected``).
    ``stopping`` set (the run was interrupted) cancels the task and raises ``RunInterrupted``."""
    import ray

    from contamray.inject.prepare import InjectedModel, published_uri
    from contamray.interrupts import RunInterrupted

    stopped = stopping if stopping is not None else threading.Event()
    if stopped.is_set():
        raise RunInterrupted(f"{job.where}: fine-tune not started, the run was stopped")

    wanted = finetune_options(model)
    if make_room is not None:  # idle models of the run make way
        make_room(cpus=float(wanted["num_cpus"]), gpus=float(wanted.get("num_gpus") or 0))
    options = finetune_options(model, ray.available_resources().get("CPU", 0.0))
    publish_to = published_uri(artifacts, job.key) if artifacts else None
    log.info("injected model %s: fine-tuning as a Ray task with %s", job.where, options)
    remote = ray.remote(max_calls=1)(finetune_task).options(name=f"finetune:{job.where}", **options)
    ref = remote.remote(job, cache_dir, publish_to)
    started = logged = time.monotonic()
    while not ray.wait([ref], timeout=STOP_POLL_S)[0]:
        if stopped.is_set():
            ray.cancel(ref, force=True)
            raise RunInterrupted(f"{job.where}: fine-tune cancelled, the run was stopped")
        if time.monotonic() - logged >= WAIT_LOG_S:
            logged = time.monotonic()
            log.info("injected model %s: fine-tune running or waiting for %s (%.0f s; available now: %s)", job.where,
                     options, logged - started, ray.available_resources())  # fmt: skip
    node, path, manifest = ray.get(ref)
    if node == ray.get_runtime_context().get_node_id():
        return InjectedModel.from_manifest(path, manifest, published=publish_to)
    if publish_to is None:
        raise RuntimeError(
            f"{job.where}: the fine-tune ran on another node ({node}) and there is no artifacts root to read it "
            "from: set run.artifacts_uri to shared storage or a URI every node can read"
        )
    return InjectedModel.from_manifest(publish_to, manifest, published=publish_to)
