"""Word n-grams as 64-bit hashes: the shared vocabulary of the n-gram overlap matchers.

Normalisation follows the paper that defines the matcher, so a hit means what the paper meant:

- ``"gpt3"`` (Brown et al. 2020, "Language Models are Few-Shot Learners", Appendix C): "we define a
  gram as a lowercase, whitespace delimited word with no punctuation" / "ignoring all punctuation,
  whitespace, and casing". Text is lowercased, punctuation is *deleted* (``don't`` -> ``dont``,
  ``U.S.`` -> ``us``) and the rest is split on whitespace.
- ``"gpt2"`` (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners", Sec. 4):
  "strings were normalized to contain only lower-cased alphanumeric words with a single space as a
  delimiter". Every run of characters that is not a letter, digit or combining mark becomes a word
  break (``don't`` -> ``don t``).

Every language, in this order, identically for the benchmark and the corpus side:

1. **Lowercase and Unicode NFKC** (lowercase, NFKC, lowercase again: NFKC can make capitals,
   ``ℌ`` -> ``H``). NFC and NFD spellings of a text (``café`` as one code point or as ``e`` +
   U+0301), full-width forms (``ｃａｆｅ``, ``，``), ligatures (``ﬁ``) and other compatibility
   characters (``…`` -> ``...``, ``½`` -> ``1⁄2``) become one spelling, as in huggingface/datatrove's
   text normalisation. (Pure-ASCII text is already NFKC: it skips the step.)
2. **Diacritic folding**, optional (the ``+fold`` style suffix, ``fold_diacritics`` of the n-gram
   methods): canonical decomposition (NFD), every non-spacing mark (category ``Mn``) deleted, NFC
   again, as datatrove's ``simplify_text`` (``norm_unicode_diacritics``) does, so ``café`` equals
   ``cafe``. **Off by default** for ``gpt3`` and ``gpt2``: the papers list what they ignore
   (punctuation, whitespace, casing; GPT-2: "alphanumeric words"), and accented letters are letters,
   so the faithful reading keeps them. Folding is also lossy where marks are letters: Vietnamese
   tones, Devanagari vowel signs, Arabic and Hebrew vowel points, the Japanese voicing mark (``が``
   becomes ``か``). Turn it on to catch corpora that stripped accents (datatrove's decontamination
   does), at the price of merging such words.
3. **Punctuation**: every character that is neither alphanumeric (``str.isalnum``), a combining mark
   (category ``M*``, part of the word it follows: Devanagari, Thai and Myanmar vowel signs) nor
   whitespace is punctuation, so symbols (``$``, ``%``, emoji) go too; ``_`` is punctuation.
4. **Scripts written without spaces**: every letter or digit of CJK ideographs (with the CJK
   symbols block's ideographic letters such as ``々`` and ``〇``, Kangxi radicals and Bopomofo),
   Hiragana, Katakana, Thai, Lao, Khmer and Myanmar, with the combining marks that follow it, is a
   word of its own. So a 13-gram of Chinese is 13 characters, about 7 Chinese words (Thai letters are
   alphabetic: 13 of them are 2 to 4 words; choose ``n`` accordingly). Hangul is written with spaces
   and stays as it is. Mixed text: ``GPT-4在中文上`` is ``gpt4 在 中 文 上`` under ``gpt3`` and
   ``gpt 4 在 中 文 上`` under ``gpt2``.
5. Split on whitespace.

Everything is plain ``re`` / ``str`` / ``unicodedata`` work in C: no nltk, no tokenizer data to
download. The fast path (``normalized_bytes``) handles the ASCII bytes with one ``bytes.translate``
and each *distinct* non-ASCII character once; ``normalize`` is the plain-regex reference it is tested
against.

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

import bisect
import re
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from contamray.metrics import rolling

NORMALIZATIONS = ("gpt3", "gpt2")
FOLD = "+fold"  # style suffix: fold diacritics (step 2 of the module docstring)
STYLES = NORMALIZATIONS + tuple(n + FOLD for n in NORMALIZATIONS)

_MASK = (1 << 64) - 1

# Scripts written without spaces between words (step 4): inclusive code point ranges, sorted.
SPACELESS_RANGES: tuple[tuple[int, int], ...] = (
    (0x0E00, 0x0E7F),  # Thai
    (0x0E80, 0x0EFF),  # Lao
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
    (0x19E0, 0x19FF),  # Khmer symbols
    (0x2E80, 0x2FDF),  # CJK and Kangxi radicals
    (0x3005, 0x3007),  # 々 〆 〇
    (0x3021, 0x3029),  # Hangzhou numerals
    (0x3031, 0x3035),  # kana repeat marks
    (0x3038, 0x303C),  # Hangzhou numerals, 〻 〼
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3100, 0x312F),  # Bopomofo
    (0x31A0, 0x31FF),  # Bopomofo extended, CJK strokes, Katakana phonetic extensions
    (0x3400, 0x4DBF),  # CJK ideographs extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xA9E0, 0xA9FF),  # Myanmar extended-B
    (0xAA60, 0xAA7F),  # Myanmar extended-A
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0x16FE0, 0x16FFF),  # ideographic symbols
    (0x1B000, 0x1B16F),  # kana supplement and extensions
    (0x20000, 0x3FFFF),  # CJK ideographs extensions B to I
)
_SPACELESS_STARTS = [lo for lo, _ in SPACELESS_RANGES]


def is_spaceless(char: str) -> bool:
    """Whether ``char`` belongs to a script written without spaces (its letters are words)."""
    code = ord(char)
    i = bisect.bisect_right(_SPACELESS_STARTS, code) - 1
    return i >= 0 and code <= SPACELESS_RANGES[i][1]


@lru_cache(maxsize=1)
def _mark_classes() -> tuple[str, str]:
    """Regex character-class bodies of all combining marks (``M*``) and of non-spacing marks (``Mn``).

    Built on first use (a tenth of a second over every code point), not at import.
    """
    marks: list[int] = []
    nonspacing: list[int] = []
    for code in range(0x80, 0x110000):
        category = unicodedata.category(chr(code))
        if category[0] == "M":
            marks.append(code)
            if category == "Mn":
                nonspacing.append(code)
    return _class_body(marks), _class_body(nonspacing)


def _class_body(codes: list[int]) -> str:
    """``a-cx-z``-style ranges of sorted code points, escaped for a regex character class."""
    parts = []
    start = prev = codes[0]
    for code in [*codes[1:], -1]:
        if code == prev + 1:
            prev = code
            continue
        parts.append(re.escape(chr(start)) + ("-" + re.escape(chr(prev)) if prev > start else ""))
        start = prev = code
    return "".join(parts)


@lru_cache(maxsize=1)
def _regexes() -> dict[str, re.Pattern[str]]:
    marks, nonspacing = _mark_classes()
    spaceless = "".join(f"{re.escape(chr(lo))}-{re.escape(chr(hi))}" for lo, hi in SPACELESS_RANGES)
    return {
        "nonspacing": re.compile(f"[{nonspacing}]+"),
        "gpt3": re.compile(rf"[^\w\s{marks}]|_"),  # punctuation: deleted
        "gpt2": re.compile(rf"(?:[^\w{marks}]|_)+"),  # not part of a word: a break
        "cluster": re.compile(f"[{spaceless}][{marks}]*"),  # a word of a spaceless script
    }


_STYLE_PARTS = {style: (style.removesuffix(FOLD), style.endswith(FOLD)) for style in STYLES}


def _parse_style(style: str) -> tuple[str, bool]:
    """(``gpt3`` or ``gpt2``, whether to fold diacritics) of a style string."""
    parts = _STYLE_PARTS.get(style)
    if parts is None:
        raise ValueError(
            f"unknown normalization {style!r}; expected one of {', '.join(STYLES)} "
            f"({FOLD!r} folds diacritics, see contamray.metrics.ngrams)"
        )
    return parts


def style_name(normalization: str, fold_diacritics: bool = False) -> str:
    """The style string of a method config's ``normalization`` and ``fold_diacritics``."""
    style = normalization + (FOLD if fold_diacritics else "")
    _parse_style(style)
    return style


def _composes(char: str) -> bool:
    """Whether ``char`` can join what precedes it under canonical composition or reordering: a
    combining mark (every character with a nonzero combining class is one) or a conjoining Hangul
    vowel or final."""
    return unicodedata.category(char)[0] == "M" or 0x1160 <= ord(char) <= 0x11FF


@lru_cache(maxsize=1 << 16)
def _nfkc_alone(char: str) -> str | None:
    """NFKC and lowercase of one (lowercased) character when that is what it becomes in any text;
    None when it depends on its neighbours (``_composes``, or its NFKC has a combining part).

    Without characters that compose, NFKC of a text is the NFKC of each character on its own.
    """
    if _composes(char):
        return None
    out = unicodedata.normalize("NFKC", char)
    if out == char:
        return char
    return None if any(map(_composes, out)) else out.lower()


def _unicode_forms(text: str, fold: bool) -> tuple[str, set[str]]:
    """Steps 1 and 2 of the module docstring on non-ASCII text; also its distinct non-ASCII characters.

    Step 1 is lowercase, NFKC, lowercase again (NFKC can make capitals: ``ℌ`` -> ``H``). A text
    without combining characters (the usual non-ASCII of a Latin-script corpus: curly quotes,
    dashes, ``…``, precomposed accented letters) gets NFKC one distinct character at a time
    (``_nfkc_alone``, the same result); only text with combining marks pays the whole-text NFKC.
    """
    text = text.lower()
    chars = set(_NON_ASCII.findall(text))
    alone = {c: _nfkc_alone(c) for c in chars}
    if None in alone.values():
        text = unicodedata.normalize("NFKC", text).lower()
        chars = set(_NON_ASCII.findall(text))
    else:
        for char, out in alone.items():
            if out != char:
                text = text.replace(char, out)  # type: ignore[arg-type]
                chars.discard(char)
                chars.update(_NON_ASCII.findall(out))  # type: ignore[arg-type]
    if fold and chars:
        decomposed = unicodedata.normalize("NFD", text)
        text = unicodedata.normalize("NFC", _regexes()["nonspacing"].sub("", decomposed))
        chars = set(_NON_ASCII.findall(text))
    return text, chars


def _space_clusters(text: str) -> str:
    """Step 4: a space either side of every letter (with its marks) of a spaceless script."""
    return _regexes()["cluster"].sub(r" \g<0> ", text)


def normalize(text: str, style: str = "gpt3") -> str:
    """The normalised words of ``text`` joined by single spaces (the module docstring's steps).

    The plain-regex reference of ``normalized_bytes``.
    """
    base, fold = _parse_style(style)
    text = text.lower()
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text).lower()
    if fold:
        text = unicodedata.normalize("NFC", _regexes()["nonspacing"].sub("", unicodedata.normalize("NFD", text)))
    stripped = _regexes()[base].sub("" if base == "gpt3" else " ", text)
    return " ".join(_space_clusters(stripped).split())


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
            elif not ch.isalnum():
                if style == "gpt3":
                    delete.append(c)
                else:
                    table[c] = 32
        tables[style] = (bytes(table), bytes(delete))
    return tables


_ASCII = _ascii_tables()
_NON_ASCII = re.compile(r"[^\x00-\x7f]")


@lru_cache(maxsize=1 << 16)
def _non_ascii_replacement(char: str, base: str) -> str:
    """What one non-ASCII character becomes (step 3): itself (a letter, digit or mark), a space or nothing."""
    if char.isspace():
        return " "
    if char.isalnum() or unicodedata.category(char)[0] == "M":
        return char
    return "" if base == "gpt3" else " "


def _fix_non_ascii(text: str, chars: set[str], base: str) -> tuple[str, bool]:
    """Apply step 3 to the non-ASCII characters of ``text`` (``chars``, the distinct ones; the rest is
    left as it is); also whether it has characters of a spaceless script.

    The rules are per character, so each *distinct* non-ASCII character is looked up once and
    replaced with one C-level ``str.replace``: a document has few of them (quotes, dashes, accented
    letters), and this is several times faster than a regex callback per run. (``gpt2`` breaks a
    run of symbols into several spaces instead of one: the same words.)
    """
    spaceless = False
    for char in chars:
        replacement = _non_ascii_replacement(char, base)
        if replacement != char:
            text = text.replace(char, replacement)
        elif not spaceless and is_spaceless(char):
            spaceless = True
    return text, spaceless


def _word_bytes(text: str, style: str) -> list[bytes]:
    """The words of ``words(text, style)`` as UTF-8 bytes, about twice as fast.

    The ASCII part is handled by ``bytes.translate`` (one C pass); only runs of non-ASCII characters
    go through the Unicode rules. ``tests/test_ngram_overlap.py`` and ``tests/test_languages.py``
    check the two paths agree.
    """
    return normalized_bytes(text, style).split()


def normalized_bytes(text: str, style: str = "gpt3") -> bytes:
    """The normalised text as UTF-8 bytes: words separated by ASCII spaces (see the module docstring).

    Pure-ASCII text (most of an English corpus) is one ``lower`` and one ``bytes.translate``; other
    text pays NFKC (a C-level quick check when it is already normalised), the distinct non-ASCII
    characters and, only when it has a spaceless script, one regex pass that spaces its letters out
    (after the ASCII punctuation is gone, so that a mark still joins its letter across a deleted ``-``).
    """
    base, fold = _parse_style(style)
    table, delete = _ASCII[base]
    if text.isascii():
        return text.lower().encode("ascii").translate(table, delete)
    text, chars = _unicode_forms(text, fold)
    text, spaceless = _fix_non_ascii(text, chars, base)
    # "surrogatepass": a lone surrogate (possible in JSON-decoded text) must not fail a whole batch
    buf = text.encode("utf-8", "surrogatepass").translate(table, delete)
    if spaceless:
        buf = _space_clusters(buf.decode("utf-8", "surrogatepass")).encode("utf-8", "surrogatepass")
    return buf


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
