"""Identical engine work, asked for by several cells, computed once.

Min-K%, Min-K%++, perplexity and zlib all score the same text of the same example; two guided-prompting
presets send the same greedy prompts. ``Dedup`` folds a batch of (owner, ``Request``) pairs bound for
one engine into the distinct pieces of work (``content_key``), and ``expand`` hands every owner its
answer under its own request key.

Two requests are the same work when the engine would compute the same thing for both:

- **score**: the same text, reply and ``chat`` rendering. A score asked with the vocabulary statistics
  (Min-K%++) serves the plain scores of the same text too (they are the same forward pass; the statistics
  are dropped from the copies that did not ask for them), so the one request sent asks for them when any
  sharer does;
- **generate**: the same prompt, the same sampling parameters (seed included) and the same ``chat``
  wrapping.

The request's ``key``, ``record_ids``, ``stage`` and ``engine`` role are the owner's bookkeeping, not the
engine's work, and do not count. Costs: ``expand`` says how many owners each answer served, so each
owner is charged its share of the tokens and seconds (``pipeline.cells.EngineCosts``), and a cell's
cost is what it added to the run, not what it would have cost alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence

from contamray.engines.wire import Output, Request


def content_key(req: Request) -> tuple[Hashable, ...]:
    """What the engine computes for ``req``, without the owner's bookkeeping (see the module doc)."""
    if req.kind == "generate":
        return ("generate", req.text, req.sampling, req.chat)
    return ("score", req.text, req.reply, req.chat, req.context_len, req.stride)


class Dedup:
    """The distinct work of ``items`` (``unique``: (tag, Request) pairs to send) and how to fan it out."""

    def __init__(self, items: Sequence[tuple[str, Request]]) -> None:
        groups: dict[tuple[Hashable, ...], list[int]] = {}
        for i, (_, req) in enumerate(items):
            groups.setdefault(content_key(req), []).append(i)
        self.items = list(items)
        self.members: dict[str, list[int]] = {}
        self.unique: list[tuple[str, Request]] = []
        for n, positions in enumerate(groups.values()):
            tag = f"work-{n}"
            first = self.items[positions[0]][1]
            vocab = any(self.items[i][1].vocab_stats for i in positions)
            self.unique.append((tag, dataclasses.replace(first, key=tag, vocab_stats=vocab)))
            self.members[tag] = positions

    @property
    def saved(self) -> int:
        """Requests that did not have to be sent."""
        return len(self.items) - len(self.unique)

    def expand(self, answered: Sequence[tuple[str, Output]]) -> list[tuple[str, Output, int]]:
        """(owner, Output under the owner's request key, how many owners share it) for every item whose
        work was answered."""
        out: list[tuple[str, Output, int]] = []
        for tag, answer in answered:
            positions = self.members[tag]
            for i in positions:
                owner, req = self.items[i]
                copy = dataclasses.replace(answer, key=req.key)
                if req.kind == "score" and not req.vocab_stats:
                    copy = dataclasses.replace(copy, token_mean=[], token_std=[])
                out.append((owner, copy, len(positions)))
        return out
