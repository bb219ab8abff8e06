"""A 2 models × 2 benchmarks × 2 methods grid, killed half way and re-run, equals an uninterrupted run.

Real runs of the entry point in subprocesses on a local Ray: one uninterrupted, on one engine replica per
model and one scoring actor; one on 2 replicas of a model and 2 scoring actors, stopped with Ctrl-C (SIGINT) as
soon as a model has answered a batch, started again and killed with SIGKILL as soon as its first cells are
stored, then started again on the same output directory. The second start must not ask again the batches the
first had kept (``pipeline/answers.py``; the log says how many), the third must reuse exactly the cells that
were finished (the log says which) and recompute only the rest; its
``partitions.parquet`` must equal the uninterrupted run's byte for byte (issue 17: determinism across
runs and replica counts; wall-clock seconds live in ``timings.parquet``) and its examples table must equal
it but for the wall-clock column.

The same as a Ray Job (issue 17, item 2): ``jobs/submit.sh`` on a local Ray head with the Jobs API, the job
stopped with ``ray job stop`` as soon as its first cell is scored, then submitted again with the same
``--name``: the re-submitted job reuses every cell the stopped one stored (finished, or scored and not yet
reduced - both counted in its log) and ends with the uninterrupted run's ``partitions.parquet``, byte for byte.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from ray.job_submission import JobSubmissionClient

from tests.ray_head import ray_head as local_ray_head

REPO = Path(__file__).resolve().parents[1]
GRID = [
    "model=[smollm2_135m,smollm2_135m_fp32]",
    "benchmark=[arc_challenge,gsm8k]",
    "method=[guided_prompting]",
    "+methods.guided_short={method: guided_prompting, max_tokens: 6, min_frac: 0.6}",
    "methods.guided_prompting.max_tokens=10",
    "corpus=none",
    "run.limit=2",
    "ray.request_batch_size=2",  # several batches per stage, for several replicas to share
]
ONE = ["ray.num_cpus=2"]
# logical CPUs: 2 + 1 engine replicas and 2 scoring actors on the 2 cores (a replica more costs a model load
# per run and proves nothing 2 do not: cells are split between replicas and actors either way)
MANY = ["ray.num_cpus=6", "models.smollm2_135m_fp32.concurrency=2", "ray.scoring_concurrency=2"]


def start(out: Path, mirror: Path, hosting: list[str]) -> subprocess.Popen:
    env = dict(os.environ, CONTAMRAY_LOG="INFO")
    env.pop("RAY_ADDRESS", None)
    args = [sys.executable, "-m", "contamray.run", "+exp=base", *GRID, *hosting, f"data.mirror_dir={mirror}",
            f"hydra.run.dir={out}"]
    # Ctrl-C reaches the run as at a terminal: an xdist worker ignores SIGINT, and a child inherits that (Python
    # then installs no KeyboardInterrupt handler)
    return subprocess.Popen(
        args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-5000:]
    return out


def finished_cells(out: Path) -> set[str]:
    return {p.parent.name for p in (out / "cells").glob("*/verdict.json")}


WALL_CLOCK = ["engine_seconds"]  # the one thing a resumed run cannot reproduce (tokens it can)


def sorted_table(path: Path, keys: list[str]) -> pd.DataFrame:
    table = pd.read_parquet(path)
    return table.drop(columns=[c for c in WALL_CLOCK if c in table.columns]).sort_values(keys).reset_index(drop=True)


def scored_cells(out: Path) -> set[str]:
    return {p.parent.name for p in (out / "cells").glob("*/examples.parquet")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, mirror_dir) -> Path:
    """The uninterrupted run: one engine replica per model, one scoring actor."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    finish(start(out, mirror_dir, ONE))
    assert len(finished_cells(out)) == 8
    return out


def assert_same_partitions(resumed: Path, reference: Path) -> None:
    keys = ["model", "partition", "method"]
    if (resumed / "partitions.parquet").read_bytes() != (reference / "partitions.parquet").read_bytes():
        pd.testing.assert_frame_equal(  # says where they differ
            sorted_table(resumed / "partitions.parquet", keys), sorted_table(reference / "partitions.parquet", keys)
        )
        pytest.fail("partitions.parquet: equal tables, different bytes")


def kept_batches(out: Path) -> int:
    return len(list((out / "cells" / "answers").glob("*/*.json")))


def test_killed_grid_resumes_without_recomputing_finished_cells(tmp_path, mirror_dir, reference):
    """Stopped twice: by Ctrl-C (SIGINT) as soon as a model has answered a batch, then by SIGKILL once cells are
    finished. Ctrl-C stops the stage where it is - no batch is sent or waited for after it, so no cell finishes
    (before, the driver waited for every model's stages to end) - and keeps the answered batches; the next start
    does not ask them again, and the last one reuses the finished cells."""
    resumed = tmp_path / "resumed"
    proc = start(resumed, mirror_dir, MANY)
    deadline = time.time() + 900
    while not kept_batches(resumed) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    log, _ = proc.communicate(timeout=600)
    kept = kept_batches(resumed)
    assert proc.returncode == 130 and "interrupted: the cells finished" in log, log[-5000:]
    assert f"interrupted: 0 of 8 cells finished and stored under {resumed / 'cells'}, {kept} answered batches" in log
    assert kept >= 1 and not finished_cells(resumed)

    proc = start(resumed, mirror_dir, MANY)
    while not finished_cells(resumed) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    log, _ = proc.communicate()  # the run's local Ray dies with its process group
    asked = [re.search(r"(\d+) of (\d+) batches \((\d+) requests\) answered before", line)
             for line in log.splitlines() if "answered before this run stopped" in line]  # fmt: skip
    assert sum(int(m[1]) for m in asked) == kept and all(int(m[1]) < int(m[2]) for m in asked), log[-5000:]
    done_before = finished_cells(resumed)
    assert 0 < len(done_before) < 8, f"kill came too late or too early: {len(done_before)} cells finished"

    log = finish(start(resumed, mirror_dir, MANY))
    assert log.count("reusing finished cell") == len(done_before)
    assert kept_batches(resumed) == 0  # the answers a run used go once its cells are stored
    recomputed = [line for line in log.splitlines() if "decision=" in line and "cell " in line]
    assert len(recomputed) == 8 - len(done_before)
    assert finished_cells(resumed) == finished_cells(reference)

    keys = ["model", "partition", "method"]
    assert_same_partitions(resumed, reference)
    assert "seconds" not in pd.read_parquet(reference / "partitions.parquet").columns
    timings = pd.read_parquet(resumed / "timings.parquet")
    assert list(timings.columns) == [*keys, "seconds"] and len(timings) == 8 and (timings["seconds"] > 0).all()
    pd.testing.assert_frame_equal(
        sorted_table(resumed / "examples.parquet", [*keys, "record_id"]),
        sorted_table(reference / "examples.parquet", [*keys, "record_id"]),
    )


def submit(head, root: Path, log: Path, mirror: Path) -> subprocess.Popen:
    """``jobs/submit.sh --name resume --no-pull`` with the grid on 2 replicas and 2 scoring actors; its output
    (the submission id, then the job's log) goes to ``log``."""
    env = dict(os.environ, RAY_ADDRESS=head.dashboard, CONTAMRAY_OUTPUT_ROOT=str(root))
    env.pop("CONTAMRAY_JOBS_DRY_RUN", None)
    args = ["bash", str(REPO / "jobs" / "submit.sh"), "--name", "resume", "--no-pull", "+exp=base", *GRID, *MANY,
            f"data.mirror_dir={mirror}"]  # fmt: skip
    with open(log, "w") as out:
        return subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def submission_id(log: Path, proc: subprocess.Popen) -> str:
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        for line in log.read_text().splitlines():
            if line.startswith("submitted "):
                return line.split()[1].rstrip(":")
        time.sleep(0.5)
    pytest.fail(f"jobs/submit.sh printed no submission id: {log.read_text()[-3000:]}")


@pytest.mark.slow
def test_a_stopped_ray_job_resubmitted_reuses_its_stored_cells(tmp_path, mirror_dir, reference):
    with local_ray_head(8, '--resources={"contamray_driver": 1}', prefix="crjob") as head:
        root = tmp_path / "jobs"
        run_dir = root / "resume"
        first_log = tmp_path / "first.log"
        proc = submit(head, root, first_log, mirror_dir)
        job = submission_id(first_log, proc)
        deadline = time.time() + 900
        while not scored_cells(run_dir) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        # the Jobs SDK in this process: `ray job stop` would first spend seconds starting a CLI, while the
        # other cells of a stage are scored within moments of the first
        assert JobSubmissionClient(head.dashboard).stop_job(job)
        proc.wait(timeout=300)
        assert proc.returncode != 0, first_log.read_text()[-3000:]  # submit.sh reports the job STOPPED
        assert f"job {job}: STOPPED" in first_log.read_text(), first_log.read_text()[-3000:]
        finished, scored = finished_cells(run_dir), scored_cells(run_dir)
        # stopped mid-run: something stored, not everything reduced (cells of one stage are scored together, so
        # every cell may be scored by the time the job stops; their reduce is what the re-submission then runs)
        assert scored and len(finished) < 8, f"stopped too late or early: {len(scored)} scored, {len(finished)} done"
        assert not (run_dir / "partitions.parquet").exists()

        second_log = tmp_path / "second.log"
        proc = submit(head, root, second_log, mirror_dir)
        proc.wait(timeout=900)
        log = second_log.read_text()
        assert proc.returncode == 0, log[-5000:]
    assert log.count("reusing finished cell") == len(finished), log[-5000:]
    assert log.count("reusing scored cell") == len(scored - finished), log[-5000:]
    assert finished_cells(run_dir) == finished_cells(reference)
    assert_same_partitions(run_dir, reference)
