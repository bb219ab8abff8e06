"""``SortedHashes.find`` gives exactly what a binary search gives, whatever the keys' layout."""

from __future__ import annotations

import numpy as np
import pytest

from contamray.metrics.hash_lookup import SortedHashes
from contamray.metrics.rolling import mix64


def _reference(keys: np.ndarray, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pos = np.searchsorted(keys, hashes)
    pos[pos == keys.shape[0]] = 0
    hit = np.flatnonzero(keys[pos] == hashes) if keys.shape[0] else np.zeros(0, dtype=np.int64)
    return hit, pos[hit]


@pytest.mark.parametrize("n_keys", [0, 1, 7, 5000])
def test_find_agrees_with_binary_search_on_mixed_hashes(n_keys):
    rng = np.random.default_rng(n_keys)
    keys = np.unique(mix64(rng.integers(0, 2**63, n_keys, dtype=np.uint64)))
    # a corpus: mostly misses, some keys, some keys more than once
    hashes = mix64(rng.integers(0, 2**63, 20000, dtype=np.uint64))
    if n_keys:
        planted = rng.integers(0, 20000, 300)
        hashes[planted] = keys[rng.integers(0, keys.shape[0], 300)]
    hit, key = SortedHashes(keys).find(hashes)
    want_hit, want_key = _reference(keys, hashes)
    assert hit.tolist() == want_hit.tolist() and key.tolist() == want_key.tolist()
    assert (n_keys == 0) == (hit.shape[0] == 0)


def test_keys_crowded_into_one_bucket_are_all_found():
    # badly mixed keys (all share their top bits) fall into one bucket: still exact, just slower
    keys = np.arange(1, 200, dtype=np.uint64) * np.uint64(3)
    finder = SortedHashes(keys)
    assert finder.most_per_bucket == keys.shape[0]
    hashes = np.arange(0, 700, dtype=np.uint64)
    hit, key = finder.find(hashes)
    assert hit.tolist() == [h for h in range(700) if h % 3 == 0 and 3 <= h <= 597]
    assert (keys[key] == hashes[hit]).all()
