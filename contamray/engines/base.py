"""The Engine protocol: the only two things a detection method ever asks of a model.

Like lm-evaluation-harness's ``loglikelihood`` / ``generate_until`` split, every closed-data method is
written against two calls, so any backend (transformers on CPU or GPU, vLLM on GPU or its CPU build)
serves every method:

- ``generate(prompts, sampling)``: one completion per prompt (greedy when temperature is 0);
- ``score(texts, with_vocab_stats)``: per-token log-probabilities of each whole text, the first token
  excluded (it has no prefix); with ``with_vocab_stats`` also the mean and standard deviation of the
  next-token log-probability over the vocabulary at each scored position (Min-K%++ needs them).

Backends live beside this file (``hf.py``, ``vllm.py``); ``build_engine`` picks one from config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from contamray.methods.base import Sampling


@dataclass
class TokenScores:
    """Scores of one text: log p(token_i | tokens_<i) for i >= 1."""

    token_logprobs: list[float]
    token_ids: list[int] = field(default_factory=list)
    token_mean: list[float] = field(default_factory=list)
    token_std: list[float] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.token_logprobs)


class Engine(Protocol):
    name: str
    max_context: int

    def generate(self, prompts: list[str], sampling: Sampling) -> list[str]: ...

    def score(self, texts: list[str], with_vocab_stats: bool = False) -> list[TokenScores]: ...

    def count_tokens(self, texts: list[str]) -> list[int]: ...
