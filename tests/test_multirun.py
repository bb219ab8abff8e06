"""Hydra multirun: a model grid runs its jobs concurrently on one Ray cluster, each in its own dir."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]


def test_multirun_jobs_run_concurrently_with_their_own_outputs(tmp_path, mirror_dir):
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    sweep = tmp_path / "sweep"
    args = [
        sys.executable, "-m", "contamray.run", "-m", "+exp=base", "model=smollm2_135m,smollm2_135m_fp32",
        "benchmark=[arc_challenge]", "method=[guided_prompting]", "corpus=none", "run.limit=3",
        "methods.guided_prompting.max_tokens=6", f"data.mirror_dir={mirror_dir}", f"hydra.sweep.dir={sweep}",
        "ray.num_cpus=2",
    ]
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "concurrently on one Ray cluster" in proc.stdout + proc.stderr
    jobs = {}
    for num, model in enumerate(["smollm2_135m", "smollm2_135m_fp32"]):
        job = sweep / str(num)
        partitions = pd.read_parquet(job / "partitions.parquet")
        assert list(partitions["model"]) == [model]
        assert (job / "report.md").read_text().count(model) >= 2
        jobs[num] = ((job / "config.yaml").stat().st_mtime, (job / "report.md").stat().st_mtime)
    (start0, end0), (start1, end1) = jobs[0], jobs[1]
    assert start1 < end0 and start0 < end1, "the two jobs ran one after the other, not concurrently"
