"""Progress of engine passes, scoring and reducing (issue #14): the reporter's numbers on a fake clock,
and the log of one real pipeline run on the embedded model."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from contamray.pipeline.progress import INTERVAL, INTERVAL_ENV, Progress, default_interval, format_seconds

REPO = Path(__file__).resolve().parents[1]
LOGGER = "contamray.pipeline.progress"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_long_requests_go_to_the_engine_in_smaller_batches_so_progress_comes_often():
    """A stage's requests are batched by count and by work: 32 short scores are one batch, while shards of a
    sharded test on long rows (~1,000 tokens each) go 9 at a time - 32 of them were one batch of 6-8 CPU minutes
    before the first progress line. The batches keep every request once, in order, and depend on nothing else."""
    from contamray.engines.wire import Request, Sampling
    from contamray.pipeline.engine_pool import batched, guessed_tokens

    def score(i: int, chars: int) -> tuple[str, Request]:
        return "cell", Request(key=f"s{i}", record_ids=(str(i),), kind="score", text="x" * chars)

    short = [score(i, 200) for i in range(40)]  # 50 tokens each
    assert [len(b) for b in batched(short, 32, 8192)] == [32, 8]
    shards = [score(i, 4000) for i in range(32)]  # 1,000 tokens each
    assert [len(b) for b in batched(shards, 32, 8192)] == [9, 9, 9, 5]
    samples = Sampling(max_tokens=24, n=10)
    generate = Request(key="g", record_ids=("0",), kind="generate", text="x" * 400, sampling=samples)
    assert guessed_tokens(generate) == 100 + 240
    huge = [score(0, 100_000), *short[:3]]
    assert [len(b) for b in batched(huge, 32, 8192)] == [1, 3]  # a request past the budget goes alone
    for items in (short, shards, huge):
        assert [item for batch in batched(items, 32, 8192) for item in batch] == items
        assert batched(items, 32, 8192) == batched(list(items), 32, 8192)


def test_rate_and_eta_after_30_of_120_in_10_seconds(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock()
    progress = Progress("model m stage 0", 120, interval=10, clock=clock, tty=False)
    assert progress.eta is None and progress.rate == 0.0
    clock.now = 10.0
    progress.update(30, tokens=600)
    assert progress.rate == pytest.approx(3.0)
    assert progress.eta == pytest.approx(30.0)
    assert progress.token_rate == pytest.approx(60.0)
    assert logged(caplog) == ["model m stage 0: 30/120 requests (25%), 3.0 requests/s, 60 tokens/s, ETA 30s"]


def test_items_of_unequal_cost_give_the_eta_of_the_work_left(caplog):
    """An engine pass of 100 short scores (100 guessed tokens each) then 20 sampling requests (5,000 each): after the
    scores, in 10 s, a count of requests would say 2 s left; the work left says 100 s, and the line says how much
    of the work is done. On a terminal the bar shows the same ETA (tqdm's own, by items, is left out)."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock()
    progress = Progress("model m stage 0", 120, interval=0, clock=clock, tty=False, work=100 * 100 + 20 * 5000)
    assert progress.eta is None
    clock.now = 10.0
    progress.update(100, tokens=10_000, work=100 * 100)
    assert progress.rate == pytest.approx(10.0)  # requests/s, as before
    assert progress.eta == pytest.approx(100_000 / (10_000 / 10))
    clock.now = 510.0
    progress.update(10, tokens=50_000, work=10 * 5000)
    assert progress.eta == pytest.approx(50_000 / (60_000 / 510))
    progress.grow(2, work=2 * 5000)  # a lost batch sent again
    assert progress.work_total == pytest.approx(120_000)
    assert logged(caplog) == [
        "model m stage 0: 100/120 requests (83%; 9% of the work), 10.0 requests/s, 1,000 tokens/s, ETA 1m40s",
        "model m stage 0: 110/120 requests (92%; 55% of the work), 0.2 requests/s, 118 tokens/s, ETA 7m05s",
    ]
    stream = io.StringIO()
    bar = Progress("model m stage 1", 4, tty=True, stream=stream, clock=clock, work=400)
    clock.now += 2.0
    bar.update(1, tokens=50, work=100)
    bar.bar.refresh()
    assert "ETA 6s" in stream.getvalue()
    bar.close()


def test_a_line_every_interval_and_one_at_the_end(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock()
    with Progress("scoring m", 120, unit="chunks", interval=10, clock=clock, tty=False) as progress:
        for now, n in [(10, 30), (15, 10), (20, 20), (25, 30), (40, 30)]:
            clock.now = now
            progress.update(n)
    assert logged(caplog) == [
        "scoring m: 30/120 chunks (25%), 3.0 chunks/s, ETA 30s",  # t=10
        # t=15: 5 s after the last line, none
        "scoring m: 60/120 chunks (50%), 3.0 chunks/s, ETA 20s",  # t=20
        # t=25: none
        "scoring m: 120/120 chunks (100%), 3.0 chunks/s, ETA 0s",  # t=40
        "scoring m: done 120/120 chunks in 40s, 3.0 chunks/s",
    ]


def test_a_pass_that_stops_early_says_so_once(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock()
    progress = Progress("p", 120, interval=1000, clock=clock, tty=False)
    assert progress.line() == "p: 0/120 requests (0%), 0.0 requests/s, ETA ?"
    clock.now = 125.0
    progress.update(50)
    progress.close()
    progress.close()
    assert logged(caplog) == ["p: stopped at 50/120 requests in 2m05s, 0.4 requests/s"]


def test_on_a_terminal_a_bar_is_drawn_and_the_final_line_logged(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    stream = io.StringIO()
    with Progress("model m stage 1", 8, tty=True, stream=stream) as progress:
        for _ in range(4):
            progress.update(2, tokens=10)
    assert "model m stage 1" in stream.getvalue() and "8/8" in stream.getvalue()
    lines = logged(caplog)
    assert len(lines) == 1 and lines[0].startswith("model m stage 1: done 8/8 requests in ")


def test_format_seconds_and_the_interval_setting(monkeypatch):
    assert [format_seconds(s) for s in (0, 42.4, 60, 245, 3600, 3725)] == ["0s", "42s", "1m00s", "4m05s", "1h00m",
                                                                            "1h02m"]
    monkeypatch.delenv(INTERVAL_ENV, raising=False)
    assert default_interval() == INTERVAL
    monkeypatch.setenv(INTERVAL_ENV, "0")
    assert Progress("p", 1, tty=False).interval == 0.0


PROGRESS_LINE = re.compile(r"model smollm2_135m stage (\d+) on smollm2_135m: (done )?(\d+)/(\d+) requests")


@pytest.mark.slow
def test_a_pipeline_run_logs_engine_progress_to_done_equals_total(tmp_path, mirror_dir):
    """Guided prompting on 4 ARC rows: 8 requests (guided + general) in batches of 2, a line per batch."""
    env = dict(os.environ, CONTAMRAY_LOG="INFO", **{INTERVAL_ENV: "0"})
    env.pop("RAY_ADDRESS", None)
    args = [
        sys.executable, "-m", "contamray.run", "+exp=base", "model=[smollm2_135m]", "benchmark=[arc_challenge]",
        "method=[guided_prompting]", "methods.guided_prompting.max_tokens=8", "corpus=none", "run.limit=4",
        "ray.num_cpus=2", "ray.request_batch_size=2", f"data.mirror_dir={mirror_dir}", f"hydra.run.dir={tmp_path}",
    ]
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    lines = [m.groups() for m in PROGRESS_LINE.finditer(log)]
    running = [int(done) for stage, final, done, total in lines if not final and stage == "0"]
    finals = [(int(done), int(total)) for stage, final, done, total in lines if final and stage == "0"]
    assert running == [2, 4, 6, 8]  # one line per batch of 2 (interval 0), done never above total
    assert finals == [(8, 8)]
    assert re.search(r"scoring smollm2_135m: done 1/1 chunks", log)
    assert re.search(r"reducing smollm2_135m: done 1/1 cells", log)
