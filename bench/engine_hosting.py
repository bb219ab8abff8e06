"""Engine hosting benchmark: the canary's model stages on Serve deployments against a run-private ActorPool.

What is measured (issue 14, "Benchmarks"), in one process, on one local Ray, on the same config:

1. **ActorPool (baseline)**: the hosting contamray had before Serve, rebuilt here as it was: per model
   thread of a run, engine actors of one model at a time fed through ``ray.util.ActorPool`` with one
   batch in flight per actor; a stage that needs another model (the judge, the reference model)
   releases the live pool first, and the pool is released before CPU scoring. Loads are counted as
   actors started.
2. **Serve (contamray)**: the run as it is (``contamray/serve/hosting.py``): one deployment per model
   spec for the whole run, ``ray.batches_in_flight`` batches per replica. Loads are counted as Serve
   replicas started (Ray's state API, dead ones included).

Both runs compute every cell (separate output directories, nothing reused) and their verdicts must be
equal. The config is the canary (``+exp=canary``: the embedded model fine-tuned on known partitions,
a reference model, the target as its own open-data judge) cut to a few methods and rows so it fits in
minutes on a CPU; the fine-tuned model is cached after its first build, and a first untimed run warms
every cache. The two paths then run alternately ``--repeats`` times. Printed: model loads per run for
each path, wall times, and last ``wall_time_ratio_actorpool_over_serve: <x>`` (best of each; goal >=
1.0: Serve no slower on CPU; on a GPU the extra batches in flight are the point).

    python bench/engine_hosting.py --mirror ../shared/benchmarks [--limit 10] [--num-cpus 4] [--repeats 2]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

print = functools.partial(print, flush=True)  # noqa: A001 - progress shows up in pipes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METHODS = "guided_prompting,min_k_plus_plus,min_k,perplexity,reference_ratio,llm_decontaminator"


class ActorPoolEngines:
    """The former hosting, for comparison: at most one model's actors alive, released on a switch of
    model and before scoring; ``answer`` through ``ray.util.ActorPool``, one batch per actor."""

    loads = 0

    def __init__(self, ray_cfg: dict[str, Any], serve_cfg: dict[str, Any] | None = None) -> None:
        self.ray_cfg = ray_cfg
        self.live: Any = None

    def get(self, pool: Any) -> Any:
        if self.live is not None and self.live.name != pool.name:
            self.close()
        if self.live is None:
            self.live = _ActorPool(pool, self.ray_cfg)
            ActorPoolEngines.loads += len(self.live.actors)
        return self.live

    def room_for(self, pools: list[Any]) -> bool:
        return False  # one model's actors alive at a time: a stage asks its models one after the other

    def make_room(self, cpus: float) -> None:
        self.close()

    def close(self) -> None:
        import ray

        if self.live is not None:
            for actor in self.live.actors:
                ray.kill(actor)
            self.live = None

    def __enter__(self) -> ActorPoolEngines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Worker:
    def __init__(self, engine_spec: dict[str, Any]) -> None:
        from contamray.engines import EngineSpec, build_engine

        self.engine = build_engine(EngineSpec(**engine_spec))

    def answer(self, batch: dict[str, Any]) -> dict[str, list[str]]:
        from contamray.engines.wire import Request
        from contamray.pipeline.actors import answer_requests

        outputs = answer_requests(self.engine, [Request.from_row(json.loads(r)) for r in batch["request"]])
        return {"cell": batch["cell"], "output": [json.dumps(o.to_row()) for o in outputs]}


class _ActorPool:
    def __init__(self, pool: Any, ray_cfg: dict[str, Any]) -> None:
        import ray

        self.name = pool.name
        self.batch_size = int(ray_cfg.get("request_batch_size", 32))
        options = {"num_cpus": pool.num_cpus, "num_gpus": pool.num_gpus, "max_restarts": 2, "max_task_retries": 2}
        worker = ray.remote(_Worker).options(**options)
        self.actors = [worker.remote(dict(pool.engine)) for _ in range(pool.concurrency)]

    def answer(self, items: list, label: str = "") -> list:
        from ray.util import ActorPool

        from contamray.engines.dedup import Dedup
        from contamray.engines.wire import Output

        work = Dedup(items)
        unique = work.unique
        batches = [
            {"cell": [c for c, _ in unique[i : i + self.batch_size]],
             "request": [json.dumps(r.to_row()) for _, r in unique[i : i + self.batch_size]]}
            for i in range(0, len(unique), self.batch_size)
        ]  # fmt: skip
        out = []
        for result in ActorPool(self.actors).map_unordered(lambda a, b: a.answer.remote(b), batches):
            out.extend((c, Output.from_row(json.loads(o))) for c, o in zip(result["cell"], result["output"]))
        return work.expand(out)


def replica_starts(address: str) -> int:
    from ray.util.state import list_actors

    actors = list_actors(address=address, detail=False, limit=10_000, raise_on_missing_output=False)
    return sum(1 for a in actors if (a.class_name or "").startswith("ServeReplica:contamray-"))


def one_run(overrides: list[str], out: Path) -> tuple[float, Any]:
    import pandas as pd
    from hydra import compose, initialize_config_dir

    from contamray.experiments import CONF_DIR
    from contamray.run import run

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    cfg.run.output_dir = str(out)
    started = time.perf_counter()
    run(cfg)
    seconds = time.perf_counter() - started
    verdicts = pd.read_parquet(out / "partitions.parquet")
    return seconds, verdicts[["model", "benchmark", "method", "decision", "p_value"]].sort_values(
        ["model", "benchmark", "method"]
    ).reset_index(drop=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", default=str(ROOT.parent / "shared" / "benchmarks"))
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--num-cpus", type=int, default=4,
                        help="Ray's logical CPUs: 4 hosts the target, the reference model and a scorer at once "
                        "on this 2-core machine (the engines idle while the scorer works); 2 makes one model "
                        "give way to the scorer and load again")  # fmt: skip
    args = parser.parse_args()

    import logging

    import ray

    import contamray.pipeline.runner as runner

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")  # progress and loads, per stage
    context = ray.init(num_cpus=args.num_cpus, include_dashboard=True, log_to_driver=False)
    address = f"http://{context.dashboard_url}"
    overrides = [
        "+exp=canary", f"data.mirror_dir={args.mirror}", f"run.limit={args.limit}", f"method=[{args.methods}]",
        "reference_model.dtype=float32", "models.canary.dtype=float32",
    ]  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="engine-hosting-"))
    print(f"config: {' '.join(overrides)}")
    print("warm-up: the fine-tuned canary model, the planted corpus, every method once (not timed)")
    one_run(overrides, tmp / "warm")

    serve_pools = runner.EnginePools
    pool_times, serve_times, pool_loads, serve_loads = [], [], [], []
    for rep in range(args.repeats):  # alternated, best of each: the machine's drift hits both alike
        ActorPoolEngines.loads = 0
        runner.EnginePools = ActorPoolEngines  # type: ignore[misc, assignment]
        try:
            seconds, pool_verdicts = one_run(overrides, tmp / f"actorpool{rep}")
        finally:
            runner.EnginePools = serve_pools  # type: ignore[misc]
        pool_times.append(seconds)
        pool_loads.append(ActorPoolEngines.loads)
        print(f"actorpool: {seconds:7.1f} s, {ActorPoolEngines.loads} model load(s)")
        before = replica_starts(address)
        seconds, serve_verdicts = one_run(overrides, tmp / f"serve{rep}")
        serve_times.append(seconds)
        serve_loads.append(replica_starts(address) - before)
        print(f"serve:     {seconds:7.1f} s, {serve_loads[-1]} model load(s)")
    same = serve_verdicts.equals(pool_verdicts)
    print(f"verdicts equal: {same}")
    print(f"loads per run: {max(serve_loads)} (serve) vs {max(pool_loads)} (actorpool), {args.num_cpus} CPUs for Ray")
    print(f"wall_time_ratio_actorpool_over_serve: {min(pool_times) / min(serve_times):.2f} (best of {args.repeats})")
    if not same:
        raise SystemExit("the two hostings gave different verdicts")


if __name__ == "__main__":
    main()
