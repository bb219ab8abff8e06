"""Workers lost mid-run (issue #17, item 1): a corpus match actor and a scoring actor killed by their actor id.

Each run is a real one (``contamray.run.run`` on a local Ray): 13-gram overlap and GPT-4 substrings for 640
GSM8K rows against six corpus files with three planted rows, in many small match batches, then ten scoring
chunks. A thread watches Ray's state API and kills the worker process of the first ``MatchWorker`` actor
once it is alive, then of the first ``ScoreWorker`` actor (SIGKILL: what an OOM kill or a lost machine
does). Ray Data restarts its actors and retries their batches; the run must finish with the same
``examples.parquet`` (wall-clock columns aside) and the same bytes of ``partitions.parquet`` as the
undisturbed run of the same config. (A lost Serve replica: ``test_hosting.py``; a lost node:
``test_node_loss.py``.)
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
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
    cfg = config(Path("unused"), Path("unused"), mirror_dir)
    rows = load_benchmarks(build_plan(cfg), ["gsm8k"])[0]["gsm8k"]
    return write_corpus(tmp_path_factory.mktemp("corpus"), rows)


def test_a_killed_match_actor_and_scoring_actor_change_nothing(local_ray, tmp_path, mirror_dir, corpus):
    run(config(tmp_path / "undisturbed", corpus, mirror_dir))
    killed: list[str] = []

    def killer() -> None:
        deadline = time.monotonic() + 600
        kill_first("MatchWorker", killed, deadline)
        kill_first("ScoreWorker", killed, deadline)

    thread = threading.Thread(target=killer)
    thread.start()
    run(config(tmp_path / "disturbed", corpus, mirror_dir))
    thread.join()
    # a match actor reading its own files (FileMatchWorker, the default) or fed blocks by read tasks (MatchWorker)
    classes = [k.split("(")[-1].split(")")[0].removeprefix("File") for k in killed]
    assert classes == ["MatchWorker", "ScoreWorker"], killed
    assert (tmp_path / "undisturbed" / "partitions.parquet").read_bytes() == (
        tmp_path / "disturbed" / "partitions.parquet"
    ).read_bytes()
    before, after = tables(tmp_path / "undisturbed")[0], tables(tmp_path / "disturbed")[0]
    pd.testing.assert_frame_equal(before, after)
    found = set(after.loc[after["contaminated"].fillna(False).astype(bool), "record_id"])
    assert len(found) == 3
