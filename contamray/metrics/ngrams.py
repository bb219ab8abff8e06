"""Word n-grams as 64-bit hashes: the shared vocabulary of the n-gram overlap matchers.

Normalisation follows the paper that defines the matcher, so a hit means what the paper meant:

- ``"gpt3"`` (Brown et al. 2020, "Language Models are Few-Shot Learners", Appendix C): "we define a
  gram as a lowercase, whitespace delimited word with no punctuation" / "ignoring all punctuation,
  whitespace, and casing". Text is lowercased, punctuation is *deleted* (``don't`` -> ``dont``,
  ``U.S.`` -> ``us``) and the rest is split on whitespace.
- ``"gpt2"`` (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners", Sec. 4):
  "strings were normalized to contain only lower-cased alphanumeric words with a single space as a
  delimiter". Every run of characters that is not a letter or digit becomes a word break
  (``don't`` -> ``don t``).

"Punctuation" is every character that is neither alphanumeric (Python's Unicode ``\\w`` without
``_``) nor whitespace, so symbols (``$``, ``%``, emoji) go too. Everything is plain ``re`` / ``str``
work in C: no nltk, no tokenizer data to download.

Hashing, all of it vectorised with NumPy (``contamray.metrics.rolling``), so a document costs a few
C-level string passes and a handful of array operations per word — no Python call per word or per
n-gram:

- a word's hash is ``mix64(P(chunks) ^ len * S)``: ``P`` the polynomial hash mod 2**64 of its UTF-8
  bytes taken 8 at a time as little-endian integers (a word of up to 8 bytes is its own bytes, so
  short words never collide), computed for every word of a batch with one gather per 8 bytes,
  ``mix64`` SplitMix64's bijective finaliser (``word_hash`` is the plain-Python reference);
- the hash of the n-gram starting at word ``j`` is ``mix64(sum_k h[j+k] * B**k + n)`` over the word
  hashes, again from one prefix sum per batch, shared by every n-gram length the indexes need
  (``TokenBatch.windows``).

Distinct n-grams collide with probability about 2**-64 per pair. The values differ from datatrove's
``xxhash64(" ".join(ngram))``: indexes of the two are not interchangeable.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from contamray.metrics import rolling

NORMALIZATIONS = ("gpt3", "gpt2")

_PUNCT = re.compile(r"[^\w\s]|_")
_NON_ALNUM = re.compile(r"[\W_]+")

_MASK = (1 << 64) - 1


def _check_style(style: str) -> None:
    if style not in NORMALIZATIONS:
        raise ValueError(f"unknown normalization {style!r}; expected one of {', '.join(NORMALIZATIONS)}")


def normalize(text: str, style: str = "gpt3") -> str:
    """Lowercase, drop punctuation (``gpt3``) or break words at it (``gpt2``), single-space words."""
    _check_style(style)
    lowered = text.lower()
    stripped = _PUNCT.sub("", lowered) if style == "gpt3" else _NON_ALNUM.sub(" ", lowered)
    return " ".join(stripped.split())


def words(text: str, style: str = "gpt3") -> list[str]:
    """The normalised words of ``text`` (see the module docstring)."""
    return normalize(text, style).split()


def _ascii_tables() -> dict[str, tuple[bytes, bytes]]:
    # Byte-level equivalents of the regexes for ASCII characters: (translate table, bytes to delete).
    # ASCII whitespace that bytes.split() does not know (\x1c-\x1f) becomes a space.
    tables = {}
    for style in NORMALIZATIONS:
        table = bytearray(range(256))
        delete = bytearray()
        for c in range(128):
            ch = chr(c)
            if ch.isspace():
                table[c] = 32
            elif style == "gpt3" and _PUNCT.match(ch):
                delete.append(c)
            elif style == "gpt2" and _NON_ALNUM.match(ch):
                table[c] = 32
        tables[style] = (bytes(table), bytes(delete))
    return tables


_ASCII = _ascii_tables()
_NON_ASCII = re.compile(r"[^\x00-\x7f]")


@lru_cache(maxsize=1 << 16)
def _non_ascii_replacement(char: str, style: str) -> str:
    """What one non-ASCII character becomes: itself (a letter or digit), a space or nothing."""
    if char.isspace():
        return " "
    if style == "gpt3":
        return _PUNCT.sub("", char)
    return _NON_ALNUM.sub(" ", char)


def _fix_non_ascii(text: str, style: str) -> str:
    """Apply the Unicode rules to the non-ASCII characters of ``text`` (the rest is left as it is).

    The rules are per character, so each *distinct* non-ASCII character is looked up once and
    replaced with one C-level ``str.replace``: a document has few of them (quotes, dashes, accented
    letters), and this is several times faster than a regex callback per run. (``gpt2`` breaks a
    run of symbols into several spaces instead of one: the same words.)
    """
    for char in set(_NON_ASCII.findall(text)):
        replacement = _non_ascii_replacement(char, style)
        if replacement != char:
            text = text.replace(char, replacement)
    return text


def _word_bytes(text: str, style: str) -> list[bytes]:
    """The words of ``words(text, style)`` as UTF-8 bytes, about twice as fast.

    The ASCII part is handled by ``bytes.translate`` (one C pass); only runs of non-ASCII characters
    go through the Unicode regexes. ``tests/test_ngram_overlap.py`` checks the two paths agree.
    """
    return normalized_bytes(text, style).split()


def normalized_bytes(text: str, style: str = "gpt3") -> bytes:
    """The normalised text as UTF-8 bytes: words separated by ASCII spaces (see the module docstring)."""
    _check_style(style)
    lowered = text.lower()
    if not lowered.isascii():
        lowered = _fix_non_ascii(lowered, style)
    table, delete = _ASCII[style]
    # "surrogatepass": a lone surrogate (possible in JSON-decoded text) must not fail a whole batch
    return lowered.encode("utf-8", "surrogatepass").translate(table, delete)


_LENGTH_SALT = 0x9E3779B97F4A7C15


_CHUNK_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


def _hash_words(buf: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(word hashes, byte starts, byte ends) of the space-separated words of ``buf``, vectorised.

    A word is read 8 bytes at a time: ``chunks[i]`` is the little-endian uint64 at byte ``i`` (an
    unaligned strided view of the buffer, no copy), so a word of up to 8 bytes costs one gather and
    one mask, and only the few longer words need more rounds. Work grows with the number of words,
    not bytes (a byte-level prefix sum was the largest cost of a corpus scan).
    """
    n = len(buf)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return np.zeros(0, dtype=np.uint64), empty, empty
    a = np.frombuffer(buf, dtype=np.uint8)
    # a word starts or ends wherever "is a space" flips (the buffer is framed by spaces)
    space = np.empty(n + 2, dtype=bool)
    space[0] = space[-1] = True
    np.equal(a, 32, out=space[1:-1])
    flips = np.flatnonzero(space[1:] != space[:-1])
    starts, ends = flips[0::2], flips[1::2]
    lengths = ends - starts
    chunks = np.ndarray(shape=(n,), dtype="<u8", buffer=buf + bytes(8), strides=(1,))
    raw = chunks[starts] & _CHUNK_MASKS[np.minimum(lengths, 8)]
    longer = np.flatnonzero(lengths > 8)
    power = np.uint64(1)
    with np.errstate(over="ignore"):
        for offset in range(8, int(lengths.max()) if longer.shape[0] else 0, 8):
            power *= np.uint64(rolling.BASE)
            rest = lengths[longer] - offset
            chunk = chunks[starts[longer] + offset] & _CHUNK_MASKS[np.minimum(rest, 8)]
            raw[longer] += chunk * power
            longer = longer[rest > 8]
        salted = raw ^ (lengths.astype(np.uint64) * np.uint64(_LENGTH_SALT))
    return rolling.mix64(salted), starts, ends


def word_hash(word: bytes) -> int:
    """The hash of one normalised word, in plain Python (the reference ``word_hashes`` vectorises).

    ``mix64(sum_j C_j * B**j ^ len * S)`` where ``C_j`` is the little-endian integer of bytes
    ``8j .. 8j+7`` of the word (zero-padded): a word of up to 8 bytes is its bytes, unchanged.
    """
    raw = 0
    for j in range(0, len(word), 8):
        chunk = int.from_bytes(word[j : j + 8], "little")
        raw = (raw + chunk * pow(rolling.BASE, j // 8, 1 << 64)) % (1 << 64)
    return rolling.mix64_int(raw ^ ((len(word) * _LENGTH_SALT) % (1 << 64)))


def word_hashes(text: str, style: str = "gpt3") -> np.ndarray:
    """The hash of each normalised word (see the module docstring), as a uint64 array."""
    return _hash_words(normalized_bytes(text, style))[0]


def word_hashes_and_words(text: str, style: str = "gpt3") -> tuple[np.ndarray, list[bytes]]:
    """Like ``word_hashes`` but also returns the UTF-8 words (for showing a matched n-gram)."""
    buf = normalized_bytes(text, style)
    return _hash_words(buf)[0], buf.split()


class DocWords:
    """The words of one document of a ``TokenBatch``, cut out of the batch's bytes when asked for."""

    def __init__(self, batch: TokenBatch, first: int, last: int) -> None:
        self._batch, self._first, self._last = batch, first, last

    def __len__(self) -> int:
        return self._last - self._first

    def __getitem__(self, item: slice) -> list[bytes]:
        lo, hi, _ = item.indices(len(self))
        b, base = self._batch, self._first
        starts = b.starts[base + lo : base + hi].tolist()
        ends = b.ends[base + lo : base + hi].tolist()
        return [b.buf[s:e] for s, e in zip(starts, ends, strict=True)]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self[:])

    def text(self, lo: int, hi: int) -> bytes:
        """Words ``lo`` to ``hi`` (exclusive) joined by single spaces (evidence text)."""
        if hi <= lo:
            return b""
        b, base = self._batch, self._first
        raw = b.buf[int(b.starts[base + lo]) : int(b.ends[base + hi - 1])]
        return b" ".join(raw.split()) if b"  " in raw else raw


class TokenBatch:
    """A batch of documents normalised and word-hashed in one vectorised pass over their bytes.

    ``hashes[d]`` are document ``d``'s word hashes (views into one array) and ``words[d]`` its words;
    ``windows(n)`` hashes every ``n``-word window of the batch, all lengths sharing one prefix sum.
    Per-document lists (``hashes``, ``words``) are made only when asked for.
    """

    def __init__(self, texts: Sequence[str], style: str = "gpt3") -> None:
        parts = [normalized_bytes(t, style) for t in texts]
        self.buf = b" ".join(parts)
        doc_byte_ends = np.cumsum([len(p) + 1 for p in parts]).astype(np.int64)
        self.all_hashes, self.starts, self.ends = _hash_words(self.buf)
        # a word belongs to the document whose bytes it lies in
        lasts = np.searchsorted(self.ends, doc_byte_ends, side="right").astype(np.int64)
        firsts = np.concatenate([np.zeros(1, dtype=np.int64), lasts[:-1]]) if len(texts) else lasts
        self.doc_starts, self.doc_ends = firsts, lasts
        self._hashes: list[np.ndarray] | None = None
        self._words: list[DocWords] | None = None
        self._prefix: rolling.Prefix | None = None
        self._windows: dict[int, Windows] = {}

    @property
    def hashes(self) -> list[np.ndarray]:
        if self._hashes is None:
            bounds = zip(self.doc_starts.tolist(), self.doc_ends.tolist(), strict=True)
            self._hashes = [self.all_hashes[f:e] for f, e in bounds]
        return self._hashes

    @property
    def words(self) -> list[DocWords]:
        if self._words is None:
            bounds = zip(self.doc_starts.tolist(), self.doc_ends.tolist(), strict=True)
            self._words = [DocWords(self, f, e) for f, e in bounds]
        return self._words

    def prefix(self) -> rolling.Prefix:
        """The prefix sums of the batch's word hashes (any window or span hashes from them)."""
        if self._prefix is None:
            self._prefix = rolling.Prefix(self.all_hashes)
        return self._prefix

    def windows(self, n: int) -> Windows:
        """All ``n``-word windows of the batch (``valid`` False where one crosses a document end)."""
        if n not in self._windows:
            hashes = finish(self.prefix().windows(n), n)
            self._windows[n] = _windows_from(hashes, n, self.doc_starts, self.doc_ends)
        return self._windows[n]


def finish(raw: np.ndarray, n: int | np.ndarray) -> np.ndarray:
    """Window hashes from raw polynomial hashes of windows of ``n`` words (``n`` may vary per window)."""
    with np.errstate(over="ignore"):
        return rolling.mix64(raw + np.asarray(n).astype(np.uint64))


def window_hashes(hashes: np.ndarray, n: int) -> np.ndarray:
    """The hash of every window of ``n`` consecutive word hashes (``len - n + 1`` values, or none).

    ``mix64(sum_k hashes[j + k] * B**k + n  mod 2**64)`` (``contamray.metrics.rolling``): equal
    windows get equal values wherever they occur, so benchmark n-grams and corpus windows compare.
    """
    if n < 1:
        raise ValueError(f"n-gram length must be >= 1, got {n}")
    return finish(rolling.window_hashes(np.asarray(hashes, dtype=np.uint64), n), n)


def ngram_hashes(text: str, n: int, style: str = "gpt3") -> np.ndarray:
    """Hashes of every word n-gram of ``text`` in order (position ``j`` starts at word ``j``)."""
    return window_hashes(word_hashes(text, style), n)


@dataclass
class Windows:
    """The ``n``-word windows of a batch of documents, hashed in one pass over their concatenation.

    ``hashes[p]`` is the window starting at word ``p`` of the concatenation; ``valid[p]`` is False
    for windows that straddle two documents. ``locate`` maps positions to (document, word offset),
    so that work is done only for the few positions that matched.
    """

    hashes: np.ndarray
    valid: np.ndarray
    starts: np.ndarray  # first word of each document in the concatenation
    ends: np.ndarray  # one past its last word

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        doc = np.searchsorted(self.ends, positions, side="right")
        return doc, positions - self.starts[doc]


def _windows_from(hashes: np.ndarray, n: int, starts: np.ndarray, ends: np.ndarray) -> Windows:
    m = hashes.shape[0]
    valid = np.ones(m, dtype=bool)
    if n > 1 and m:
        # a window starting at p crosses a document end e iff e - n < p < e
        crossing = (ends[:-1, None] - np.arange(1, n)[None, :]).ravel()
        valid[crossing[(crossing >= 0) & (crossing < m)]] = False
    return Windows(hashes, valid, starts, ends)


def hash_windows(word_hash_arrays: Sequence[np.ndarray], n: int) -> Windows:
    """Hash all ``n``-word windows of many documents at once (see ``Windows``)."""
    lengths = np.fromiter((a.shape[0] for a in word_hash_arrays), dtype=np.int64, count=len(word_hash_arrays))
    ends = np.cumsum(lengths)
    starts = ends - lengths
    if not lengths.size or ends[-1] < n:
        return Windows(np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=bool), starts, ends)
    return _windows_from(window_hashes(np.concatenate(word_hash_arrays), n), n, starts, ends)


def batch_windows(
    word_hash_arrays: Sequence[np.ndarray], n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All ``n``-word windows of many documents, windows straddling two documents dropped.

    Returns ``(hashes, doc, offset)``: the window hash, the index of its document in
    ``word_hash_arrays`` and its word offset inside that document.
    """
    windows = hash_windows(word_hash_arrays, n)
    positions = np.flatnonzero(windows.valid)
    doc, offset = windows.locate(positions)
    return windows.hashes[positions], doc, offset


def as_signed(hashes: np.ndarray | int) -> np.ndarray | int:
    """uint64 hashes as int64 (same bits): Arrow, pandas and JSON handle these without overflow."""
    if isinstance(hashes, np.ndarray):
        return hashes.view(np.int64)
    value = int(hashes) & _MASK
    return value - (1 << 64) if value >= 1 << 63 else value
