"""The Engine protocol: the only two things a detection method ever asks of a model.

Like lm-evaluation-harness's ``loglikelihood`` / ``generate_until`` split, every closed-data method is
written against two calls, so any backend (transformers on CPU or GPU, vLLM on GPU or its CPU build)
serves every method:

- ``generate(prompts, sampling, chat)``: one completion per prompt (greedy when temperature is 0);
  ``complete`` is the same call returning, with each text, the prompt tokens read, the tokens
  generated and the prompt tokens left out (``Completion``); its ``max_tokens`` gives each prompt its
  own generation length in the same call (``token_limits``), so requests that differ only in length
  share a batch; ``sampling.n`` samples per prompt, with their generated token ids, all fixed by
  ``sampling.seed`` whatever else is in the batch;
- ``score(texts, with_vocab_stats, context_len, stride, replies)``: per-token log-probabilities of each whole
  text, the first token excluded (it has no prefix); with ``with_vocab_stats`` also the mean and
  standard deviation of the next-token log-probability over the vocabulary at each scored position
  (Min-K%++ needs them). With ``context_len`` / ``stride`` a longer text is scored in rolling windows
  over its token ids (``rolling_windows``, ``score_rolling``) instead of being cut. With ``replies`` each
  text is a user turn in the chat template (``encode_prompts`` with ``chat``) and its reply follows it
  (``with_replies``): how an instruct model reads its answers.

Shared by the backends (so they read the same token ids):

- ``encode_texts``: the tokenizer's own ``text -> ids`` with its special tokens;
- ``encode_prompts``: the same, or with ``chat`` the text as one user turn rendered by the tokenizer's
  chat template with the assistant's generation prompt (``apply_chat_template(...,
  add_generation_prompt=True)``), then tokenised without adding special tokens again (the template
  writes its own, as ``apply_chat_template(tokenize=True)`` does); a tokenizer without a template
  gets the raw text;
- ``scored_ids`` / ``with_replies``: what ``score`` reads - the text, or with replies the chat-rendered prompt
  followed by each reply's ids (``mark_replies`` records where each reply starts: ``TokenScores.prompt_tokens``);
- ``keep_head`` / ``keep_tail``: a text longer than the context is cut (scored texts keep their
  start, prompts their end) and the number of tokens left out is returned with it, so no cut is
  silent: it reaches ``Output.truncated`` and ``warn_truncated`` logs one warning per call;
- ``halving``: a batch that runs out of memory (``is_out_of_memory``) is halved and each half retried,
  down to one request; a request that still does not fit fails alone with the reason (its
  ``TokenScores.error`` / ``Completion.error``) and the rest of the batch is answered.

Backends live beside this file (``hf.py``, ``vllm.py``); ``build_engine`` picks one from config.
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from contamray.engines.wire import Sampling

log = logging.getLogger(__name__)


@dataclass
class TokenScores:
    """Scores of one text: log p(token_i | tokens_<i) for i >= 1.

    ``truncated``: tokens of the text left out because it was longer than the context (0 when it fit).
    """

    token_logprobs: list[float]
    token_ids: list[int] = field(default_factory=list)
    token_mean: list[float] = field(default_factory=list)
    token_std: list[float] = field(default_factory=list)
    truncated: int = 0
    windows: int = 1  # rolling windows it was scored in (``score_rolling``)
    error: str = ""  # why this text could not be scored (an engine that fails per request, ``http.py``)
    # scored with a reply (``replies``): the chat-rendered user turn's ids before it, so the reply's scores are
    # ``token_logprobs[prompt_tokens - 1:]`` without a second request for the turn alone; 0 without a reply
    prompt_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_logprobs)


def rolling_windows(n: int, context_len: int, stride: int) -> list[tuple[int, int, int]]:
    """``(start, end, new)`` of each window over ``n`` token ids: ids ``[start, end)`` are read and the
    positions ``[new, end)`` scored (Oren et al. 2023, as their code windows a token sequence): the first
    window scores all its tokens (from position 1, the first has no prefix); each later one ends
    ``stride`` tokens further and reads ``context_len`` ids, so its new tokens have at least
    ``context_len - stride`` tokens of context. Every position ``1..n-1`` is scored exactly once."""
    if context_len < 2 or not 0 < stride < context_len:
        raise ValueError(f"rolling windows need context_len >= 2 and 0 < stride < context_len, got "
                         f"{context_len} and {stride}")  # fmt: skip
    windows = [(0, min(n, context_len), 1)]
    done = windows[0][1]
    while done < n:
        end = min(done + stride, n)
        windows.append((end - context_len, end, done))
        done = end
    return windows


def score_rolling(
    score_ids: Any, encoded: Sequence[list[int]], context_len: int, stride: int, with_stats: bool
) -> list[TokenScores]:
    """Scores of whole token sequences from ``score_ids(list of id lists, with_stats)`` over their rolling
    windows (``rolling_windows``): all windows of all sequences go to the engine at once, then each
    sequence's new positions are joined in order. ``TokenScores.windows`` records how many it took."""
    plans = [rolling_windows(len(ids), context_len, stride) for ids in encoded]
    flat = [(i, w) for i, ws in enumerate(plans) for w in ws if w[1] - w[0] >= 2]
    scored = score_ids([list(encoded[i][a:b]) for i, (a, b, _) in flat], with_stats) if flat else []
    results = [TokenScores(token_logprobs=[], windows=len(ws)) for ws in plans]
    for (i, (a, b, new)), part in zip(flat, scored, strict=True):
        lo, hi = new - a - 1, b - a - 1  # window-local indices of positions new..b-1
        res = results[i]
        if part.error and not res.error:
            res.error = part.error
        res.token_logprobs.extend(part.token_logprobs[lo:hi])
        res.token_ids.extend(part.token_ids[lo:hi])
        if with_stats:
            res.token_mean.extend(part.token_mean[lo:hi])
            res.token_std.extend(part.token_std[lo:hi])
    return results


def check_window(context_len: int, stride: int, max_context: int, engine: str) -> None:
    """A request's rolling window must fit the model's context."""
    if context_len > max_context:
        raise ValueError(
            f"{engine}: context_len={context_len} is longer than the model's context ({max_context} tokens); "
            "lower the method's context_len or raise the model's max_model_len"
        )
    rolling_windows(0, context_len, stride)  # checks the pair


@dataclass
class Completion:
    """One generation: the new ``text``, the ``prompt_tokens`` the model read (after any chat template
    and cut), the ``new_tokens`` it generated (all samples), and the prompt tokens ``truncated`` (left
    out, from the start of the prompt, to fit the context with ``max_tokens``)."""

    text: str
    prompt_tokens: int = 0
    new_tokens: int = 0
    truncated: int = 0
    samples: list[str] = field(default_factory=list)  # every sample's text (``Sampling.n``); text = samples[0]
    sample_ids: list[list[int]] = field(default_factory=list)  # the ids each sample generated
    error: str = ""  # why this request failed (an engine that fails per request, ``http.py``); the rest is empty

    @property
    def num_tokens(self) -> int:
        """Tokens the engine processed for this request (its cost)."""
        return self.prompt_tokens + self.new_tokens


class Engine(Protocol):
    name: str
    max_context: int

    def generate(self, prompts: list[str], sampling: Sampling, chat: bool = False) -> list[str]: ...

    def complete(
        self, prompts: list[str], sampling: Sampling, chat: bool = False, max_tokens: Sequence[int] | None = None
    ) -> list[Completion]: ...

    def score(
        self,
        texts: list[str],
        with_vocab_stats: bool = False,
        context_len: int = 0,
        stride: int = 0,
        replies: Sequence[str] | None = None,
    ) -> list[TokenScores]: ...

    def count_tokens(self, texts: list[str]) -> list[int]: ...


def encode_texts(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids with the tokenizer's special tokens (the sequence the model sees)."""
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"text #{i} is {type(t).__name__}, expected str")
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=True)["input_ids"]]


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_text(tokenizer: Any, text: str) -> str:
    """``text`` as a single user turn in the tokenizer's chat template, ready for the assistant's answer."""
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return str(rendered)


def encode_prompts(tokenizer: Any, prompts: Sequence[str], chat: bool) -> list[list[int]]:
    """Prompt ids: ``encode_texts``, or with ``chat`` (and a chat template) each prompt rendered as a user
    turn and tokenised without adding special tokens (the template has its own)."""
    if not chat or not has_chat_template(tokenizer):
        return encode_texts(tokenizer, prompts)
    for i, t in enumerate(prompts):
        if not isinstance(t, str):
            raise TypeError(f"text #{i} is {type(t).__name__}, expected str")
    if not prompts:
        return []
    rendered = [chat_text(tokenizer, p) for p in prompts]
    return [list(ids) for ids in tokenizer(rendered, add_special_tokens=False)["input_ids"]]


def scored_ids(
    engine: Any, texts: Sequence[str], replies: Sequence[str] | None = None
) -> tuple[list[list[int]], list[int]]:
    """The ids a local engine's ``score`` reads: each text (``engine.encode``), or with ``replies`` each text as a
    user turn of the chat template (``engine.encode_prompts`` with ``chat``) followed by its reply
    (``with_replies``; without a chat template, the raw text and the reply after a space: ``plain_reply``); and each
    sequence's turn length in ids (0 without replies; ``TokenScores.prompt_tokens``):
    the turn's ids are the same whatever the reply, so the tokenizer alone says where each reply starts, without
    scoring the turn on its own."""
    if replies is None:
        return engine.encode(texts), [0] * len(texts)
    turns = engine.encode_prompts(texts, chat=True)
    if not has_chat_template(engine.tokenizer):  # the raw text, then the reply as its continuation after a space
        replies = [plain_reply(r) for r in replies]
    return with_replies(turns, engine.tokenizer, replies), [len(ids) for ids in turns]


def plain_reply(reply: str) -> str:
    """A reply as the continuation of a raw prompt (a model without a chat template): after one space, as
    lm-evaluation-harness joins a context and its continuation (``target_delimiter``), unless it starts with
    whitespace already or is empty. Appended bare, "Answer:" + "Paris" would be scored as "Answer:Paris" - a
    spelling the model rarely reads, which blurs the options' and the members' likelihoods alike."""
    return reply if not reply or reply[0].isspace() else f" {reply}"


def mark_replies(results: list[TokenScores], turns: Sequence[int]) -> list[TokenScores]:
    """``results`` with each one's ``prompt_tokens`` (the turn lengths of ``scored_ids``)."""
    for res, n in zip(results, turns, strict=True):
        res.prompt_tokens = int(n)
    return results


def with_replies(prompt_ids: list[list[int]], tokenizer: Any, replies: Sequence[str]) -> list[list[int]]:
    """Each prompt's ids (``encode_prompts`` with ``chat``) followed by its reply's, tokenised alone without special
    tokens: the sequence an instruct model reads when it answers the prompt with the reply. The prompt's ids are the
    same whatever the reply, so a reply's tokens are exactly those after its prompt's (as the harness scores a
    continuation of a chat-rendered context)."""
    if len(replies) != len(prompt_ids):
        raise ValueError(f"{len(replies)} replies for {len(prompt_ids)} prompts")
    for i, r in enumerate(replies):
        if not isinstance(r, str):
            raise TypeError(f"reply #{i} is {type(r).__name__}, expected str")
    tails = tokenizer(list(replies), add_special_tokens=False)["input_ids"] if replies else []
    return [list(head) + list(tail) for head, tail in zip(prompt_ids, tails, strict=True)]


def token_limits(n_prompts: int, sampling: Sampling, max_tokens: Sequence[int] | None, context: int) -> list[int]:
    """Each prompt's own ``max_tokens`` (``sampling.max_tokens`` when none is given), checked: >= 1, and
    leaving room for a prompt in the model's ``context``. One call serves prompts of different lengths
    to generate (per-request sampling), so a batch is never split by ``max_tokens``."""
    limits = [int(sampling.max_tokens)] * n_prompts if max_tokens is None else [int(m) for m in max_tokens]
    if len(limits) != n_prompts:
        raise ValueError(f"max_tokens has {len(limits)} values for {n_prompts} prompts; give one per prompt")
    for i, m in enumerate(limits):
        if m < 1:
            raise ValueError(f"max_tokens of prompt #{i} must be >= 1, got {m}")
        if context - m < 1:
            raise ValueError(
                f"max_tokens={m} (prompt #{i}) leaves no room for a prompt in the model's context of {context} "
                "tokens; lower max_tokens"
            )
    return limits


def keep_head(encoded: list[list[int]], limit: int) -> tuple[list[list[int]], list[int]]:
    """Each sequence's first ``limit`` ids, and how many ids each lost (scored texts)."""
    return [ids[:limit] for ids in encoded], [max(0, len(ids) - limit) for ids in encoded]


def keep_tail(encoded: list[list[int]], limits: Sequence[int]) -> tuple[list[list[int]], list[int]]:
    """Each sequence's last ``limits[i]`` ids (one limit per sequence: each prompt leaves room for its own
    ``max_tokens``), and how many ids each lost (prompts: their end is what the continuation depends on)."""
    pairs = list(zip(encoded, limits, strict=True))
    return [ids[-lim:] if len(ids) > lim else ids for ids, lim in pairs], [max(0, len(ids) - lim) for ids, lim in pairs]


def warn_truncated(engine: str, what: str, truncated: Sequence[int], limit: int, kept: str) -> None:
    """One warning for a call in which some texts did not fit: how many, and the tokens left out."""
    cut = [n for n in truncated if n > 0]
    if cut:
        log.warning(
            "%s: %d of %d %s longer than the context (%d tokens): %d tokens left out in all (%s); "
            "each request's count is in its Output.truncated and the examples' truncated_tokens",
            engine, len(cut), len(truncated), what, limit, sum(cut), kept,
        )


T = TypeVar("T")
R = TypeVar("R")


def is_out_of_memory(err: BaseException) -> bool:
    """An engine call that ran out of memory: torch's ``OutOfMemoryError`` (CUDA, MPS), a ``MemoryError``
    (host RAM), or a ``RuntimeError`` whose message says so (older torch; the CPU allocator's "can't
    allocate memory")."""
    if isinstance(err, MemoryError):
        return True
    oom = getattr(sys.modules.get("torch"), "OutOfMemoryError", None)
    if oom is not None and isinstance(err, oom):
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def _free_memory() -> None:
    """Give the allocator's cached blocks back after an out-of-memory error (CUDA only; a no-op elsewhere)."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def halving(run: Callable[[list[T]], list[R]], items: list[T], failed: Callable[[T, str], R], engine: str) -> list[R]:
    """``run(items)`` (one result per item, in order); a call that runs out of memory is retried on each
    half of ``items``, recursively, down to one item; an item that runs out of memory alone gets
    ``failed(item, reason)``. Any other error is raised as it is."""
    try:
        return run(items)
    except Exception as err:  # noqa: BLE001 - only out-of-memory errors are handled here
        if not is_out_of_memory(err):
            raise
        reason = f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else 'out of memory'}"
    _free_memory()
    if len(items) == 1:
        log.warning("%s: one request runs out of memory on its own (%s); it fails, the batch goes on", engine, reason)
        return [failed(items[0], f"out of memory even alone in a batch of 1 ({reason}); lower the model's "
                       "max_model_len or the method's context_len, or give the model more memory")]
    half = len(items) // 2
    log.warning("%s: a batch of %d ran out of memory (%s); retrying it as %d + %d", engine, len(items), reason,
                half, len(items) - half)
    return halving(run, items[:half], failed, engine) + halving(run, items[half:], failed, engine)
