"""Models of one stage side by side: a target and its reference model answering at once against one after the other.

What is measured: the membership scores that need two models (Min-K%++ on the target, the reference-model ratio on
the target and a reference model: one stage asks both) on ``--limit`` rows of ``synthetic_facts`` and as many of a
held-out draw, in one process on one local Ray with ``--num-cpus`` logical CPUs (2: one replica each, both fit).

1. **One after the other (baseline)**: the stage as it was before models were asked side by side:
   ``EnginePools.room_for`` answers False, so ``pipeline/cells.py`` asks the target, then the reference model (which
   loads only then).
2. **Side by side (contamray)**: the run as it is: both fit, so both are asked at once, the reference model loading
   while the target answers.

Every run computes every cell (own output folder, ``run.reuse_earlier=false``); the verdicts must be equal. A first
untimed run warms the caches; the two then run alternately ``--repeats`` times. Printed last:
``wall_time_ratio_sequential_over_side_by_side: <x>`` (best of each). Measured on 2 EPYC cores (2026-12-03, 60 rows):
1.48 (129.5 s against 87.5 s, ``--repeats 1``); by hand before this script, 139 and 145 s against 100 and 100 s.

    python bench/stage_side_by_side.py --mirror ../shared/benchmarks [--limit 60] [--repeats 2]
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from pathlib import Path

print = functools.partial(print, flush=True)  # noqa: A001 - progress shows up in pipes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REFERENCE = "{source: smollm2-135m, backend: hf, dtype: float32, batch_size: 16, num_gpus: 0, num_cpus: 1}"


def one_run(overrides: list[str], out: Path) -> tuple[float, object]:
    import pandas as pd
    from hydra import compose, initialize_config_dir

    from contamray.run import run

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    cfg.run.output_dir = str(out)
    started = time.perf_counter()
    run(cfg)
    seconds = time.perf_counter() - started
    verdicts = pd.read_parquet(out / "partitions.parquet")[["method", "partition", "statistic", "p_value", "decision"]]
    return seconds, verdicts.sort_values(["method", "partition"]).reset_index(drop=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", default=str(ROOT.parent / "shared" / "benchmarks"))
    parser.add_argument("--limit", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--num-cpus", type=int, default=2)
    args = parser.parse_args()

    import logging

    import ray

    from contamray.pipeline.engine_pool import EnginePools

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    ray.init(num_cpus=args.num_cpus, log_to_driver=False)
    overrides = [
        "+exp=base", f"data.mirror_dir={args.mirror}", f"run.limit={args.limit}", "run.sample=first",
        "model=[smollm2_135m]", "models.smollm2_135m.dtype=float32", "benchmark=[synthetic_facts]",
        "method=[min_k_plus_plus,reference_ratio]", "corpus=none", "run.reuse_earlier=false",
        f"+reference_model={REFERENCE}", "+benchmarks.synthetic_facts.heldout=held",
        f"+benchmarks.held={{adapter: synthetic_facts, config: set1, split: test, limit: {args.limit}, sample: first}}",
    ]  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="stage-side-by-side-"))
    print(f"config: {' '.join(overrides)}")
    one_run(overrides, tmp / "warm")
    room_for = EnginePools.room_for
    sequential, side_by_side = [], []
    for rep in range(args.repeats):  # alternated, best of each: the machine's drift hits both alike
        EnginePools.room_for = lambda self, pools: False  # type: ignore[method-assign]
        try:
            seconds, before = one_run(overrides, tmp / f"sequential{rep}")
        finally:
            EnginePools.room_for = room_for  # type: ignore[method-assign]
        sequential.append(seconds)
        print(f"one after the other: {seconds:7.1f} s")
        seconds, after = one_run(overrides, tmp / f"side{rep}")
        side_by_side.append(seconds)
        print(f"side by side:        {seconds:7.1f} s")
        if not before.equals(after):
            raise SystemExit("the two ways gave different verdicts")
    print("verdicts equal: True")
    ratio = min(sequential) / min(side_by_side)
    print(f"wall_time_ratio_sequential_over_side_by_side: {ratio:.2f} (best of {args.repeats})")


if __name__ == "__main__":
    main()
