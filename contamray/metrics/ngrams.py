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

Hashing: each word is hashed once with xxHash64 (seed 0) of its UTF-8 bytes; the hash of the n-gram
starting at word ``j`` is xxHash64 of the ``8n`` bytes of the little-endian word hashes
``j .. j+n-1``, i.e. exactly ``xxhash.xxh64_intdigest(word_hashes[j:j+n].tobytes())``. That value is
computed for all positions at once by a NumPy transcription of the XXH64 algorithm (stripes of four
64-bit lanes, merge, tail lanes, avalanche), so a document costs one regex pass, one C-level ``map``
over its words and about a hundred vectorised uint64 operations per n-gram position, not one Python
call per n-gram. The tests check the transcription against the ``xxhash`` package. (The values
differ from datatrove's ``xxhash64(" ".join(ngram))``: indexes of the two are not interchangeable.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

NORMALIZATIONS = ("gpt3", "gpt2")

_PUNCT = re.compile(r"[^\w\s]|_")
_NON_ALNUM = re.compile(r"[\W_]+")

_U64 = np.uint64
_P1 = _U64(11400714785074694791)
_P2 = _U64(14029467366897019727)
_P3 = _U64(1609587929392839161)
_P4 = _U64(9650029242287828579)
_P5 = _U64(2870177450012600261)
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
_NON_ASCII_RUN = re.compile(r"[^\x00-\x7f]+")
_UNI_SPACE = re.compile(r"\s")


def _fix_gpt3(match: re.Match[str]) -> str:
    return _UNI_SPACE.sub(" ", _PUNCT.sub("", match.group()))


def _fix_gpt2(match: re.Match[str]) -> str:
    return _NON_ALNUM.sub(" ", match.group())


_FIX_RUN = {"gpt3": _fix_gpt3, "gpt2": _fix_gpt2}


def _word_bytes(text: str, style: str) -> list[bytes]:
    """The words of ``words(text, style)`` as UTF-8 bytes, about twice as fast.

    The ASCII part is handled by ``bytes.translate`` (one C pass); only runs of non-ASCII characters
    go through the Unicode regexes. ``tests/test_ngram_overlap.py`` checks the two paths agree.
    """
    _check_style(style)
    lowered = text.lower()
    if not lowered.isascii():
        lowered = _NON_ASCII_RUN.sub(_FIX_RUN[style], lowered)
    table, delete = _ASCII[style]
    # "surrogatepass": a lone surrogate (possible in JSON-decoded text) must not fail a whole batch
    return lowered.encode("utf-8", "surrogatepass").translate(table, delete).split()


def word_hashes(text: str, style: str = "gpt3") -> np.ndarray:
    """xxHash64 (seed 0) of each normalised word's UTF-8 bytes, as a uint64 array."""
    parts = _word_bytes(text, style)
    return np.fromiter(map(xxhash.xxh64_intdigest, parts), dtype=np.uint64, count=len(parts))


def word_hashes_and_words(text: str, style: str = "gpt3") -> tuple[np.ndarray, list[bytes]]:
    """Like ``word_hashes`` but also returns the UTF-8 words (for showing a matched n-gram)."""
    parts = _word_bytes(text, style)
    return np.fromiter(map(xxhash.xxh64_intdigest, parts), dtype=np.uint64, count=len(parts)), parts


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << _U64(r)) | (x >> _U64(64 - r))


def _round(acc: np.ndarray, lane_times_p2: np.ndarray) -> np.ndarray:
    # XXH64 round(acc, lane) = rotl(acc + lane * P2, 31) * P1, with lane * P2 precomputed.
    acc = acc + lane_times_p2
    return _rotl(acc, 31) * _P1


def window_hashes(hashes: np.ndarray, n: int) -> np.ndarray:
    """XXH64 (seed 0) of every window of ``n`` consecutive uint64s of ``hashes``, as raw bytes.

    ``out[j] == xxhash.xxh64_intdigest(hashes[j:j+n].tobytes())`` on a little-endian machine; the
    array has ``len(hashes) - n + 1`` entries (none when ``hashes`` is shorter than ``n``). Windows
    are hashed in chunks of ``_CHUNK`` so the temporaries stay in the CPU cache.
    """
    if n < 1:
        raise ValueError(f"n-gram length must be >= 1, got {n}")
    w = np.ascontiguousarray(hashes, dtype=np.uint64)
    m = w.shape[0] - n + 1
    if m <= 0:
        return np.zeros(0, dtype=np.uint64)
    out = np.empty(m, dtype=np.uint64)
    with np.errstate(over="ignore"):
        wp2 = w * _P2  # lane * P2 for every word, shared by all windows that contain it
        tail = _rotl(wp2, 31) * _P1 if n % 4 else wp2  # round(0, lane) for every word
        for start in range(0, m, _CHUNK):
            stop = min(m, start + _CHUNK)
            out[start:stop] = _xxh64_windows(wp2, tail, start, stop - start, n)
    return out


_CHUNK = 1 << 14


def _xxh64_windows(wp2: np.ndarray, tail: np.ndarray, start: int, m: int, n: int) -> np.ndarray:
    stripes = n // 4
    if stripes:
        v = []
        for k, init in enumerate(_V_INIT):
            acc = np.full(m, init, dtype=np.uint64)
            for s in range(stripes):
                off = start + 4 * s + k
                acc = _round(acc, wp2[off : off + m])
            v.append(acc)
        h = _rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)
        for acc in v:
            acc *= _P2
            h ^= _rotl(acc, 31) * _P1
            h *= _P1
            h += _P4
    else:
        h = np.full(m, _P5, dtype=np.uint64)
    h += _U64(8 * n)
    for off in range(start + 4 * stripes, start + n):
        h ^= tail[off : off + m]
        h = _rotl(h, 27)
        h *= _P1
        h += _P4
    h ^= h >> _U64(33)
    h *= _P2
    h ^= h >> _U64(29)
    h *= _P3
    h ^= h >> _U64(32)
    return h


_V_INIT = (
    _U64((_P1.item() + _P2.item()) & _MASK),
    _P2,
    _U64(0),
    _U64((-_P1.item()) & _MASK),
)


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


def hash_windows(word_hash_arrays: Sequence[np.ndarray], n: int) -> Windows:
    """Hash all ``n``-word windows of many documents at once (see ``Windows``)."""
    lengths = np.fromiter((a.shape[0] for a in word_hash_arrays), dtype=np.int64, count=len(word_hash_arrays))
    ends = np.cumsum(lengths)
    starts = ends - lengths
    if not lengths.size or ends[-1] < n:
        return Windows(np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=bool), starts, ends)
    hashes = window_hashes(np.concatenate(word_hash_arrays), n)
    m = hashes.shape[0]
    valid = np.ones(m, dtype=bool)
    if n > 1:
        # a window starting at p crosses a document end e iff e - n < p < e
        crossing = (ends[:-1, None] - np.arange(1, n)[None, :]).ravel()
        valid[crossing[(crossing >= 0) & (crossing < m)]] = False
    return Windows(hashes, valid, starts, ends)


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
