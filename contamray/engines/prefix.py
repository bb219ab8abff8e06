"""Prompts and texts that start alike are read once: batches of shared prefixes for the transformers backend.

vLLM caches the key/value states of prompt prefixes itself (automatic prefix caching); ``HFEngine`` read
every prompt whole, though the methods send many prompts that start alike: guided prompting's instruction
(the same ~60 tokens for every example of a dataset, another ~40 for the general prompt), the judge's
few-shot prompt (hundreds of tokens), and CDD's ``n`` samples of one prompt; and texts to score that do:
a multiple-choice method (the held-out accuracy gap, clean-vs-dirty evaluation) scores each question alone
and with every option appended. This module decides which prompts (or texts) go into one batch so that they
share a long prefix; the engine reads the prefix once, copies its key/value cache to every row and generates
(``HFEngine._generate_ids``) or scores (``HFEngine._score_shared``) from there. For scoring, nothing is
generated (``new_tokens=0``): the cost is the prefix once and each row's padded rest. (vLLM's prefix cache
serves its generation only: a request asking for prompt log-probabilities skips reading it - vLLM's
``SamplingParams.skip_reading_prefix_cache``, since cached positions would have none - so ``VLLMEngine`` scores
each text whole.)

``prefix_batches``: the prompts are sorted by their token ids, so prompts sharing a prefix are neighbours;
runs of neighbours sharing at least ``SHARE_MIN`` tokens are cut into batches of at most ``batch_size`` by
dynamic programming over a cost in token reads - the prefix once, each row's padded rest, and per decoding
step a fixed cost plus one per row (``STEP_COST``, ``ROW_COST``: a step of a small model on a CPU reads its
weights whatever the batch, measured on SmolLM2-135M at about 30 prompt tokens' time, each row about 1.2
more) - so a group is neither split at an arbitrary place (its rows would each read the prefix again) nor
merged with prompts that share little with it. Prompts with no such neighbour are batched by length, as
before. In float32, scores are those of the texts read whole to float32 rounding (within 1e-4), and greedy
completions and seeded samples are those of the prompts read whole: the same tokens on every prompt
measured (``tests/test_prefix.py``, ``bench/prefix_sharing.py``: 140 of 140 answers, 200 of 200 scores), on the
embedded model and on six other architectures that position and cache tokens in their own ways (GPT-2, OPT,
BLOOM, GPT-NeoX, Falcon, Qwen2: tiny random-weight models in ``tests/test_prefix.py``). A prefix
read once and a prefix read per row round differently, though, and in bfloat16 that changes near ties: 60 of
70 answers identical (``--dtype bfloat16``), as another thread count, batch or machine changes some; the
canary (bfloat16 on a CPU with AVX-512 BF16) kept every decision, its guided-prompting p-values moved.
"""

from __future__ import annotations

from collections.abc import Sequence

SHARE_MIN = 16  # tokens: a shorter common prefix is not worth a pass of its own
STEP_COST = 30.0  # one decoding step, in prompt-token reads (see the module docstring)
ROW_COST = 1.2  # each row of a decoding step, likewise


def common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    """The number of leading ids every sequence shares."""
    if not seqs:
        return 0
    first, n = seqs[0], min(len(s) for s in seqs)
    for i in range(n):
        t = first[i]
        if any(s[i] != t for s in seqs):
            return i
    return n


def shareable(seqs: Sequence[Sequence[int]], repeats: int = 1) -> int:
    """The prefix worth reading once for one batch (each row keeps at least one token of its own to
    read), or 0: one prompt generating once, or fewer than ``SHARE_MIN`` tokens in common."""
    if not seqs:
        return 0
    return _worth_reading_once(common_prefix(seqs), min(len(s) for s in seqs), len(seqs) * repeats)


def _worth_reading_once(common: int, shortest: int, rows: int) -> int:
    """Of ``common`` shared ids, those read once for ``rows`` rows whose shortest prompt has ``shortest`` ids
    (one row reads its prompt whole; every row keeps a token of its own), or 0 below ``SHARE_MIN``."""
    shared = min(common, shortest - 1) if rows > 1 else 0
    return shared if shared >= SHARE_MIN else 0


def length_buckets(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (longest first, so memory limits show early)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def _segment(run: list[int], seqs: Sequence[Sequence[int]], adjacent: list[int], batch_size: int,
             new_tokens: int) -> list[list[int]]:  # fmt: skip
    """The cheapest cut of one sorted run (``adjacent[k]``: ids shared by ``run[k]`` and ``run[k + 1]``)."""
    n = len(run)
    best = [0.0] + [float("inf")] * n
    back = [0] * (n + 1)
    for end in range(1, n + 1):
        shared, shortest, longest = 1 << 30, 1 << 30, 0
        for start in range(end - 1, max(-1, end - 1 - batch_size), -1):  # the batch run[start:end]
            size = len(seqs[run[start]])
            shortest, longest = min(shortest, size), max(longest, size)
            if start < end - 1:
                shared = min(shared, adjacent[start])
            rows = end - start
            prefix = _worth_reading_once(shared, shortest, rows)
            cost = best[start] + prefix + rows * (longest - prefix) + new_tokens * (STEP_COST + ROW_COST * rows)
            if cost < best[end]:
                best[end], back[end] = cost, start
    batches, end = [], n
    while end > 0:
        batches.append(run[back[end] : end])
        end = back[end]
    return batches[::-1]


def prefix_batches(seqs: Sequence[Sequence[int]], batch_size: int, new_tokens: int) -> list[list[int]]:
    """Batches (lists of indices into ``seqs``) of at most ``batch_size``: prompts sharing a prefix of at
    least ``SHARE_MIN`` ids together (see the module docstring), the rest by length."""
    order = sorted(range(len(seqs)), key=lambda i: list(seqs[i]))
    adjacent = [common_prefix([seqs[a], seqs[b]]) for a, b in zip(order, order[1:])]
    batches: list[list[int]] = []
    alone: list[int] = []
    start = 0
    for k in range(len(order)):
        if k == len(order) - 1 or adjacent[k] < SHARE_MIN:  # the run order[start : k + 1] ends here
            if k > start:
                batches += _segment(order[start : k + 1], seqs, adjacent[start:k], batch_size, new_tokens)
            else:
                alone.append(order[k])
            start = k + 1
    lengths = [len(seqs[i]) for i in alone]
    batches += [[alone[j] for j in bucket] for bucket in length_buckets(lengths, batch_size)]
    return batches
