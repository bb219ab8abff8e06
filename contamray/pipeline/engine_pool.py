"""A model's engine actors, kept alive across the stages of its cells: each model loads once per run.

Why not one Ray Data ``map_batches`` pass per stage (the first design): every Dataset execution
builds its own actor pool, so a method with two engine stages (the sharded test's length probe then
its windows, guided prompting's completions then its judge) loaded the model twice. On a GPU cluster
that is minutes per load for a 70B model under vLLM; on this CPU it is the actor start-up and the
engine build each time.

Here the actors are plain Ray actors of ``EngineWorker`` with the pool's resources (``num_gpus``,
``num_cpus``, ``concurrency`` of them), fed batches of requests through ``ray.util.ActorPool``. A
crashed actor is restarted by Ray and its batch retried (``max_restarts``/``max_task_retries``); a
request that raises is still isolated inside the batch (``actors.answer_requests``).

``EnginePools`` keeps at most one pool of a model's thread alive: when a stage needs another pool (the
judge model on the same GPU) the live one is released first, so two pools never wait on each other's
GPUs. Pools are released before the CPU scoring starts, so scorers get the CPUs back.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from contamray.engines.dedup import Dedup
from contamray.engines.wire import Output, Request
from contamray.pipeline.actors import EngineWorker
from contamray.pipeline.plan import ModelPlan
from contamray.pipeline.progress import Progress

log = logging.getLogger("contamray")

RESTARTS = 2  # an actor that dies (out of memory, a lost node) is rebuilt this many times


def engine_actor_options(pool: ModelPlan) -> dict[str, Any]:
    """The Ray actor options of one engine actor of ``pool`` (its resources and its retries)."""
    return {
        "num_gpus": pool.num_gpus,
        "num_cpus": pool.num_cpus,
        "max_restarts": RESTARTS,
        "max_task_retries": RESTARTS,
    }


class EnginePool:
    """``pool.concurrency`` engine actors of one model; ``answer`` sends them batches of requests."""

    def __init__(self, pool: ModelPlan, ray_cfg: dict[str, Any]) -> None:
        import ray

        self.name = pool.name
        self.batch_size = max(1, int(ray_cfg.get("request_batch_size", 32)))
        actor_class = ray.remote(EngineWorker).options(**engine_actor_options(pool))
        self.actors = [actor_class.remote(dict(pool.engine)) for _ in range(max(1, pool.concurrency))]
        log.info("engine pool %s: %d actor(s) started", pool.name, len(self.actors))

    def answer(self, items: list[tuple[str, Request]], label: str = "") -> list[tuple[str, Output, int]]:
        """(cell key, Output, how many requests shared its answer) for every (cell key, Request); order is
        not kept. Identical requests of different cells are sent once (``engines/dedup.py``).

        Progress (requests done / total, tokens/s, ETA) is reported under ``label`` as batches come back.
        """
        from ray.util import ActorPool

        label = label or f"engine pool {self.name}"
        work = Dedup(items)
        if work.saved:
            log.info("%s: %d of %d requests shared with another cell", label, work.saved, len(items))
        items = work.unique
        batches = [
            {
                "cell": [cell for cell, _ in items[i : i + self.batch_size]],
                "request": [json.dumps(req.to_row()) for _, req in items[i : i + self.batch_size]],
            }
            for i in range(0, len(items), self.batch_size)
        ]
        out: list[tuple[str, Output]] = []
        with Progress(label, len(items), unit="requests") as progress:
            pending = ActorPool(self.actors).map_unordered(lambda actor, batch: actor.answer.remote(batch), batches)
            for result in pending:
                answered = [
                    (cell, Output.from_row(json.loads(row))) for cell, row in zip(result["cell"], result["output"])
                ]
                out.extend(answered)
                progress.update(len(answered), tokens=sum(o.num_tokens for _, o in answered))
        return work.expand(out)

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        log.info("engine pool %s: released", self.name)


class EnginePools:
    """The live engine pool of one model's scoring (at most one at a time); use as a context manager."""

    def __init__(self, ray_cfg: dict[str, Any]) -> None:
        self.ray_cfg = ray_cfg
        self.live: EnginePool | None = None

    def get(self, pool: ModelPlan) -> EnginePool:
        if self.live is not None and self.live.name != pool.name:
            self.close()
        if self.live is None:
            self.live = EnginePool(pool, self.ray_cfg)
        return self.live

    def live_first(self, names: list[str]) -> list[str]:
        """``names`` with the live pool's first, so a stage uses it before another pool replaces it."""
        return sorted(names, key=lambda name: self.live is None or name != self.live.name)

    def close(self) -> None:
        if self.live is not None:
            self.live.close()
            self.live = None

    def __enter__(self) -> EnginePools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
