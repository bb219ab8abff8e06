"""Scoring texts longer than a context window with plain ``score`` requests (sliding window, stride).

Oren et al. (2023) score a long token sequence in windows of ``context_len`` tokens that start every
``stride`` tokens; the first window scores all its tokens, every later window only its last
``stride`` tokens (the "new" ones), each seen with ``context_len - stride`` tokens of context. The
engines here take *texts* and return per-token log-probabilities of the whole text, so a window is
sent as two texts:

- the window text ``text[start:end]`` (context + new part), and
- its context ``text[start:new_start]`` alone.

If the context has ``m`` tokens, its score has ``m - 1`` values and the window's first ``m - 1`` values
are the same positions; the new part's log-probabilities are the window's values from index ``m - 1``
on (``assemble``). The cut between context and new part is placed at the start of a whitespace run,
where byte-level BPE and SentencePiece tokenizers split anyway (a space belongs to the *following*
word), so the context's tokens are a prefix of the window's tokens and every token of the text is
scored exactly once. A text without whitespace near a cut (e.g. Chinese) is cut at a character;
then a token spanning the cut can be split differently, a difference of at most one token.

Where the windows go needs token counts, which only the model's tokenizer knows. A text whose UTF-8
length plus ``SPECIAL_TOKENS`` is at most ``context_len`` surely fits (a token covers at least one
byte) and is sent whole at once. Otherwise each piece of it (one benchmark example) is sent first as
a *probe* - a score request whose ``num_tokens`` gives the piece's token count - and the windows are
planned from those counts in the next stage: the token position of a character is interpolated
linearly inside its piece, and window sizes are taken ``FILL`` (97 %) of the configured ones, so that
the estimate's error does not push a window past ``context_len``. The real size of every window is
known after scoring and reported (``Scored.max_window_tokens``).

Costs: the context texts are scored a second time (about ``(context_len - stride) / stride`` extra,
i.e. +100 % of the windowed part with the paper's 2048/1024; vLLM's prefix cache serves most of it),
and a text that needs probes takes one more engine pass. Texts that surely fit cost nothing extra.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from contamray.methods.base import Output, Request

SPECIAL_TOKENS = 4  # BOS / EOS / a SentencePiece dummy prefix: tokens that cover no byte of the text
FILL = 0.97


def surely_fits(text: str, context_len: int) -> bool:
    """True when ``text`` cannot have more than ``context_len`` tokens (>= 1 byte per text token)."""
    return len(text.encode("utf-8")) + SPECIAL_TOKENS <= context_len


def probe_key(base: str) -> str:
    return f"{base}|tokens"


def probe_request(base: str, record_ids: tuple[str, ...], text: str, engine: str, stage: int) -> Request:
    """A score request whose only use is its token count (``Output.num_tokens + 1``)."""
    return Request(key=probe_key(base), record_ids=record_ids, kind="score", text=text, engine=engine, stage=stage)


def probe_count(outputs: Mapping[str, Output], base: str) -> int | None:
    """Token count of a probed text, or None when its probe is missing or failed."""
    out = outputs.get(probe_key(base))
    if out is None or out.error:
        return None
    return int(out.num_tokens) + 1


def byte_estimate(text: str) -> int:
    """An upper bound of the token count when no probe answered (one token per byte)."""
    return len(text.encode("utf-8")) + SPECIAL_TOKENS


@dataclass(frozen=True)
class Window:
    """Characters ``[start, end)`` are sent; ``[new_start, end)`` are the newly scored ones."""

    start: int
    new_start: int
    end: int


def _cut_points(text: str) -> np.ndarray:
    """Offsets where a whitespace run starts (never 0): the places a window may be cut."""
    return np.asarray(
        [i for i in range(1, len(text)) if text[i].isspace() and not text[i - 1].isspace()], dtype=np.int64
    )


def plan_windows(
    text: str,
    spans: Sequence[tuple[int, int]],
    tokens: Sequence[int],
    context_len: int,
    stride: int,
    fill: float = FILL,
) -> list[Window]:
    """Windows covering ``text``; ``spans`` tile the text and ``tokens`` are their token counts.

    One window ``(0, 0, len(text))`` when the estimated total fits ``fill * context_len``; otherwise
    Oren et al.'s windows (see the module docstring), cut at whitespace, new parts tiling the text.
    """
    if context_len < 2 or not 0 < stride < context_len:
        raise ValueError(f"need context_len >= 2 and 0 < stride < context_len, got {context_len} and {stride}")
    n = len(text)
    if len(spans) != len(tokens):
        raise ValueError(f"{len(spans)} spans but {len(tokens)} token counts")
    total = float(sum(max(1, int(t)) for t in tokens))
    c = max(2, int(context_len * fill))
    s = max(1, min(int(stride * fill), c - 1))
    if n == 0 or total <= c:
        return [Window(0, 0, n)]
    starts = np.asarray([a for a, _ in spans], dtype=np.float64)
    widths = np.asarray([b - a for a, b in spans], dtype=np.float64)
    counts = np.asarray([max(1, int(t)) for t in tokens], dtype=np.float64)
    cum = np.concatenate([[0.0], np.cumsum(counts)])

    def char_at(x: float) -> float:
        k = int(np.clip(np.searchsorted(cum, x, side="right") - 1, 0, len(counts) - 1))
        return float(starts[k] + widths[k] * min(1.0, max(0.0, (x - cum[k]) / counts[k])))

    cuts = _cut_points(text)
    k = math.ceil((total - c) / s)
    new_starts = [0]
    for j in range(1, k + 1):
        target = char_at(s * j + (c - s))
        prev = new_starts[-1]
        candidates = cuts[(cuts > prev) & (cuts < n)]
        if candidates.size:
            pos = int(candidates[np.argmin(np.abs(candidates - target))])
        else:
            pos = int(round(target))
        if prev < pos < n:
            new_starts.append(pos)
    ends = new_starts[1:] + [n]
    windows = [Window(0, 0, ends[0])]
    for j in range(1, len(new_starts)):
        b = new_starts[j]
        target = char_at(s * j)
        after = cuts[(cuts >= target) & (cuts < b)]
        a = int(after[0]) if after.size else min(int(math.ceil(target)), b - 1)
        windows.append(Window(max(0, min(a, b - 1)), b, ends[j]))
    return windows


def window_keys(base: str, n_windows: int) -> list[tuple[str, str | None]]:
    """(window key, context key or None) per window; one window is just ``base``."""
    if n_windows == 1:
        return [(base, None)]
    return [(f"{base}|w0", None)] + [(f"{base}|w{j}", f"{base}|w{j}|ctx") for j in range(1, n_windows)]


def window_requests(
    base: str,
    record_ids: tuple[str, ...],
    text: str,
    windows: Sequence[Window],
    *,
    vocab_stats: bool = False,
    engine: str = "target",
    stage: int = 0,
) -> list[Request]:
    """The score requests of ``text`` under key ``base`` (context texts never ask for vocab stats)."""
    out = []
    for w, (key, ctx_key) in zip(windows, window_keys(base, len(windows))):
        out.append(
            Request(
                key=key,
                record_ids=record_ids,
                kind="score",
                text=text[w.start : w.end],
                engine=engine,
                stage=stage,
                vocab_stats=vocab_stats,
            )
        )
        if ctx_key is not None:
            out.append(
                Request(
                    key=ctx_key,
                    record_ids=record_ids,
                    kind="score",
                    text=text[w.start : w.new_start],
                    engine=engine,
                    stage=stage,
                )
            )
    return out


@dataclass
class Scored:
    """Per-token scores of a whole text, assembled from its windows."""

    token_logprobs: list[float]
    token_mean: list[float] = field(default_factory=list)
    token_std: list[float] = field(default_factory=list)
    n_windows: int = 1
    max_window_tokens: int = 0

    @property
    def total(self) -> float:
        return float(sum(self.token_logprobs))


def _get(outputs: Mapping[str, Output], key: str) -> Output:
    out = outputs.get(key)
    if out is None:
        raise KeyError(f"no engine output for request {key!r}")
    if out.error:
        raise RuntimeError(f"request {key!r} failed: {out.error}")
    return out


def assemble(base: str, windows: Sequence[Window], outputs: Mapping[str, Output], vocab_stats: bool = False) -> Scored:
    """Join the new-token scores of every window of ``base``; KeyError/RuntimeError name a bad request."""
    lp: list[float] = []
    mu: list[float] = []
    sd: list[float] = []
    biggest = 0
    for key, ctx_key in window_keys(base, len(windows)):
        out = _get(outputs, key)
        skip = 0 if ctx_key is None else int(_get(outputs, ctx_key).num_tokens)
        biggest = max(biggest, int(out.num_tokens) + 1)
        lp.extend(out.token_logprobs[skip:])
        if vocab_stats:
            if len(out.token_mean) != len(out.token_logprobs) or len(out.token_std) != len(out.token_logprobs):
                raise RuntimeError(
                    f"request {key!r} has no vocabulary statistics (token_mean/token_std); Min-K%++ needs an "
                    "engine that returns them (backend hf)"
                )
            mu.extend(out.token_mean[skip:])
            sd.extend(out.token_std[skip:])
    return Scored(lp, mu, sd, n_windows=len(windows), max_window_tokens=biggest)
