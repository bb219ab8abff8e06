"""The check every open-data method's ``fold`` passes (``contamray.methods.open.common.FOLD_CONTRACT``).

``assert_fold_faithful(method, cfg, records, docs)`` scans ``docs`` in one batch and, for several random
splits of the documents into batches, folds each batch's match rows and combines the folds in a random
bracketing; every way must give ``score`` rows equal to the one-batch scan's. ``assert_fold_bounded``
checks that what ``fold`` keeps stops growing when the corpus copies the benchmark more often.
Pure Python: no Ray, no model (the embedding methods' matchers load the embedding model in-process).
"""

from __future__ import annotations

import pickle
import random
from typing import Any

from contamray.methods.base import Method
from contamray.records import Record


def _match_all(method: Method, index: Any, cfg: Any, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return method.match(docs, index, cfg) if docs else []


def _combine(method: Method, cfg: Any, parts: list[list[dict[str, Any]]], rng: random.Random) -> list[dict]:
    """Fold ``parts`` pairwise in a random order and bracketing, down to one list."""
    parts = [list(p) for p in parts]
    while len(parts) > 1:
        i, j = sorted(rng.sample(range(len(parts)), 2))
        right, left = parts.pop(j), parts.pop(i)
        parts.append(method.fold(left + right, cfg))
    return parts[0] if parts else []


def _comparable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: str(r.get("record_id")))


def assert_fold_faithful(
    method: Method,
    cfg: Any,
    records: list[Record],
    docs: list[dict[str, Any]],
    splits: int = 6,
    seed: int = 0,
    score_kwargs: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Folding batch by batch, in any order, scores like the one-batch scan; returns its score rows."""
    extra = score_kwargs or {}
    index = method.build_index(records, cfg)
    raw = _match_all(method, index, cfg, docs)
    expected = _comparable(method.score(records, raw, cfg, **extra))
    folded_once = method.fold(raw, cfg)
    assert _comparable(method.score(records, folded_once, cfg, **extra)) == expected, "score(fold(rows)) != score(rows)"
    assert method.fold(folded_once, cfg) == folded_once, "fold is not idempotent"
    assert method.fold(list(reversed(raw)), cfg) == folded_once, "fold depends on the order of its input"
    pickle.loads(pickle.dumps(folded_once))  # plain rows: they go to the result store
    rng = random.Random(seed)
    for _ in range(splits):
        shuffled = list(docs)
        rng.shuffle(shuffled)
        k = rng.randint(1, max(1, len(docs)))
        cuts = sorted(rng.sample(range(1, len(docs)), min(k - 1, max(0, len(docs) - 1)))) if len(docs) > 1 else []
        batches = [shuffled[a:b] for a, b in zip([0, *cuts], [*cuts, len(docs)], strict=True)]
        parts = [method.fold(_match_all(method, index, cfg, batch), cfg) for batch in batches]
        combined = _combine(method, cfg, parts, rng)
        assert combined == folded_once, f"folding {len(batches)} batches gave other rows than folding the whole scan"
        assert _comparable(method.score(records, combined, cfg, **extra)) == expected
    return expected


def assert_fold_bounded(
    method: Method, cfg: Any, records: list[Record], copy_docs: Any, few: int = 5, many: int = 60
) -> None:
    """``copy_docs(k)`` gives a corpus where the benchmark is copied ``k`` times: the folded rows of ``many``
    copies are no more than those of ``few`` copies (the evidence is capped, counts are numbers)."""
    index = method.build_index(records, cfg)
    sizes = {}
    for k in (few, many):
        folded = method.fold(method.match(copy_docs(k), index, cfg), cfg)
        sizes[k] = (len(folded), len(pickle.dumps(folded)))
    assert sizes[many][0] <= sizes[few][0], f"fold keeps more rows for {many} copies than for {few}: {sizes}"
    # pickled size may grow by the digits of the counts, never by the copies' rows
    assert sizes[many][1] <= sizes[few][1] * 1.2 + 64, f"fold keeps more bytes for {many} copies than {few}: {sizes}"
