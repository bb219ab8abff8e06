"""Long corpus documents matched in pieces that lose no window (issue #16: "long documents split with an
(n-1)-word overlap so no n-gram is lost").

A match worker holds what a method builds per unit of text (GPT-4 substrings: ~42 bytes per character)
for a whole batch, so a book-length document matched at once costs memory in proportion to the book.
A document of more than ``max_bytes`` bytes of UTF-8 text is therefore matched in pieces, in the method's
own terms, which it declares as a ``Window`` (``OpenMethod.window``; the scan never imports a method's
module, it reads the declaration):

- ``count(text)``: how many of the method's units (normalised words, processed characters) a text has.
  Counts must add up over cuts made before a whitespace character (``at="space"``) - true of every
  normaliser that splits words on whitespace and never joins characters across it - or after a line
  break (``at="line"``).
- ``after``: units of text a window can reach beyond its first unit (an n-gram of ``n`` words: ``n - 1``);
  ``before``: units a method reads before a window's first unit to decide about it (Llama 2's spans: 1,
  to see whether the exact run started earlier).

How a document is cut (``split_document``): into *parts* of about ``max_bytes`` bytes at cut points;
piece ``k`` is part ``k`` with at least ``before`` units of the text before it and ``after`` units of the
text after it, in whole whitespace-separated tokens. A piece is a document dict with the same
``doc_id``, its ``text`` and ``piece = [base, lo, hi]``: ``base`` the unit offset of the piece's text in
the whole document, ``[lo, hi)`` the units of the piece's text that part ``k`` owns.

What a method's ``match`` does with a piece (``piece_bounds``): it reports only the windows that *start*
in the owned units, at their offsets in the whole document (``base`` added). A window of at most
``after + 1`` units that starts in part ``k`` lies wholly in piece ``k``, so every window of the document
is found by exactly one piece, where the whole document would have found it; the method's ``fold`` sees
all pieces of a document together (they are matched in one batch) and keeps per document what it kept of
the whole (the first occurrence, one count per document). Hence matching in pieces gives the same rows,
after folding, as matching the whole document (``tests/test_long_documents.py``).

Cost: each part's units are counted once more than when matched whole (one extra normalisation pass over
a long document), and the overlaps (``before + after`` units per piece, a few words against megabytes)
are matched twice; memory follows ``max_bytes``, not the document.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

PIECE = "piece"  # the key of a piece's [base, lo, hi] in its document dict
CUTS = ("space", "line")
_TOKEN = re.compile(r"\S+")
_SPACE = re.compile(r"\s")


@dataclass(frozen=True)
class Window:
    """What a method's ``match`` looks at, for cutting a long document (see the module docstring).

    ``unit`` names how ``count`` counts (``"words:gpt3"``, ``"chars:gpt4"``): methods whose windows have the
    same unit and ``at`` share one cut of a batch (the widest ``before`` / ``after`` of them), and so the
    batch's tokenisation.
    """

    unit: str
    count: Callable[[str], int] = field(compare=False, repr=False)
    after: int
    before: int = 0
    at: str = "space"

    def __post_init__(self) -> None:
        if self.at not in CUTS or self.after < 0 or self.before < 0:
            raise ValueError(f"Window: at must be one of {CUTS} and before / after >= 0, got {self!r}")

    @property
    def group(self) -> tuple[str, str]:
        return self.unit, self.at


def widest(windows: Iterable[Window]) -> Window:
    """One window covering all of ``windows`` (same unit and cut): the largest ``before`` and ``after``."""
    items = list(windows)
    return replace(items[0], after=max(w.after for w in items), before=max(w.before for w in items))


def text_bytes(text: str) -> int:
    """UTF-8 bytes of ``text`` (its length when ASCII)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def split_documents(docs: Sequence[dict[str, Any]], max_bytes: int, window: Window) -> list[dict[str, Any]]:
    """``docs`` with every document longer than ``max_bytes`` replaced by its pieces (``split_document``)."""
    out: list[dict[str, Any]] = []
    for doc in docs:
        out.extend(split_document(doc, max_bytes, window))
    return out


def split_document(doc: dict[str, Any], max_bytes: int, window: Window) -> list[dict[str, Any]]:
    """The pieces of ``doc`` (see the module docstring); ``[doc]`` when it has at most ``max_bytes`` bytes
    or no cut point."""
    text = doc["text"]
    size = text_bytes(text)
    if size <= max_bytes:
        return [doc]
    step = max(1, int(max_bytes * len(text) / size))  # characters per part, about max_bytes bytes
    cuts = cut_points(text, step, window.at)
    if len(cuts) <= 2:
        return [doc]
    pieces = []
    base = 0  # units of the document before part k
    for a, b in zip(cuts, cuts[1:]):
        start, end = _lead(text, a, window), _tail(text, b, window)
        lead, owned = window.count(text[start:a]), window.count(text[a:b])
        pieces.append({**doc, "text": text[start:end], PIECE: [base - lead, lead, lead + owned]})
        base += owned
    return pieces


def cut_points(text: str, step: int, at: str) -> list[int]:
    """0, the cut points about ``step`` characters apart (before a whitespace character, or after a line
    break), and ``len(text)``."""
    cuts = [0]
    while True:
        if at == "space":
            found = _SPACE.search(text, cuts[-1] + step)
            cut = found.start() if found else -1
        else:
            cut = text.find("\n", cuts[-1] + step - 1)
            cut = cut + 1 if cut >= 0 else -1
        if cut <= cuts[-1] or cut >= len(text):
            break
        cuts.append(cut)
    return [*cuts, len(text)]


def _tail(text: str, b: int, window: Window) -> int:
    """An end ``e >= b`` (before a whitespace character, or the text's end) with ``after`` units in
    ``text[b:e]``: whole tokens, twice as many until they hold enough units."""
    if window.after == 0:
        return b
    tokens = window.after
    while True:
        end = b
        for i, token in enumerate(_TOKEN.finditer(text, b)):
            end = token.end()
            if i + 1 == tokens:
                break
        else:
            return len(text)
        if window.count(text[b:end]) >= window.after:
            return end
        tokens *= 2


def _lead(text: str, a: int, window: Window) -> int:
    """A start ``s <= a`` (at a whitespace character, or 0) with ``before`` units in ``text[s:a]``."""
    if window.before == 0:
        return a
    tokens, span = window.before, 64 * window.before
    while True:
        lo = max(0, a - span)
        starts = [t.start() for t in _TOKEN.finditer(text, lo, a)]
        if lo > 0:
            starts = starts[1:]  # the first may be cut by ``lo``
        if len(starts) < tokens and lo > 0:
            span *= 2
            continue
        if len(starts) < tokens:
            return 0
        start = max(0, starts[-tokens] - 1)
        if start == 0 or window.count(text[start:a]) >= window.before:
            return start
        tokens *= 2


@dataclass(frozen=True)
class Bounds:
    """Per document of a batch: the unit offset of its text in the whole document (``base``) and the units
    it owns, ``[lo, hi)`` (a whole document: 0, everything)."""

    base: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    def owned(self, doc: np.ndarray, offset: np.ndarray) -> np.ndarray:
        """Which windows (of documents ``doc`` at piece offsets ``offset``) start in owned units."""
        return (offset >= self.lo[doc]) & (offset < self.hi[doc])


def piece_bounds(docs: Sequence[dict[str, Any]]) -> Bounds:
    """The ``Bounds`` of a batch's documents (from their ``piece``; whole documents own everything)."""
    n = len(docs)
    base, lo = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    hi = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    for i, doc in enumerate(docs):
        piece = doc.get(PIECE)
        if piece is not None:
            base[i], lo[i], hi[i] = piece
    return Bounds(base, lo, hi)


def batches(
    docs: Iterable[dict[str, Any]], max_bytes: int, window: Window | None, max_docs: int | None = None
) -> Iterator[list[dict[str, Any]]]:
    """``docs`` (a list, or a stream read lazily) cut into pieces (when ``window`` is given) and grouped in
    consecutive batches of about ``max_bytes`` bytes of text and at most ``max_docs`` documents: a batch ends
    with the document that reaches either bound."""
    batch: list[dict[str, Any]] = []
    size = 0
    for doc in split_documents(docs, max_bytes, window) if window is not None else docs:
        batch.append(doc)
        size += text_bytes(doc["text"])
        if size >= max_bytes or (max_docs is not None and len(batch) >= max_docs):
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
