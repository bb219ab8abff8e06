"""Scoring texts longer than a context window: one ``score`` request, windowed inside the engine.

Oren et al. (2023) score a long token sequence in windows of ``context_len`` tokens that start every
``stride`` tokens; the first window scores all its tokens, every later window only its last
``stride`` tokens (the "new" ones), each seen with at least ``context_len - stride`` tokens of context.
A request carries ``context_len`` and ``stride`` and the engine does exactly this over the text's
token ids (``contamray.engines.base.rolling_windows``): every token of the text is scored once, none
is cut, and ``Output.n_windows`` says how many windows it took (1 when the text fits one context).

(An earlier version windowed the *text*: it probed each example's token count in one engine pass,
cut the text at whitespace where the counts said, and scored each window's context a second time to
subtract it - one more pass, an estimate of where tokens fall, and up to twice the tokens scored.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from contamray.methods.base import Output, Request


def score_request(
    key: str,
    record_ids: tuple[str, ...],
    text: str,
    context_len: int,
    stride: int,
    *,
    vocab_stats: bool = False,
    engine: str = "target",
    stage: int = 0,
    reply: str | None = None,
) -> Request:
    """The score request of ``text``: windowed by the engine when longer than ``context_len`` tokens. With a
    ``reply`` (``""`` included), ``text`` is a user turn rendered by the model's chat template and the reply follows
    it (``Request.chat``)."""
    return Request(
        key=key,
        record_ids=record_ids,
        kind="score",
        text=text,
        engine=engine,
        stage=stage,
        vocab_stats=vocab_stats,
        context_len=context_len,
        stride=stride,
        chat=reply is not None,
        reply=reply or "",
    )


@dataclass
class Scored:
    """Per-token scores of a whole text (``token_mean`` / ``token_std`` only when asked for)."""

    token_logprobs: list[float]
    token_mean: list[float] = field(default_factory=list)
    token_std: list[float] = field(default_factory=list)
    n_windows: int = 1

    @property
    def total(self) -> float:
        return float(sum(self.token_logprobs))


def read_scored(outputs: Mapping[str, Output], key: str, vocab_stats: bool = False) -> Scored:
    """The scores answered to request ``key``; KeyError (no answer) or RuntimeError (it failed, or has no
    vocabulary statistics when they were asked for) name the request."""
    out = outputs.get(key)
    if out is None:
        raise KeyError(f"no engine output for request {key!r}")
    if out.error:
        raise RuntimeError(f"request {key!r} failed: {out.error}")
    n = len(out.token_logprobs)
    if vocab_stats and (len(out.token_mean) != n or len(out.token_std) != n):
        raise RuntimeError(
            f"request {key!r} has no vocabulary statistics (token_mean/token_std); Min-K%++ needs an engine that "
            "returns them (backend hf)"
        )
    stats = (out.token_logprobs, out.token_mean, out.token_std) if vocab_stats else (out.token_logprobs,)
    broken = sum(1 for values in stats for v in values if not math.isfinite(v))
    if broken:
        raise RuntimeError(
            f"request {key!r}: the engine returned {broken} non-finite value(s) (NaN or inf) among its {n} tokens' "
            "log-probabilities" + (" and vocabulary statistics" if vocab_stats else "") + " - a failed forward pass "
            "(e.g. float16 overflow); a score computed from them would mean nothing: score in float32 or bfloat16 "
            "(models.<name>.dtype)"
        )
    return Scored(
        list(out.token_logprobs),
        list(out.token_mean) if vocab_stats else [],
        list(out.token_std) if vocab_stats else [],
        n_windows=max(1, int(out.n_windows)),
    )
