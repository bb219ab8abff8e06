"""Polynomial rolling hashes of every fixed-length window of a sequence, all windows at once.

Why: exact substring search of many short patterns (GPT-4's 50-character substrings, whole normalised
examples for exact match) in a stream of documents. Hashing every window of every document with a
per-window call would cost one Python call per character; a polynomial hash has a prefix-sum form,
so all windows of one length cost a handful of vectorised NumPy operations per position, and any
number of patterns of that length are then looked up with one ``searchsorted``.

The hash of ``codes[i : i + L]`` is ``sum_k codes[i + k] * B**k  (mod 2**64)`` with an odd base ``B``
(invertible mod 2**64), computed as ``(P[i + L] - P[i]) * B**-i`` from the prefix sums
``P[j] = sum_{t < j} codes[t] * B**t``. Arithmetic wraps mod 2**64 (NumPy uint64). Polynomial hashes
modulo a power of two can be made to collide by adversarial inputs (Thue-Morse strings), so callers
must treat a hash hit as a *candidate* and compare the actual codes; every caller in contamray does.
"""

from __future__ import annotations

import numpy as np

BASE = 0x9E3779B97F4A7C15  # odd: invertible modulo 2**64
_MOD = 1 << 64
_INV = pow(BASE, -1, _MOD)


class _Powers:
    """``B**j`` and ``B**-j`` for j < capacity, grown by doubling (shared by all calls in a process)."""

    def __init__(self) -> None:
        self.up = np.ones(1, dtype=np.uint64)
        self.down = np.ones(1, dtype=np.uint64)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if self.up.shape[0] < n:
            size = max(n, 2 * self.up.shape[0], 1024)
            with np.errstate(over="ignore"):
                up = np.full(size, BASE, dtype=np.uint64)
                up[0] = 1
                down = np.full(size, _INV, dtype=np.uint64)
                down[0] = 1
                self.up, self.down = np.cumprod(up), np.cumprod(down)
        return self.up[:n], self.down[:n]


_POWERS = _Powers()


def as_codes(values: np.ndarray) -> np.ndarray:
    """Any integer array as uint64 codes (the same bits for uint64 input)."""
    return np.ascontiguousarray(values).astype(np.uint64, copy=False)


def window_hashes(codes: np.ndarray, length: int) -> np.ndarray:
    """Hash of every window ``codes[i : i + length]``; ``len(codes) - length + 1`` values (or none)."""
    if length < 1:
        raise ValueError(f"window length must be >= 1, got {length}")
    c = as_codes(codes)
    n = c.shape[0]
    if n < length:
        return np.zeros(0, dtype=np.uint64)
    up, down = _POWERS.get(n)
    with np.errstate(over="ignore"):
        prefix = np.empty(n + 1, dtype=np.uint64)
        prefix[0] = 0
        np.cumsum(c * up, out=prefix[1:])
        m = n - length + 1
        return (prefix[length : length + m] - prefix[:m]) * down[:m]


class Prefix:
    """Prefix sums of one sequence, so windows of *any* length (and any spans) hash in O(1) each.

    Several window lengths over the same batch (n-grams of different lengths, whole short examples)
    share the one ``cumsum``.
    """

    def __init__(self, codes: np.ndarray) -> None:
        # unsigned codes (bytes) multiply straight into uint64: no widened copy of the input
        codes = np.asarray(codes)
        c = codes if codes.dtype.kind == "u" else as_codes(codes)
        self.n = int(c.shape[0])
        up, down = _POWERS.get(self.n)
        self.down = down
        with np.errstate(over="ignore"):
            self.prefix = np.empty(self.n + 1, dtype=np.uint64)
            self.prefix[0] = 0
            np.multiply(c, up, out=self.prefix[1:], dtype=np.uint64)
            np.cumsum(self.prefix[1:], out=self.prefix[1:])

    def windows(self, length: int) -> np.ndarray:
        """Hashes of all windows of ``length`` (as ``window_hashes``)."""
        if length < 1:
            raise ValueError(f"window length must be >= 1, got {length}")
        m = self.n - length + 1
        if m <= 0:
            return np.zeros(0, dtype=np.uint64)
        with np.errstate(over="ignore"):
            return (self.prefix[length : length + m] - self.prefix[:m]) * self.down[:m]

    def spans(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Hashes of ``codes[s:e]`` for every pair (the same value a window of that content gets)."""
        with np.errstate(over="ignore"):
            return (self.prefix[ends] - self.prefix[starts]) * self.down[starts]


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (a bijection): every output bit depends on every input bit.

    A polynomial hash mod 2**64 has weak low bits (bit i depends only on input bits <= i); mixing
    makes every bit usable, e.g. for a prefilter on the top bits, without adding collisions.
    """
    x = np.array(x, dtype=np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def mix64_int(value: int) -> int:
    """``mix64`` of one Python int (reference for tests)."""
    x = value & (_MOD - 1)
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & (_MOD - 1)
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & (_MOD - 1)
    return x ^ (x >> 31)


def sequence_hash(codes: np.ndarray) -> int:
    """The hash ``window_hashes`` gives a window equal to ``codes`` (the pattern side)."""
    c = as_codes(codes)
    if c.shape[0] == 0:
        raise ValueError("cannot hash an empty sequence")
    return int(window_hashes(c, c.shape[0])[0])


def text_codes(text: str) -> np.ndarray:
    """The Unicode code points of ``text`` as uint64 (UTF-32 view; lone surrogates become U+FFFD)."""
    data = text.encode("utf-32-le", "replace")
    return np.frombuffer(data, dtype=np.uint32).astype(np.uint64)


def find_all(hashes: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``p`` with ``hashes[p]`` in the sorted ``keys``, and the index of that key."""
    if keys.shape[0] == 0 or hashes.shape[0] == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    pos = np.searchsorted(keys, hashes)
    pos[pos == keys.shape[0]] = 0
    hit = np.flatnonzero(keys[pos] == hashes)
    return hit, pos[hit]
