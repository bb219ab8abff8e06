"""The engine's wire types: what crosses between a method, the pipeline and an engine.

``Sampling`` (generation parameters), ``Request`` (one engine call) and ``Output`` (its answer) live
here, beside the engines, so that ``contamray.engines`` never imports ``contamray.methods``: methods
and the pipeline depend on engines, never the other way round (``tests/test_architecture.py``).
``contamray.methods.base`` re-exports the three for methods and tests.

``Request.to_row`` / ``Output.to_row`` (and ``from_row``) turn them into plain JSON-able dicts, the form in which
requests and outputs cross Ray actors (``contamray.pipeline.actors``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

CHARS_PER_TOKEN = 4  # a text's tokens, guessed without a tokenizer (English BPE: about 4 characters a token)


def guess_tokens(text: str, generated: int = 0) -> float:
    """The tokens a request will cost, guessed before it is sent: its text's (``CHARS_PER_TOKEN``) plus those it
    asks to generate. What an API's token budget and an engine batch's size are planned with."""
    return len(text) / CHARS_PER_TOKEN + generated


@dataclass(frozen=True)
class Sampling:
    """Generation parameters; greedy by default (temperature 0), as the guided-prompting paper.

    ``n`` samples of one prompt come from one request (the prompt is read once where the engine can
    share it, as vLLM does); ``seed`` fixes all of them, whatever batch or replica the request lands in.
    """

    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int = 0
    n: int = 1


@dataclass(frozen=True)
class Request:
    """One engine call: generate from ``text`` (``kind="generate"``) or score ``text`` (``"score"``).

    ``key`` is unique within a (model, method) cell; ``record_ids`` lists the examples it stands for
    (one, or a whole shard); ``engine`` is the role of the engine that must answer it. A score request scores
    ``text`` followed by ``reply``; with ``chat``, ``text`` is one user turn in the model's chat template with the
    assistant's generation prompt, and ``reply`` the assistant's answer after it (what an instruct model reads
    when it gives that answer; the prompt alone: ``reply`` empty).
    """

    key: str
    record_ids: tuple[str, ...]
    kind: Literal["generate", "score"]
    text: str
    sampling: Sampling = Sampling()
    engine: str = "target"
    stage: int = 0
    vocab_stats: bool = False  # score: also return per-position vocabulary mean/std (Min-K%++)
    chat: bool = False  # wrap ``text`` as a user turn in the model's chat template (when it has one), generate or score
    reply: str = ""  # score: scored after ``text`` (with ``chat``: the assistant's reply to the user turn ``text``)
    # score: a text longer than ``context_len`` tokens is scored in rolling windows over its token ids that
    # advance by ``stride`` (Oren et al. 2023), inside the engine; 0 = the model's context, longer texts cut
    context_len: int = 0
    stride: int = 0

    def to_row(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        row["record_ids"] = list(self.record_ids)
        row["sampling"] = dataclasses.asdict(self.sampling)
        row["sampling"]["stop"] = list(self.sampling.stop)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Request:
        s = dict(row["sampling"])
        s["stop"] = tuple(s.get("stop") or ())
        return cls(
            key=row["key"],
            record_ids=tuple(row["record_ids"]),
            kind=row["kind"],
            text=row["text"],
            sampling=Sampling(**s),
            engine=row.get("engine", "target"),
            stage=int(row.get("stage", 0)),
            vocab_stats=bool(row.get("vocab_stats", False)),
            chat=bool(row.get("chat", False)),
            reply=str(row.get("reply", "") or ""),
            context_len=int(row.get("context_len", 0) or 0),
            stride=int(row.get("stride", 0) or 0),
        )


@dataclass
class Output:
    """An engine's answer to one Request.

    ``text`` for generation (the first sample), ``texts`` every one of the request's ``sampling.n``
    samples and ``token_ids`` the ids each generated (end-of-sequence excluded; a stop string's text is
    cut from ``texts``, the ids that produced it are kept); for scoring, ``token_logprobs`` are the
    log-probabilities of every token of the text given its prefix (first token excluded) and
    ``num_tokens`` the scored count.
    ``token_mean`` / ``token_std`` are, per scored position, the mean and standard deviation of the
    next-token log-probability over the vocabulary (Min-K%++), filled only when asked for.
    ``n_windows`` is how many rolling windows a score took (``Request.context_len`` / ``stride``).
    ``prompt_tokens``, for a score with a ``reply`` under ``chat``, is the rendered user turn's token count: the
    reply's log-probabilities are ``token_logprobs[prompt_tokens - 1:]``.
    ``truncated`` counts the tokens of the request the engine had to leave out (a prompt or text
    longer than the model's context): 0 when the whole text was read.
    ``error`` is non-empty when the request failed; the rest is then empty.
    """

    key: str
    text: str = ""
    token_logprobs: list[float] = field(default_factory=list)
    num_tokens: int = 0
    token_mean: list[float] = field(default_factory=list)
    token_std: list[float] = field(default_factory=list)
    truncated: int = 0
    error: str = ""
    n_windows: int = 0  # score: windows the text was scored in (1 when it fit one context)
    texts: list[str] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    prompt_tokens: int = 0  # score with a reply (``chat``): the user turn's ids; the reply's are after them

    def to_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Output:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: row[k] for k in names if k in row}
        for name in ("token_logprobs", "token_mean", "token_std"):
            values[name] = [float(x) for x in (values.get(name) if values.get(name) is not None else [])]
        values["texts"] = [str(t) for t in (values.get("texts") if values.get("texts") is not None else [])]
        ids = values.get("token_ids") if values.get("token_ids") is not None else []
        values["token_ids"] = [[int(t) for t in sample] for sample in ids]
        return cls(**values)
