"""Models with known contamination inside a run: fine-tune on benchmark rows first, then probe.

A model config with ``inject: {...}`` (see ``contamray.inject``) is not loaded as it is: before its
engine pool starts, the driver fine-tunes its ``source`` on the rows the spec names — the run's own
records of those benchmarks, so the ids the model saw are the ids the methods score — and the engine
loads the result (published to the run's artifacts root, when it has one, so replicas on any node can fetch
it). The injection is cached by content hash, so re-runs and reduce-only passes get it
back at once. Its truth flows into the results: a ``member`` column per example (the model trained on
this row) and a ``truth`` field per verdict (this partition was injected).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contamray.artifacts import publish_dir
from contamray.pipeline.plan import ModelPlan, Plan
from contamray.records import Record


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

    def get(self, model_name: str) -> Any | None:
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
                )
            return self._done[model_name]

    def engine_pool(self, model_name: str) -> ModelPlan:
        """The model's pool, loading the injected checkpoint when the model is an injection."""
        model = self.plan.models[model_name]
        injected = self.get(model_name)
        if injected is None:
            return model
        source = str(injected.path)
        if self.artifacts:  # the replicas may run on any node: they fetch the checkpoint from the artifacts root
            source = publish_dir(injected.path, f"{self.artifacts}/injected/{injected.manifest['key']}")
        return dataclasses.replace(model, engine={**model.engine, "source": source})

    def members(self, model_name: str) -> set[str] | None:
        injected = self.get(model_name)
        return None if injected is None else set(injected.member_ids)

    def truth(self, model_name: str, partition: str) -> bool | None:
        injected = self.get(model_name)
        return None if injected is None else partition in injected.contaminated_partitions
