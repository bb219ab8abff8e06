"""A real run over corpus files on disk: bad files are reported and skipped, and the cache follows the files.

The entry point (``python -m contamray.run``) runs 13-gram overlap for 12 GSM8K rows against a
directory of corpus files in which three rows are planted verbatim: one in a clean jsonl file, one
after a broken line, a line of invalid UTF-8 and a row without ``text`` in a second file, and one
in a gzip file that is cut short after it (a fourth, planted after the cut, is never read). The run
must finish, name every bad line by path and line number (in its log and in ``corpus_errors.jsonl``), say in
its report what the verdicts do not cover, and find exactly the three readable plants; its verdict says what it
does not cover, up to which share of the corpus' bytes. A second run that finds the cell scored but not reduced
says it too, and a "clean" (a partition threshold above the rate found) over a corpus so much of which may be
unread is inconclusive. After one more document is appended to a corpus file (same config, same paths), the
cell is recomputed and finds the new plant too, scanning that file again and reusing the stored passes
of the other two (one pass per file here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from contamray.experiments import CONF_DIR
from contamray.pipeline.plan import build_plan
from contamray.pipeline.runner import load_benchmarks
from contamray.pipeline.store import read_partitions

REPO = Path(__file__).resolve().parents[1]
FILLER = (
    "The council said the new bridge would open in the spring after two years of delays caused by "
    "flooding and a shortage of steel, and residents welcomed the news at a meeting on Tuesday."
)


def overrides(corpus_dir: Path, mirror: Path) -> list[str]:
    return [
        "+exp=base", "benchmark=[gsm8k]", "method=[ngram13]", "run.limit=12", "corpus=files",
        f"corpus.paths=[{corpus_dir}]", "corpus.id_field=id", f"data.mirror_dir={mirror}", "ray.num_cpus=2",
        "ray.corpus_files_per_pass=1",  # a pass per file: a changed file is scanned again, not the others
    ]


def run(out: Path, corpus_dir: Path, mirror: Path, *extra: str) -> str:
    env = dict(os.environ, CONTAMRAY_LOG="INFO")
    env.pop("RAY_ADDRESS", None)
    args = [sys.executable, "-m", "contamray.run", *overrides(corpus_dir, mirror), *extra, f"hydra.run.dir={out}"]
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    return log


def doc(doc_id: str, text: str) -> bytes:
    return json.dumps({"id": doc_id, "text": text}).encode() + b"\n"


@pytest.fixture(scope="module")
def gsm8k_rows(mirror_dir: Path) -> list:
    """The very rows the run will load (same config, same sampling)."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        # any existing corpus path: the plan checks it resolves to files; only the rows are read here
        cfg = compose(config_name="config", overrides=overrides(mirror_dir, mirror_dir))
    cfg.run.output_dir = "unused"
    records, _ = load_benchmarks(build_plan(cfg), ["gsm8k"])
    return records["gsm8k"]


def plant(record) -> str:
    return f"{FILLER}\n{record.input}\n{record.label}\n{FILLER}"


def bad_corpus(corpus: Path, r: list) -> Path:
    """Rows 0-2 of ``r`` planted in three files, beside a broken line, invalid UTF-8, a row without ``text`` and
    a gzip file cut short (row 3 planted after the cut)."""
    corpus.mkdir()
    (corpus / "a.jsonl").write_bytes(doc("a-0", FILLER) + doc("a-1", plant(r[0])))
    (corpus / "b.jsonl").write_bytes(
        b'{"id": "b-0", "text": "no closing brace\n'
        + b'{"id": "b-1", "text": "caf\xe9 au lait"}\n'
        + json.dumps({"id": "b-2", "body": FILLER}).encode() + b"\n"
        + doc("b-3", plant(r[1]))
    )
    gz = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = gz.compress(doc("c-0", plant(r[2]))) + gz.flush(zlib.Z_FULL_FLUSH)
    tail = gz.compress(doc("c-1", plant(r[3])) * 50) + gz.flush(zlib.Z_FULL_FLUSH)
    (corpus / "c.jsonl.gz").write_bytes(head + tail[: len(tail) // 2])
    return corpus


def test_bad_corpus_files_are_skipped_and_the_cache_follows_the_files(tmp_path: Path, mirror_dir: Path, gsm8k_rows):
    corpus = bad_corpus(tmp_path / "corpus", gsm8k_rows)
    r = gsm8k_rows
    out = tmp_path / "run"
    log = run(out, corpus, mirror_dir)
    skipped = [json.loads(line) for line in (out / "corpus_errors.jsonl").read_text().splitlines()]
    assert [(e["where"], e["error"].split(" (")[0]) for e in skipped] == [
        (f"{corpus}/b.jsonl:1", "not a JSON line"),
        (f"{corpus}/b.jsonl:2", "not valid UTF-8"),
        (f"{corpus}/b.jsonl:3", "no field 'text'"),
        (f"{corpus}/c.jsonl.gz:2", "the file is truncated or corrupt after line 1"),
    ]
    assert f"corpus: skipped {corpus}/b.jsonl:1: not a JSON line" in log
    assert "corpus: 4 bad row(s) skipped, the scan went on with the rest" in log
    # the report says what the verdicts do not cover: the rows skipped, and the file read only in part (row 3's
    # plant was after the cut: "clean" for it means "not found in what was read")
    report = (out / "report.md").read_text()
    assert "## Corpus documents not read" in report
    assert (f"3 corpus row(s) could not be read and were skipped; 1 corpus file(s) were read only in part or not at "
            f"all ({corpus}/c.jsonl.gz)") in report  # fmt: skip
    page = (out / "report.html").read_text()
    assert "Notes" in page and f"({corpus}/c.jsonl.gz)" in page
    examples = pd.read_parquet(out / "examples.parquet")
    found = set(examples.loc[examples["contaminated"].astype(bool), "record_id"])
    assert found == {r[0].id, r[1].id, r[2].id}
    assert len(examples) == 12 and not examples["error"].fillna("").astype(bool).any()
    # its cost: the index build and the matching, timed in the match workers, shared by its examples
    (verdict,) = read_partitions(out).to_dict("records")
    assert verdict["engine_tokens"] == 0 and verdict["seconds"] > 0
    details = verdict["details"] if isinstance(verdict["details"], dict) else json.loads(verdict["details"])
    # the verdict itself says what it does not cover, so a run that reuses the cell says it too
    sizes = {name: (corpus / name).stat().st_size for name in ("a.jsonl", "b.jsonl", "c.jsonl.gz")}
    share = sizes["c.jsonl.gz"] / sum(sizes.values())  # the cut file counts whole: an upper bound
    assert (details["corpus_rows_skipped"], details["corpus_files_unread"]) == (3, [f"{corpus}/c.jsonl.gz"])
    assert (details["corpus_unread_bytes"], details["corpus_bytes"]) == (sizes["c.jsonl.gz"], sum(sizes.values()))
    assert details["corpus_unread_share"] == pytest.approx(share) and share > 0.05
    assert details["summary"].endswith(f"; 3 corpus row(s) skipped, 1 file(s) read in part or not at all (up to "
                                       f"{100 * share:.3g} % of the corpus' bytes) (corpus_errors.jsonl)")  # fmt: skip
    assert verdict["decision"] == "contaminated"  # found is found, whatever was not read
    assert examples["engine_seconds"].gt(0).all()
    assert examples["engine_seconds"].sum() == pytest.approx(verdict["seconds"])

    # a run that finds the cell scored but not reduced (an interrupted run) scans nothing, and its verdict says
    # what the scan that scored the cell lost (stored beside the examples)
    (stored,) = (out / "cells").glob("*/verdict.json")
    stored.unlink()
    log = run(out, corpus, mirror_dir)
    assert "reusing scored cell" in log and "corpus pass" not in log
    (reused,) = read_partitions(out).to_dict("records")
    assert "1 file(s) read in part or not at all (up to" in str(reused["details"])

    # a "clean" over a corpus a third of which may not have been read cannot stand: inconclusive, naming the key
    clean = tmp_path / "clean"
    run(clean, corpus, mirror_dir, "methods.ngram13.partition_threshold=0.5")  # 3 of 12 found: below it
    (undecided,) = read_partitions(clean).to_dict("records")
    assert undecided["decision"] == "inconclusive" and not undecided["contaminated"], undecided
    assert f"up to {100 * share:.3g} % of the corpus' bytes, more than corpus.max_unread = 0.05" in undecided["reason"]
    assert "_inconclusive_" in (clean / "report.md").read_text()

    with (corpus / "a.jsonl").open("ab") as fh:  # same paths, same config: new content
        fh.write(doc("a-2", plant(r[4])))
    log = run(out, corpus, mirror_dir)
    assert "reusing finished cell" not in log
    assert "corpus pass 1/3: 1 file(s)" in log and "corpus pass 2/3" not in log  # a.jsonl only
    assert "corpus scan: 2 of 3 pass(es) reused from the result store" in log
    assert len((out / "corpus_errors.jsonl").read_text().splitlines()) == 4  # the reused passes' bad rows too
    examples = pd.read_parquet(out / "examples.parquet")
    found = set(examples.loc[examples["contaminated"].astype(bool), "record_id"])
    assert found == {r[0].id, r[1].id, r[2].id, r[4].id}


def test_match_actors_reading_their_own_files_give_what_read_tasks_feed_them(
    tmp_path: Path, mirror_dir: Path, gsm8k_rows
):
    """``ray.corpus_read``: actors (each match actor reads whole files, the default) and tasks (Ray Data read
    tasks parse the files into blocks any actor matches) find the same documents and report the same bad rows,
    the files of a pass spread over two actors here (``ray.corpus_files_per_pass=3``)."""
    corpus = bad_corpus(tmp_path / "corpus", gsm8k_rows)
    for mode in ("actors", "tasks"):
        run(tmp_path / mode, corpus, mirror_dir, f"ray.corpus_read={mode}", "ray.corpus_files_per_pass=3",
            "ray.match_concurrency=2")  # fmt: skip
    actors, tasks = tmp_path / "actors", tmp_path / "tasks"
    assert (actors / "partitions.parquet").read_bytes() == (tasks / "partitions.parquet").read_bytes()
    assert (actors / "corpus_errors.jsonl").read_text() == (tasks / "corpus_errors.jsonl").read_text()
    assert len((actors / "corpus_errors.jsonl").read_text().splitlines()) == 4
    wall_clock = ["engine_seconds"]
    a = pd.read_parquet(actors / "examples.parquet").drop(columns=wall_clock).sort_values("record_id")
    t = pd.read_parquet(tasks / "examples.parquet").drop(columns=wall_clock).sort_values("record_id")
    pd.testing.assert_frame_equal(a.reset_index(drop=True), t.reset_index(drop=True))
    assert set(a.loc[a["contaminated"].astype(bool), "record_id"]) == {r.id for r in gsm8k_rows[:3]}
