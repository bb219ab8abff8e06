"""Hydra multirun: a model grid runs its jobs concurrently on one Ray cluster, each in its own dir; Ctrl-C stops
every job where it is and the same command finishes the sweep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]


def test_multirun_jobs_run_concurrently_with_their_own_outputs(tmp_path, mirror_dir):
    env = dict(os.environ, CONTAMRAY_LOG="INFO")
    env.pop("RAY_ADDRESS", None)
    sweep = tmp_path / "sweep"
    args = [
        sys.executable, "-m", "contamray.run", "-m", "+exp=base", "model=smollm2_135m,smollm2_135m_fp32",
        "benchmark=[arc_challenge]", "method=[guided_prompting]", "corpus=none", "run.limit=6",
        "methods.guided_prompting.max_tokens=32", f"data.mirror_dir={mirror_dir}", f"hydra.sweep.dir={sweep}",
        "ray.num_cpus=2",
    ]
    # 6 rows x 32 tokens: enough work after a model is up that no job ends before the signal reaches it (with 3 rows x
    # 6 tokens, a model computing in float32 finished its job first)
    # Ctrl-C as soon as a job's model is up: the jobs run in threads of the driver, which the signal never reaches
    # (before: they ran to their end, then the driver hung in Ray's shutdown and exited 1); the launcher stops them
    # all. The run gets SIGINT's default handler, as at a terminal (an xdist worker ignores SIGINT).
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "deployment" in line and " up in " in line:
            proc.send_signal(signal.SIGINT)
            break
    out = "".join(lines) + proc.communicate(timeout=300)[0]
    assert proc.returncode == 130, out[-5000:]
    assert f"the same command with hydra.sweep.dir={sweep} reuses them" in out, out[-3000:]
    for num in (0, 1):
        assert json.loads((sweep / str(num) / "progress.json").read_text())["status"] == "interrupted", out[-3000:]
        assert not (sweep / str(num) / "partitions.parquet").exists()

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
