"""A corpus scan killed mid-corpus resumes where it stopped (issue #16, item 2).

A real run of the entry point (13-gram overlap, 12 GSM8K rows) over six corpus files scanned one file per
pass (``ray.corpus_files_per_pass=1``), three of them holding a verbatim copy of a row, is killed with
SIGKILL as soon as two passes are stored, then started again with the same command: it must reuse the
stored passes (the log says how many), scan only the others, and find exactly the three plants. Each pass
is stored as the folded matches of the benchmark index (``cells/scans/<index>/<shard>.pkl``).
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

from contamray.pipeline.store import read_partitions
from tests.test_corpus_run import FILLER, REPO, doc, gsm8k_rows, overrides, plant  # noqa: F401 - a fixture

pytestmark = pytest.mark.slow

FILES = 6
PLANTED = {0: 0, 3: 1, 5: 2}  # file -> GSM8K row planted in it


def start(out: Path, corpus: Path, mirror: Path) -> subprocess.Popen:
    env = dict(os.environ, CONTAMRAY_LOG="INFO")
    env.pop("RAY_ADDRESS", None)
    args = [sys.executable, "-m", "contamray.run", *overrides(corpus, mirror), f"hydra.run.dir={out}"]
    return subprocess.Popen(
        args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def stored_passes(out: Path) -> list[Path]:
    return sorted((out / "cells" / "scans").glob("*/*.pkl"))


def test_a_killed_scan_resumes_after_its_stored_passes(tmp_path: Path, mirror_dir: Path, gsm8k_rows):  # noqa: F811
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for f in range(FILES):
        body = b"".join(doc(f"f{f}-{i}", f"{FILLER} {f} {i}") for i in range(300))
        if f in PLANTED:
            body += doc(f"f{f}-plant", plant(gsm8k_rows[PLANTED[f]]))
        (corpus / f"part-{f}.jsonl").write_bytes(body)
    out = tmp_path / "run"
    proc = start(out, corpus, mirror_dir)
    deadline = time.monotonic() + 600
    while len(stored_passes(out)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    first = proc.communicate()[0]
    kept = len(stored_passes(out))
    assert 2 <= kept < FILES, f"{kept} passes stored before the kill\n{first[-3000:]}"
    assert not (out / "partitions.parquet").exists()

    proc = start(out, corpus, mirror_dir)
    log = proc.communicate(timeout=900)[0]
    assert proc.returncode == 0, log[-6000:]
    scanned = re.findall(r"corpus pass (\d+)/6: \d+ file", log)  # its "matched by" line is the second of a pass
    assert len(scanned) == FILES - kept, log[-4000:]
    assert f"corpus scan: {kept} of {FILES} pass(es) reused from the result store" in log
    assert len(stored_passes(out)) == FILES
    examples = pd.read_parquet(out / "examples.parquet")
    found = set(examples.loc[examples["contaminated"].astype(bool), "record_id"])
    assert found == {gsm8k_rows[row].id for row in PLANTED.values()}
    (verdict,) = read_partitions(out).to_dict("records")
    assert verdict["rate"] == pytest.approx(3 / 12)
