"""Progress of a long pass, for the person waiting on it: done / total, rate, tokens/s and an ETA.

One ``Progress`` per (model, stage) engine pass, per scoring phase and per reduce phase. On a terminal
(stderr is a TTY) it draws a tqdm bar; otherwise (a log file, a CI job, a Ray job's captured output)
it writes a log line through this module's logger at most every ``interval`` seconds (30, or
``$CONTAMRAY_PROGRESS_SECONDS``) as items arrive, and one final line when the pass ends, e.g.::

    model smollm2_135m stage 0 on smollm2_135m: 30/120 requests (25%), 3.0 requests/s, 450 tokens/s, ETA 30s
    model smollm2_135m stage 0 on smollm2_135m: done 120/120 requests in 40s, 3.0 requests/s, 450 tokens/s

The final line is logged in both modes, so a run's log always records what each pass did and how
fast. The rate is the mean since the start (items done / seconds elapsed) and the ETA the items left
at that rate: engine batches arrive in bursts, and a mean over the whole pass is the steadier guess.

Items are not always alike: an engine pass mixes scoring requests of a hundred tokens with sampling requests
of thousands (CDD's 50 samples of 100 tokens per row), sent in the order the cells ask, so a count of requests
done says little about the time left (measured on a 2-core run: "ETA 6m32s" after the short requests, 55 minutes
before the end). Such a pass gives each item its guessed cost (``work``: an engine pass guesses tokens, prompt
plus samples x max_tokens, ``engine_pool.guessed_tokens``) and the ETA is the work left at the work rate so far;
the line then also says what share of the work is done::

    model m stage 0 on m: 255/1174 requests (22%; 4% of the work), 0.4 requests/s, 162 tokens/s, ETA 52m10s

The first engine pass of a model also counts the engine actors' start-up (the first batch waits for
the model to load), so its first estimates are pessimistic; later stages reuse the loaded actors.
The clock is injectable (``clock``), so the numbers are testable without waiting.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import IO, Any

log = logging.getLogger(__name__)

INTERVAL = 30.0  # seconds between two log lines of one pass (when stderr is not a terminal)
INTERVAL_ENV = "CONTAMRAY_PROGRESS_SECONDS"  # overrides INTERVAL (0: a line at every update)


def default_interval() -> float:
    """Seconds between log lines: ``$CONTAMRAY_PROGRESS_SECONDS``, else ``INTERVAL``."""
    value = os.environ.get(INTERVAL_ENV, "").strip()
    return float(value) if value else INTERVAL


def format_seconds(seconds: float) -> str:
    """``42s``, ``4m05s``, ``1h02m``: short enough for a log line."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """Items done out of ``total`` since construction, with rate and ETA; a context manager.

    ``update(n, tokens)`` records ``n`` more items (and the engine tokens they cost, for tokens/s);
    ``close()`` (or leaving the ``with`` block) logs the final line. ``tty`` forces the mode (default:
    whether ``stream``, stderr by default, is a terminal).
    """

    def __init__(
        self,
        name: str,
        total: int,
        unit: str = "requests",
        *,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        tty: bool | None = None,
        stream: IO[str] | None = None,
        work: float | None = None,
    ) -> None:
        self.name, self.total, self.unit = name, int(total), unit
        # the items' summed guessed cost, when they differ (see the module docstring); None: items are alike
        self.work_total = float(work) if work else None
        self.work_done = 0.0
        self.interval = default_interval() if interval is None else float(interval)
        self.clock = clock
        self.done, self.tokens = 0, 0
        self.started = self.last_logged = clock()
        self.closed = False
        stream = stream if stream is not None else sys.stderr
        self.bar: Any = None
        use_bar = tty if tty is not None else _is_tty(stream)
        if use_bar:
            from tqdm import tqdm

            # with a work total tqdm's own remaining time (items left at the item rate) would contradict ours: the bar
            # shows ours in its postfix instead
            fmt = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]" if self.work_total else None
            self.bar = tqdm(total=self.total, desc=name, unit=f" {unit}", file=stream, dynamic_ncols=True,
                            bar_format=fmt)

    @property
    def elapsed(self) -> float:
        return max(0.0, self.clock() - self.started)

    @property
    def rate(self) -> float:
        """Items per second since the start (0 before any time has passed)."""
        elapsed = self.elapsed
        return self.done / elapsed if elapsed > 0 else 0.0

    @property
    def token_rate(self) -> float:
        elapsed = self.elapsed
        return self.tokens / elapsed if elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds left at the mean rate so far - of work when the items' costs are given, else of items; None
        while nothing is done (no rate to go by)."""
        elapsed = self.elapsed
        if self.work_total is not None:
            if self.work_done <= 0 or elapsed <= 0:
                return None
            return max(0.0, self.work_total - self.work_done) * elapsed / self.work_done
        rate = self.rate
        return max(0, self.total - self.done) / rate if rate > 0 else None

    def grow(self, n: int, work: float = 0.0) -> None:
        """``n`` more items to do than counted at the start (work lost and done again), costing ``work``."""
        self.total += int(n)
        if self.work_total is not None:
            self.work_total += float(work)
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.refresh()

    def update(self, n: int, tokens: int = 0, work: float = 0.0) -> None:
        """``n`` more items done, which cost the engine ``tokens`` and were guessed at ``work``."""
        self.done += int(n)
        self.tokens += int(tokens)
        self.work_done += float(work)
        if self.bar is not None:
            postfix = [f"{self.token_rate:,.0f} tokens/s"] if self.tokens else []
            if self.work_total is not None:
                eta = self.eta
                postfix.append(f"ETA {format_seconds(eta) if eta is not None else '?'}")
            if postfix:
                self.bar.set_postfix_str(", ".join(postfix), refresh=False)
            self.bar.update(int(n))
            return
        now = self.clock()
        if now - self.last_logged >= self.interval:
            self.last_logged = now
            log.info("%s", self.line())

    def line(self) -> str:
        """The progress line as logged now."""
        pct = f"{100 * self.done / self.total:.0f}%" if self.total else ""
        if self.work_total:
            pct += f"; {min(100.0, 100 * self.work_done / self.work_total):.0f}% of the work"
        pct = f" ({pct})" if pct else ""
        eta = self.eta
        return (
            f"{self.name}: {self.done}/{self.total} {self.unit}{pct}, {self._rates()}, "
            f"ETA {format_seconds(eta) if eta is not None else '?'}"
        )

    def final_line(self) -> str:
        state = "done" if self.done >= self.total else "stopped at"
        return (
            f"{self.name}: {state} {self.done}/{self.total} {self.unit} in {format_seconds(self.elapsed)}, "
            f"{self._rates()}"
        )

    def _rates(self) -> str:
        rates = f"{self.rate:.1f} {self.unit}/s"
        return rates + (f", {self.token_rate:,.0f} tokens/s" if self.tokens else "")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.bar is not None:
            self.bar.close()
        log.info("%s", self.final_line())

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_tty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False
