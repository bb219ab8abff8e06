"""The match pool of a corpus pass (``pipeline.match_pool``): Ray actors reading their own files, fed by ``ray.wait``.

On a local Ray with 2 CPUs: a pool started at one actor grows to two while files wait (each task made to last until
a second actor has started, as a large corpus file outlasts an actor's start), and its outputs, folded by
the driver's ``fold_stream``, equal the one-process scan of the same files (``scan_files``); a file on which the
actor's process dies every time (a real ``os._exit`` in the actor, as an out-of-memory kill does) is retried,
then reported as failed corpus rows naming it, and the other files' matches are all there; an actor that dies once,
after folding other files, has those files scanned again, each counted once.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from contamray.interrupts import RunInterrupted
from contamray.methods.base import get_method
from contamray.pipeline.actors import FileMatchWorker, Scanner, match_output, scan_files
from contamray.pipeline.corpus_scan import FoldedStream, fold_stream
from contamray.pipeline.match_pool import TASK_RETRIES, pooled_matches
from contamray.records import Record

pytestmark = pytest.mark.slow

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()
READ = {"format": "jsonl", "text_field": "text", "id_field": "id"}


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def records() -> list[Record]:
    return [
        Record(id=f"q{i}", partition="t/test", input=" ".join(f"{w}{i}" for w in WORDS), label="", reference="",
               task="question_answering", order=i)
        for i in range(6)
    ]  # fmt: skip


def corpus(folder: Path, files: int) -> list[str]:
    """``files`` JSONL files of 200 filler documents; file f plants record f % 6 once."""
    rows = records()
    paths = []
    for f in range(files):
        docs = [{"id": f"d{f}-{i}", "text": f"filler text {f} {i} " * 20} for i in range(200)]
        docs.append({"id": f"d{f}-plant", "text": f"page {f}: {rows[f % 6].input} end"})
        path = folder / f"part-{f:02d}.jsonl"
        path.write_text("".join(json.dumps(d) + "\n" for d in docs))
        paths.append(str(path))
    return paths


def setup(tmp_path: Path, files: int):
    method = get_method("ngram_overlap")
    cfg = method.make_config({"n": 8})
    index = method.build_index(records(), cfg)
    worker = {"indexes": [("c", "ngram8", "ngram_overlap", {"n": 8}, ray.put(index))], "read": READ, "batch_docs": 50}
    return method, cfg, index, worker, corpus(tmp_path, files)


def one_process(method: Any, cfg: Any, index: Any, paths: list[str]) -> FoldedStream:
    """The scan of ``paths`` without Ray: ``scan_files`` in this process, folded as the driver folds."""
    scanner = Scanner([("c", method, cfg, index)], 1 << 24)
    return fold_stream([match_output(b, r) for b, r in scan_files(scanner, paths, READ, 50)], {"c": (method, cfg)})


def test_the_pool_grows_from_one_actor_and_gives_the_one_process_scan(local_ray, tmp_path: Path) -> None:
    method, cfg, index, worker, paths = setup(tmp_path, 12)

    started = tmp_path / "started"
    started.mkdir()

    class Slow(FileMatchWorker):
        """Its tasks last until a second actor has started (at most 2 minutes), as a large corpus file outlasts an
        actor's start: a pool that never grows fails the test, however slow the machine."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            (started / self.actor).touch()

        def scan_into(self, paths: list[str]) -> str:
            deadline = time.monotonic() + 120
            while len(list(started.iterdir())) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            return super().scan_into(paths)

    outputs = list(pooled_matches([[p] for p in paths], worker, 1, 2, {}, worker_class=Slow))
    actors = {a for out in outputs for a in out["actor"]}
    # grown from one actor to two; each folds its tasks together and hands them over once: one output per actor
    assert len(actors) == 2 and len(outputs) == 2, actors
    pooled = fold_stream(outputs, {"c": (method, cfg)})
    expected = one_process(method, cfg, index, paths)
    assert pooled.folds["c"].rows() == expected.folds["c"].rows()
    assert {r["record_id"] for r in expected.folds["c"].rows()} == {f"q{i}" for i in range(6)}
    assert pooled.errors == expected.errors == []


def test_a_file_that_kills_its_actor_every_time_is_reported_failed_and_the_rest_is_scanned(
    local_ray, tmp_path: Path
) -> None:
    method, cfg, _, worker, paths = setup(tmp_path, 6)
    poison = paths[2]
    tries = tmp_path / "tries"

    class Dying(FileMatchWorker):
        def scan_into(self, paths: list[str]) -> str:
            if poison in paths:
                with open(tries, "a") as f:
                    f.write("x")
                os._exit(1)  # the worker process dies, as when the kernel kills it for memory
            return super().scan_into(paths)

    outputs = list(pooled_matches([[p] for p in paths], worker, 2, 2, {}, worker_class=Dying))
    folded = fold_stream(outputs, {"c": (method, cfg)})
    assert tries.read_text() == "x" * (TASK_RETRIES + 1)  # tried, retried on restarted actors, then given up
    (failed,) = folded.errors
    assert failed["where"] == poison and "died" in failed["error"]
    found = {r["record_id"] for r in folded.folds["c"].rows()}
    assert found == {f"q{i}" for i in (0, 1, 3, 4, 5)}  # every other file's planted record


def test_an_actor_restarted_between_tasks_has_its_folded_tasks_scanned_again(
    local_ray, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One actor folds files 0-3, then its process dies on file 4 (once): Ray restarts it and retries file 4, and
    the pool, seeing a new incarnation, scans files 0-3 again - nothing it had folded is lost or counted twice."""
    method, cfg, index, worker, paths = setup(tmp_path, 6)
    calls = tmp_path / "calls"
    died = tmp_path / "died"

    class DiesOnce(FileMatchWorker):
        def scan_into(self, paths: list[str]) -> str:
            with open(calls, "a") as f:
                f.write(paths[0] + "\n")
            if paths[0].endswith("part-04.jsonl") and not died.exists():
                died.touch()
                os._exit(1)
            return super().scan_into(paths)

    with caplog.at_level("WARNING", logger="contamray"):
        outputs = list(pooled_matches([[p] for p in paths], worker, 1, 1, {}, worker_class=DiesOnce))
    scanned = calls.read_text().split()
    assert scanned[:5] == paths[:5] and sorted(scanned[5:]) == sorted(paths[:6])  # 0-4, then 4 again and 0-3, 5
    assert "4 task(s) it had folded are scanned again" in caplog.text
    pooled = fold_stream(outputs, {"c": (method, cfg)}).folds["c"].rows()
    assert pooled == one_process(method, cfg, index, paths).folds["c"].rows()
    assert {r["record_id"] for r in pooled} == {f"q{i}" for i in range(6)}
    assert all(r["n_docs"] == 1 for r in pooled)  # each planted document counted once, not twice


def test_a_stopped_sweep_stops_folding_a_scan_at_the_next_batch(tmp_path: Path) -> None:
    """A sweep's job folds its scan in a thread Ctrl-C never reaches: ``interrupts.stop_all`` (the launcher's, on the
    signal) makes the fold raise ``RunInterrupted`` at the next batch instead of reading the corpus to its end."""
    from contamray import interrupts

    method, cfg, index, _, paths = setup(tmp_path, 3)
    scanner = Scanner([("c", method, cfg, index)], 1 << 24)
    read: list[int] = []

    def batches():  # one per file, as a pool's tasks give them
        for number, path in enumerate(paths):
            read.append(number)
            if number == 1:
                interrupts.stop_all()
            yield from (match_output(batch, rows) for batch, rows in scan_files(scanner, [path], READ, 50))

    interrupts.reset()
    try:
        with pytest.raises(RunInterrupted, match="corpus scan: stopped"):
            fold_stream(batches(), {"c": (method, cfg)})
    finally:
        interrupts.reset()
    assert read == [0, 1]
    assert one_process(method, cfg, index, paths).folds["c"].rows()  # not stopped: the same scan folds to its end
