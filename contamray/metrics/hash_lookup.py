"""Exact lookup of many 64-bit hashes in a sorted array of keys: the inner loop of every corpus scan.

Why not ``np.searchsorted``: a corpus batch has hundreds of thousands of windows, and a binary search
over a benchmark index of a few hundred thousand keys is ~18 dependent memory reads per window. The
keys are well-mixed hashes (``contamray.metrics.rolling.mix64``), so their top bits are uniform:

1. a byte table over the top bits (about 16 slots per key) rejects almost every window with one
   gather;
2. for the few that pass, ``first[bucket]`` (about 2 buckets per key, over fewer top bits) says where
   that bucket's keys start in the sorted array, so each is compared with the (none to a handful of)
   keys of its bucket directly.

Measured on ``bench/open_data_scan.py``'s corpus against 257k benchmark 13-grams: 5.5 ms instead of
12.7 ms (bit table + binary search) per 4.6 MB. The tables are rebuilt in each process from the keys
(they are several times larger than the keys, so owners keep them out of their pickles).
"""

from __future__ import annotations

import math

import numpy as np

MAX_BITS = 24  # 16 MiB filter + 128 MiB bucket starts at most, however large the index


class SortedHashes:
    """Finds hashes among ``keys`` (uint64, sorted ascending, distinct)."""

    def __init__(self, keys: np.ndarray) -> None:
        self.keys = np.asarray(keys, dtype=np.uint64)
        n = max(1, self.keys.shape[0])
        # the filter: ~16 slots per key, so ~6 % of misses get past it
        fine = int(min(MAX_BITS, max(10, math.ceil(math.log2(n * 16)))))
        self.fine_shift = np.uint64(64 - fine)
        self.occupied = np.zeros(1 << fine, dtype=bool)
        self.occupied[self.keys >> self.fine_shift] = True
        # the buckets: ~2 per key, coarse enough that building them (a cumsum) stays cheap
        coarse = int(min(MAX_BITS, max(8, math.ceil(math.log2(n * 2)))))
        self.shift = np.uint64(64 - coarse)
        per_bucket = np.bincount((self.keys >> self.shift).astype(np.int64), minlength=1 << coarse)
        self.first = np.zeros((1 << coarse) + 1, dtype=np.int64)
        np.cumsum(per_bucket, out=self.first[1:])
        self.most_per_bucket = int(per_bucket.max()) if self.keys.shape[0] else 0

    def find(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions ``p`` of ``hashes`` that are keys, index of ``hashes[p]`` in ``keys``), by position."""
        if self.most_per_bucket == 0 or hashes.shape[0] == 0:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        candidates = np.flatnonzero(self.occupied[hashes >> self.fine_shift])
        values = hashes[candidates]
        bucket = values >> self.shift
        lo = self.first[bucket]
        count = self.first[bucket + np.uint64(1)] - lo
        positions, found = [], []
        for k in range(self.most_per_bucket):
            if k:
                more = count > k
                candidates, lo, count, values = candidates[more], lo[more], count[more], values[more]
            equal = self.keys[lo + k] == values
            positions.append(candidates[equal])
            found.append(lo[equal] + k)
        order_ = np.concatenate(positions)
        keys_ = np.concatenate(found)
        order = np.argsort(order_, kind="stable")
        return order_[order], keys_[order]
