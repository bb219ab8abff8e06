"""Workers lost mid-run (issue #17, item 1): a corpus match actor and a scoring actor killed.

Each run is a real one (``contamray.run.run`` on a local Ray): 13-gram overlap and GPT-4 substrings for 640
GSM8K rows against six corpus files (14 MB) with three planted rows, in many small match batches, then ten
scoring chunks. A thread kills the worker process of a match actor while it runs a task (its process title
says so), then watches Ray's state API for the first ``ScoreWorker`` actor and kills its worker process
(SIGKILL: what an OOM kill or a lost machine does). Ray restarts the actors and retries their work (the match
pool's task, Ray Data's batches); the run must finish with the same ``examples.parquet`` (wall-clock columns
aside) and the same bytes of ``partitions.parquet`` as the undisturbed run of the same config. (A lost Serve
replica: ``test_hosting.py``; a lost node: ``test_node_loss.py``.)
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import ray
from ray.util.state import list_actors

from contamray.pipeline.plan import build_plan
from contamray.pipeline.runner import load_benchmarks
from contamray.run import run
from tests.test_config import composed
from tests.test_corpus_run import FILLER, doc, plant

pytestmark = pytest.mark.slow

STATE: dict[str, str] = {}
# a match task must last long enough to be killed mid-way: 300 documents of ~7.6 KB a file (2.3 MB), ~0.2 s of
# 13-gram and GPT-4-substring matching per file on 2 cores
LONG_FILLER = (" ".join([FILLER] * 40),)
WALL_CLOCK = ("engine_seconds",)


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    context = ray.init(num_cpus=4, include_dashboard=True, log_to_driver=False)
    STATE["address"] = f"http://{context.dashboard_url}"
    yield
    ray.shutdown()


def write_corpus(folder: Path, rows: list, docs: int = 300, filler: tuple[str, ...] = (FILLER,)) -> Path:
    """Six corpus files of ``docs`` documents (the ``filler`` texts in turn, numbered); ``rows[0..2]`` planted
    once each, in files 0, 2 and 4."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(6):
        body = b"".join(doc(f"f{f}-{i}", f"{filler[(f * docs + i) % len(filler)]} {f} {i}") for i in range(docs))
        if f % 2 == 0:
            body += doc(f"f{f}-plant", plant(rows[f // 2]))
        (folder / f"part-{f}.jsonl").write_bytes(body)
    return folder


def config(out: Path, corpus: Path, mirror: Path):
    cfg = composed(
        "model=[]", "benchmark=[gsm8k]", "run.limit=640", "method=[ngram13,gpt4_substring]", "corpus=files",
        f"corpus.paths=[{corpus}]", "corpus.id_field=id", "ray.corpus_batch_size=40", "ray.corpus_files_per_pass=6",
        f"data.mirror_dir={mirror}",
    )  # fmt: skip
    cfg.run.output_dir = str(out)
    return cfg


def tables(out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The run's examples (sorted, wall-clock aside) and partitions."""
    examples = pd.read_parquet(out / "examples.parquet").drop(columns=list(WALL_CLOCK), errors="ignore")
    examples = examples.sort_values(["method", "benchmark", "record_id"]).reset_index(drop=True)
    return examples, pd.read_parquet(out / "partitions.parquet")


def busy_match_worker(raylet: int | None = None) -> psutil.Process | None:
    """A process running a match pool task right now (Ray titles it ``ray::FileMatchWorker.scan`` while the task
    runs), a child of the ``raylet`` pid when given (that node's worker); polled every few ms, so a kill lands
    mid-task, which Ray's state API, a second per query on 2 cores, cannot promise for tasks of a fraction of one."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if (proc.info["cmdline"] or [""])[0].startswith("ray::FileMatchWorker.scan") and (
                raylet is None or proc.ppid() == raylet
            ):
                return proc
        except psutil.Error:  # gone meanwhile
            continue
    return None


def kill_busy_match_worker(killed: list[str], deadline: float) -> None:
    """SIGKILL the worker process of a match actor while it runs a task."""
    while time.monotonic() < deadline:
        proc = busy_match_worker()
        if proc is not None:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.Error:  # it finished meanwhile: the next one
                continue
            killed.append(f"FileMatchWorker pid {proc.pid}")
            return
        time.sleep(0.005)


def kill_first(class_part: str, killed: list[str], deadline: float) -> None:
    """SIGKILL the worker process of the first alive actor whose class name holds ``class_part``."""
    while time.monotonic() < deadline:
        alive = list_actors(
            address=STATE["address"], filters=[("state", "=", "ALIVE")], detail=True, raise_on_missing_output=False
        )
        found = [a for a in alive if class_part in (a.class_name or "") and a.pid]
        if found:
            time.sleep(0.3)  # at work, not just started
            try:
                os.kill(found[0].pid, signal.SIGKILL)
            except ProcessLookupError:  # it finished its work meanwhile: the next one
                continue
            killed.append(f"{found[0].class_name} {found[0].actor_id}")
            return
        time.sleep(0.05)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, mirror_dir):
    """The corpus, with three of the very rows the runs will load planted."""
    cfg = config(Path("unused"), mirror_dir, mirror_dir)
    rows = load_benchmarks(build_plan(cfg), ["gsm8k"])[0]["gsm8k"]
    return write_corpus(tmp_path_factory.mktemp("corpus"), rows, filler=LONG_FILLER)


def test_a_killed_match_actor_and_scoring_actor_change_nothing(local_ray, tmp_path, mirror_dir, corpus):
    run(config(tmp_path / "undisturbed", corpus, mirror_dir))
    killed: list[str] = []

    def killer() -> None:
        deadline = time.monotonic() + 600
        kill_busy_match_worker(killed, deadline)
        kill_first("ScoreWorker", killed, deadline)

    thread = threading.Thread(target=killer)
    thread.start()
    run(config(tmp_path / "disturbed", corpus, mirror_dir))
    thread.join()
    # a match actor of the pool mid-task, then a scoring actor (Ray Data's)
    assert len(killed) == 2 and "MatchWorker" in killed[0] and "ScoreWorker" in killed[1], killed
    assert (tmp_path / "undisturbed" / "partitions.parquet").read_bytes() == (
        tmp_path / "disturbed" / "partitions.parquet"
    ).read_bytes()
    before, after = tables(tmp_path / "undisturbed")[0], tables(tmp_path / "disturbed")[0]
    pd.testing.assert_frame_equal(before, after)
    found = set(after.loc[after["contaminated"].fillna(False).astype(bool), "record_id"])
    assert len(found) == 3
