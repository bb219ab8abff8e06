"""N-gram collisions between benchmark examples and a training corpus (GPT-2 / GPT-3 style).

Papers and the parameters they used:

- Radford et al. 2019, "Language Models are Unsupervised Multitask Learners" (GPT-2), Sec. 4 and
  Table 6: Bloom filters of the **8-grams** of WebText, text "normalized to contain only lower-cased
  alphanumeric words with a single space as a delimiter", false-positive rate bounded by 1e-8; the
  statistic is the percentage of a test set's 8-grams found in WebText. Here: ``n=8``,
  ``normalization="gpt2"``; the percentage is ``details["ngram_overlap_pct"]`` of the verdict. We
  count exact 64-bit hash collisions instead of a Bloom filter (false-positive rate about
  index size / 2**64 per corpus n-gram).
- Brown et al. 2020, "Language Models are Few-Shot Learners" (GPT-3), Sec. 4 and Appendix C: an
  example is "dirty" if it has **any** N-gram collision with **any** training document (exact, not
  a Bloom filter), words "ignoring all punctuation, whitespace, and casing", N up to **13**
  (``n=13``, ``min_matches=1``, ``normalization="gpt3"``, the defaults). Examples shorter than N are
  flagged when "they overlap with the whole example" (Sec. 4), and "examples less than 8 words long
  ... we ignored" (App. C): ``short_examples="whole"``, ``min_words=8``. GPT-3's N was per dataset
  (the 5th-percentile example length clamped to [8, 13]); set ``n`` per benchmark to reproduce a
  Table C.1 row.

- Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways", Sec. 8 (data
  contamination): an example is contaminated when "at least 70% of [its] 8-grams" occur at least once
  in the training data: ``n=8``, ``min_fraction=0.7`` (``conf/method/palm.yaml``). PaLM does not say
  how text was normalised; we use GPT-3's rule.

GPT-3's frequent n-grams: App. C says "We ignored 13-grams that matched more than 10 training
documents", in the paragraph on filtering the training set with the same 13-gram procedure; the
``gpt3_13gram`` config applies it to the overlap analysis too (``max_doc_frequency=10``: an n-gram in
11 or more distinct documents is ignored, the paper's "more than 10"). The count is streamed, never a
dict of the corpus: every match row carries the n-gram hash and the document id, and the rows of one
example list *every* document containing each of its n-grams (only benchmark n-grams produce rows).
``fold`` (issue #16: aggregate where the data is) turns them into one row per example whose
per-n-gram document counts add up across batches (a document is matched in one batch) and stop at
``max_doc_frequency + 1``, so ``score`` decides "over the limit" exactly from folded rows, raw rows
or both. To keep common n-grams from flooding the pipeline, a match process stops emitting rows for
an n-gram once *it* has seen it in more than ``max_doc_frequency`` documents: the rows already
emitted prove it is over the limit, so the result is the same.

Known deviations of ntunlp/LLMSanitize (``open_data_methods/gpt3.py``), where we follow the paper:
it drops 13-grams found in >= 10 training documents (the paper: more than 10), always; its loop
deletes dict keys while iterating them, which raises in Python 3; it skips examples shorter than 13
words altogether, removing them from the denominator, where GPT-3 matched them whole; its tokenizer
needs nltk's punkt data. Its PaLM (``palm.py``) counts an example's 8-grams with repeats and does not
normalise text.

Evidence: per example, the number of matched documents (``n_docs``), the first ``max_evidence`` of
them (``doc_ids``), n-grams (``evidence``) and word spans they cover (``spans``: normalised-word
offsets, first occurrences), all in sorted order, so the folded rows keep only that much.

Which n-grams: as in huggingface/datatrove's ``NGramsDecontIndexer``, the example text is the input
fields followed by the label fields (the verbalised example), and its n-grams are kept apart by
region: wholly inside the input (``"input"``), wholly inside the label (``"label"``) and spanning the
boundary (``"overlap"``). Counts are of *distinct* n-grams per region. The type of a contaminated
example follows where its matched words fall (issue #16, "honest types"): ``"input_only"`` when
input words are matched and fewer than ``min_label_share`` of the label's, ``"input_and_label"``
when at least that share of the label is matched too, ``"label_only"`` when no input word is (the
answer alone is in the corpus). An example clean only because its matches were ignored as too
frequent (``max_doc_frequency``) is ``"frequent_only"``, counted apart from ``"clean"``.

Template n-grams (issue #16; ours, not the papers'): on an 18 MB corpus with 200 planted MMLU items, 116
unplanted items were flagged only because they share 12-grams of a question template ("choose an
option which presents a counterexample") with planted ones. An n-gram held by ``template_min_items``
(2) or more benchmark items of the index is evidence for none of them alone: the index counts the
items behind each n-gram (``_Table.items``), match rows carry it (``ngram_items``), ``fold`` keeps those
grams apart, and an example is contaminated on its own grams only; one found only through template
grams is ``"template_only"``, counted apart like ``"frequent_only"``. Two identical benchmark items
share all their n-grams, so a copy of either is ``template_only`` for both: the corpus cannot tell
which one it copied. ``template_min_items: null`` restores the papers' rule (every n-gram counts).

Steps (open-data protocol of ``contamray.methods.base``): ``build_index`` (benchmark side, small,
``ray.put`` once) -> ``match`` (stateless, runs in CPU actors over corpus batches) -> ``score``
(one row per example) -> ``reduce`` (fraction of contaminated examples).
"""

from __future__ import annotations

import threading
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from contamray.corpus.pieces import Bounds, Window, piece_bounds
from contamray.methods.base import Outputs, Verdict, register
from contamray.methods.open import common
from contamray.methods.open.common import CONTAMINATION_TYPES, HashTable
from contamray.metrics.hash_lookup import SortedHashes
from contamray.metrics.ngrams import (
    NORMALIZATIONS,
    TokenBatch,
    Windows,
    as_signed,
    finish,
    hash_windows,
    normalized_bytes,
    style_name,
    window_hashes,
    word_hashes,
)
from contamray.records import Record

NAME = "ngram_overlap"
REGIONS = ("input", "label", "overlap")
INPUT, LABEL, OVERLAP = 0, 1, 2
SHORT_POLICIES = ("whole", "skip")

# How each example was checked (column ``status`` of ``score``).
STATUS_NGRAMS = "ngrams"  # at least n words: its n-grams were matched
STATUS_WHOLE = "whole_example"  # min_words <= words < n: matched as one gram of all its words
STATUS_TOO_SHORT = "too_short"  # fewer than min_words words (or short_examples="skip"): not checked
STATUS_EMPTY = "empty"  # no words at all in the chosen fields: an error row


@dataclass(frozen=True)
class NGramOverlapConfig:
    """Parameters of ``ngram_overlap``; defaults are GPT-3's (Brown et al. 2020, App. C).

    Worked example, ``n=4``, input words ``A B C D E``, label words ``F G``:
    input n-grams ``ABCD BCDE``; label n-grams none (2 words < 4); overlap n-grams ``CDEF DEFG``.
    A corpus document containing ``... B C D E`` matches one input n-gram (``input_only``); one
    containing ``D E F G`` matches an overlap n-gram (``input_and_label``).

    - ``n``: words per n-gram (13 GPT-3, 8 GPT-2).
    - ``min_matches``: distinct matched n-grams needed to call an example contaminated (1 = GPT-3's
      "any collision").
    - ``input_fields`` / ``label_fields``: Record fields joined (space-separated, in order) into the
      input and the label; the example is input followed by label. ``label_fields=()`` with
      ``input_fields=("verbalized",)`` matches the verbalised form as one region (all "input").
    - ``normalization``: ``"gpt3"`` (punctuation deleted) or ``"gpt2"`` (non-alphanumerics split
      words); see ``contamray.metrics.ngrams``. Every language: NFKC, and each character of a script
      written without spaces (Chinese, Japanese kana, Thai, ...) is a word.
    - ``fold_diacritics``: also delete non-spacing marks (``café`` = ``cafe``, datatrove's folding);
      off by default, as the papers' rules keep accented letters (``contamray.metrics.ngrams``).
    - ``short_examples``: ``"whole"`` (GPT-3 Sec. 4: an example shorter than ``n`` words but with at
      least ``min_words`` is matched as one gram of all its words) or ``"skip"`` (never checked).
    - ``min_words``: shorter examples are not checked (GPT-3 App. C ignored examples < 8 words);
      they stay in the table with ``status="too_short"`` and count as clean, as in GPT-3's tables.
    - ``min_fraction``: if set, an example is contaminated only when at least this fraction of its
      grams is found (PaLM, Chowdhery et al. 2022, Sec. 8: 70 % of its 8-grams, ``0.7``); ``None``
      (default) = GPT-3's "any collision" (``min_matches``).
    - ``max_doc_frequency``: if set, n-grams found in more than this many distinct documents are
      ignored (GPT-3 App. C: "We ignored 13-grams that matched more than 10 training documents" as
      "common cultural phrases, legal boilerplate"; ``10`` in ``conf/method/gpt3_13gram.yaml``);
      ``None`` (default) ignores nothing. The count is streamed: see ``match``.
    - ``template_min_items``: an n-gram held by at least this many distinct benchmark items (of the
      index: the benchmark's rows) is a *template* n-gram ("which of the following ...", a shared
      instruction), weak evidence for each of them: an example is contaminated on its own n-grams, and
      one found only through template n-grams is ``template_only`` (not contaminated, not clean; issue
      #16). Default 2 (any n-gram two items share); ``None`` counts every n-gram alike, as the papers
      do. See ``decision``.
    - ``min_label_share``: the share of the label's words that must lie in matched grams for a
      contaminated example to be ``input_and_label`` rather than ``input_only`` (default 0.5: at least
      half of the answer is in the corpus with the question; one n-gram crossing into a 40-word
      solution is not its answer). An example whose matched words are all label words is
      ``label_only``. See ``match_type``.
    - ``partition_threshold``: the partition is called contaminated when the fraction of
      contaminated examples is *above* this (default 0.0: any dirty example, see ``reduce``).
    - ``max_evidence``: how many matched document ids and n-grams to keep per example.
    """

    n: int = 13
    min_matches: int = 1
    input_fields: tuple[str, ...] = ("input",)
    label_fields: tuple[str, ...] = ("label",)
    normalization: str = "gpt3"
    fold_diacritics: bool = False
    short_examples: str = "whole"
    min_words: int = 8
    min_fraction: float | None = None
    max_doc_frequency: int | None = None
    template_min_items: int | None = 2
    min_label_share: float = 0.5
    partition_threshold: float = 0.0
    max_evidence: int = 5

    def __post_init__(self) -> None:
        common.set_fields(NAME, self, optional=("input_fields", "label_fields"))
        if not self.input_fields and not self.label_fields:
            raise ValueError(f"{NAME}: input_fields and label_fields are both empty; name at least one")
        common.check_config(
            NAME,
            self,
            [
                common.integer(self, "n", 1, "(13 GPT-3, 8 GPT-2)"),
                common.integer(self, "min_matches", 1),
                common.integer(self, "min_words", 1),
                ("normalization", self.normalization in NORMALIZATIONS, f"one of {', '.join(NORMALIZATIONS)}"),
                ("fold_diacritics", isinstance(self.fold_diacritics, bool), "true or false"),
                ("short_examples", self.short_examples in SHORT_POLICIES, f"one of {', '.join(SHORT_POLICIES)}"),
                (
                    "min_fraction",
                    self.min_fraction is None or 0.0 < float(self.min_fraction) <= 1.0,
                    "null or a fraction in (0, 1] (0.7 PaLM)",
                ),
                (
                    "min_label_share",
                    0.0 < float(self.min_label_share) <= 1.0,
                    "a fraction in (0, 1] (0.5)",
                ),
                (
                    "template_min_items",
                    self.template_min_items is None
                    or (isinstance(self.template_min_items, int) and self.template_min_items >= 2),
                    "null (the papers' rule: no template n-grams) or an integer >= 2",
                ),
                (
                    "max_doc_frequency",
                    self.max_doc_frequency is None
                    or (isinstance(self.max_doc_frequency, int) and self.max_doc_frequency >= 1),
                    "null or an integer >= 1",
                ),
            ],
        )

    @property
    def style(self) -> str:
        """The ``contamray.metrics.ngrams`` style of ``normalization`` and ``fold_diacritics``."""
        return style_name(self.normalization, self.fold_diacritics)


# --------------------------------------------------------------------------- the benchmark side


@dataclass
class ExampleGrams:
    """The distinct grams of one example, by region, and how it is checked."""

    n_words: int
    gram_len: int  # n, the example's own length (whole-example match) or 0 (not checked)
    status: str
    hashes: tuple[np.ndarray, np.ndarray, np.ndarray]  # distinct uint64 hashes per region
    anchor: int = 0  # whole-example grams: hash of the first ``min_words`` words (the lookup key)

    @property
    def counts(self) -> tuple[int, int, int]:
        return tuple(int(h.shape[0]) for h in self.hashes)  # type: ignore[return-value]


def example_grams(record: Record, cfg: NGramOverlapConfig) -> ExampleGrams:
    """Split one example into its input / label / overlap grams (see the module docstring)."""
    wi = word_hashes(common.join_fields(record, cfg.input_fields), cfg.style)
    wl = word_hashes(common.join_fields(record, cfg.label_fields), cfg.style)
    ni, nl = wi.shape[0], wl.shape[0]
    total = ni + nl
    empty = np.zeros(0, dtype=np.uint64)
    if total == 0:
        return ExampleGrams(0, 0, STATUS_EMPTY, (empty, empty, empty))
    both = np.concatenate([wi, wl])
    if total >= cfg.n:
        n = cfg.n
        windows = window_hashes(both, n)
        starts = np.arange(windows.shape[0])
        in_input = starts + n <= ni
        in_label = starts >= ni
        regions = (windows[in_input], windows[in_label], windows[~in_input & ~in_label])
        return ExampleGrams(total, n, STATUS_NGRAMS, tuple(np.unique(r) for r in regions))  # type: ignore[arg-type]
    if cfg.short_examples == "whole" and total >= cfg.min_words:
        gram = window_hashes(both, total)
        region = OVERLAP if ni and nl else (INPUT if ni else LABEL)
        hashes = [empty, empty, empty]
        hashes[region] = gram
        anchor = int(window_hashes(both[: cfg.min_words], cfg.min_words)[0])
        return ExampleGrams(total, total, STATUS_WHOLE, tuple(hashes), anchor)  # type: ignore[arg-type]
    return ExampleGrams(total, 0, STATUS_TOO_SHORT, (empty, empty, empty))


def example_grams_batch(records: Sequence[Record], cfg: NGramOverlapConfig) -> list[ExampleGrams]:
    """``example_grams`` of many examples at once: one tokenisation and one window pass for all.

    Inputs and labels are tokenised as one ``TokenBatch`` (input 0, label 0, input 1, ...), so each
    example's words are contiguous; its n-grams are the windows that start and end inside it.
    """
    if not records:
        return []
    texts = [
        t for r in records for t in (common.join_fields(r, cfg.input_fields), common.join_fields(r, cfg.label_fields))
    ]
    tb = TokenBatch(texts, cfg.style)
    start, split, end = tb.doc_starts[0::2], tb.doc_ends[0::2], tb.doc_ends[1::2]
    split = np.maximum(split, start)
    ni, total = split - start, end - start
    prefix = tb.prefix()
    n = cfg.n
    # n-grams of the examples with at least n words: (record, region, hash), made distinct
    hashes = tb.windows(n).hashes
    pos = np.arange(hashes.shape[0], dtype=np.int64)
    rec = np.searchsorted(end, pos, side="right")
    ok = rec < len(records)
    ok[ok] &= pos[ok] + n <= end[rec[ok]]
    pos, rec, hashes = pos[ok], rec[ok], hashes[ok]
    offset = pos - start[rec]
    region = np.where(offset + n <= ni[rec], INPUT, np.where(offset >= ni[rec], LABEL, OVERLAP)).astype(np.int8)
    order = np.lexsort((hashes, region, rec))
    rec, region, hashes = rec[order], region[order], hashes[order]
    keep = np.ones(rec.shape[0], dtype=bool)
    keep[1:] = (rec[1:] != rec[:-1]) | (region[1:] != region[:-1]) | (hashes[1:] != hashes[:-1])
    rec, region, hashes = rec[keep], region[keep], hashes[keep]
    bounds = np.searchsorted(rec * 3 + region, np.arange(3 * len(records) + 1), side="left")
    # whole-example grams of the short ones
    whole = (total < n) & (total >= cfg.min_words) & (total > 0) & (cfg.short_examples == "whole")
    whole_hash = np.zeros(len(records), dtype=np.uint64)
    anchor_hash = np.zeros(len(records), dtype=np.uint64)
    if whole.any():
        whole_hash[whole] = finish(prefix.spans(start[whole], end[whole]), total[whole])
        anchor_hash[whole] = finish(prefix.spans(start[whole], start[whole] + cfg.min_words), cfg.min_words)
    empty = np.zeros(0, dtype=np.uint64)
    out = []
    for i in range(len(records)):
        t, inp = int(total[i]), int(ni[i])
        if t == 0:
            out.append(ExampleGrams(0, 0, STATUS_EMPTY, (empty, empty, empty)))
        elif t >= n:
            parts = tuple(hashes[bounds[3 * i + g] : bounds[3 * i + g + 1]] for g in range(3))
            out.append(ExampleGrams(t, n, STATUS_NGRAMS, parts))  # type: ignore[arg-type]
        elif whole[i]:
            parts_list = [empty, empty, empty]
            parts_list[OVERLAP if inp and t - inp else (INPUT if inp else LABEL)] = whole_hash[i : i + 1]
            out.append(ExampleGrams(t, t, STATUS_WHOLE, tuple(parts_list), int(anchor_hash[i])))  # type: ignore[arg-type]
        else:
            out.append(ExampleGrams(t, 0, STATUS_TOO_SHORT, (empty, empty, empty)))
    return out


@dataclass
class _Table:
    """Grams of one length: sorted distinct hashes, each pointing to its (record, region) entries."""

    keys: np.ndarray  # uint64, sorted, distinct
    starts: np.ndarray  # int64, len(keys) + 1: entries of keys[i] are starts[i]:starts[i+1]
    record: np.ndarray  # int32 record index per entry
    region: np.ndarray  # int8 region code per entry
    items: np.ndarray  # int64 per key: distinct benchmark items (records) holding it (>= 2: a template gram)


def _build_table(hashes: np.ndarray, record: np.ndarray, region: np.ndarray) -> _Table:
    order = np.lexsort((region, record, hashes))
    hashes, record, region = hashes[order], record[order], region[order]
    distinct = np.ones(hashes.shape[0], dtype=bool)
    distinct[1:] = (hashes[1:] != hashes[:-1]) | (record[1:] != record[:-1]) | (region[1:] != region[:-1])
    hashes, record, region = hashes[distinct], record[distinct], region[distinct]
    first = np.ones(hashes.shape[0], dtype=bool)
    first[1:] = hashes[1:] != hashes[:-1]
    keys = hashes[first]
    starts = np.append(np.flatnonzero(first), hashes.shape[0]).astype(np.int64)
    new_record = first.copy()  # entries are sorted by (hash, record): a record's first entry of a key
    new_record[1:] |= record[1:] != record[:-1]
    items = np.add.reduceat(new_record.astype(np.int64), starts[:-1]) if keys.shape[0] else starts[:0]
    return _Table(keys, starts, record.astype(np.int32), region.astype(np.int8), items)


class NGramIndex:
    """The benchmark side: for each gram length, sorted hashes -> (record index, region) entries.

    Compact and picklable (NumPy arrays plus the record ids), so the pipeline ``ray.put``s it once
    and every match actor shares it. A bit-table prefilter over the top hash bits is rebuilt lazily
    in each process (it is not pickled): ``contamray.metrics.hash_lookup``.
    """

    def __init__(
        self,
        n: int,
        style: str,
        record_ids: list[str],
        partitions: list[str],
        tables: dict[int, _Table],
        anchor_len: int = 0,
        anchors: list[tuple[int, int, int]] | None = None,
    ) -> None:
        self.n = n
        self.style = style  # the contamray.metrics.ngrams style of both sides
        self.record_ids = record_ids
        self.partitions = partitions
        self.tables = tables
        # whole-example grams (shorter than n) are found through the hash of their first
        # ``anchor_len`` words: one window pass for all their lengths; (anchor, length, full hash)
        self.anchor_len = anchor_len
        items = sorted(set(anchors or ()))
        self.anchor_length = np.array([length for _, length, _ in items], dtype=np.int64)
        self.anchor_full = np.array([full for _, _, full in items], dtype=np.uint64)
        self.anchor_table = HashTable.build(
            np.array([a for a, _, _ in items], dtype=np.uint64), np.arange(len(items), dtype=np.int64)
        )
        self._finders: dict[int, SortedHashes] = {}  # per process, from the keys (not pickled)
        self._seen_docs: dict[tuple[int, int], set[str]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_finders"] = {}
        state["_seen_docs"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_seen_docs", {})

    def note_document(self, gram: tuple[int, int], doc_id: str, limit: int) -> bool:
        """Record that this process matched ``gram`` in ``doc_id``; False once it is over ``limit``.

        The first ``limit + 1`` distinct documents of a gram are let through (so the rows show it is
        over the limit), later ones are not. The state lives in this process's copy of the index and
        is never pickled: build a fresh index for each scan of a corpus.
        """
        seen = self._seen_docs.setdefault(gram, set())
        if doc_id in seen:
            return True
        if len(seen) > limit:
            return False
        seen.add(doc_id)
        return True

    @property
    def n_grams(self) -> int:
        return int(sum(t.keys.shape[0] for t in self.tables.values()))

    def lookup(self, length: int, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions in ``hashes`` found in the table of ``length`` and the matching key indices."""
        if length not in self._finders:
            self._finders[length] = SortedHashes(self.tables[length].keys)
        return self._finders[length].find(hashes)

    def warm(self) -> NGramIndex:
        """Build this process's lookup tables now rather than on the first corpus batch."""
        for length in self.tables:
            self.lookup(length, np.zeros(0, dtype=np.uint64))
        self.anchor_table.warm()
        return self


def build_index(records: Sequence[Record], cfg: NGramOverlapConfig) -> NGramIndex:
    """Index every example's grams; examples not checked (too short, empty) add nothing."""
    per_length: dict[int, tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]] = {}
    anchors: list[tuple[int, int, int]] = []
    for i, grams in enumerate(example_grams_batch(records, cfg)):
        if grams.gram_len == 0:
            continue
        if grams.status == STATUS_WHOLE:
            anchors.append((grams.anchor, grams.gram_len, int(max(grams.hashes, key=len)[0])))
        hs, rs, gs = per_length.setdefault(grams.gram_len, ([], [], []))
        for region, h in enumerate(grams.hashes):
            if h.shape[0]:
                hs.append(h)
                rs.append(np.full(h.shape[0], i, dtype=np.int32))
                gs.append(np.full(h.shape[0], region, dtype=np.int8))
    tables = {
        length: _build_table(np.concatenate(hs), np.concatenate(rs), np.concatenate(gs))
        for length, (hs, rs, gs) in sorted(per_length.items())
    }
    return NGramIndex(
        cfg.n,
        cfg.style,
        [r.id for r in records],
        [r.partition for r in records],
        tables,
        anchor_len=cfg.min_words,
        anchors=anchors,
    ).warm()


# --------------------------------------------------------------------------- the corpus side


class _DocCache(threading.local):
    """Memo of the last batch's tokenisation, one ``TokenBatch`` per normalisation (per thread).

    The pipeline calls ``match`` once per benchmark index on the *same* list of documents; keeping
    that list's word hashes (and window hashes per length) avoids re-tokenising it for every index.
    The cache holds a reference to the list, so identity cannot be confused with a later batch; the
    results never depend on it.
    """

    def __init__(self) -> None:
        self.docs: Any = None
        self.styles: dict[str, TokenBatch] = {}


_CACHE = _DocCache()


def token_batch(docs: list[dict[str, Any]], style: str, method: str = NAME) -> TokenBatch:
    """The batch's ``TokenBatch`` for ``style`` (built once per batch and normalisation)."""
    cache = _CACHE
    if cache.docs is not docs:
        cache.docs, cache.styles = docs, {}
    if style not in cache.styles:
        cache.styles[style] = TokenBatch(common.doc_texts(docs, method), style)
    return cache.styles[style]


def tokenise_docs(docs: list[dict[str, Any]], style: str, method: str = NAME) -> tuple[list, list]:
    """Normalised words and word hashes per document of a batch (memoised for the batch).

    Shared by every word-level matcher (n-gram overlap, exact match, METEOR's prefilter, Llama-2 word
    tokens), so a batch is tokenised once per normalisation however many indexes scan it.
    """
    batch = token_batch(docs, style, method)
    return batch.words, batch.hashes


def windows_of(length: int, hashes: list[np.ndarray]) -> Windows:
    """The ``length``-word windows of ``hashes`` (from the batch's shared prefix when they are a
    ``tokenise_docs`` result)."""
    for batch in _CACHE.styles.values():
        if batch.hashes is hashes:
            return batch.windows(length)
    return hash_windows(hashes, length)


def match(docs: list[dict[str, Any]], index: NGramIndex, cfg: NGramOverlapConfig) -> list[dict[str, Any]]:
    """Match rows for a batch of corpus documents: one per distinct (record, doc, gram, region).

    Columns: ``record_id``, ``partition``, ``doc_id``, ``region`` (input / label / overlap),
    ``ngram_hash`` (the 64-bit n-gram hash as signed int64), ``ngram_len`` (words), ``doc_offset`` (word
    offset of its first occurrence in the document, normalised words), ``occurrences`` (in that
    document), ``ngram_items`` (how many benchmark items of the index hold the gram: 2 or more makes it
    a template gram, see ``template_min_items``) and ``ngram`` (the matched words, normalised, as evidence).

    With ``max_doc_frequency`` set, rows of an n-gram stop once this process has emitted it for more
    than that many distinct documents (``NGramIndex.note_document``): enough to prove to ``score``
    that it is to be ignored, without a row for every document of a common phrase.
    """
    common.check_index(NAME, index, cfg, ("n", "style"))
    if not docs or not index.tables:
        return []
    batch = token_batch(docs, cfg.style)
    bounds = piece_bounds(docs)
    rows: list[dict[str, Any]] = []
    for length, windows, hit, key in gram_hits(batch, index):
        table = index.tables[length]
        rows.extend(_rows(docs, batch, index, length, table, windows, hit, key, cfg.max_doc_frequency, bounds))
    return rows


def word_count(text: str, style: str) -> int:
    """Normalised words of ``text`` (``contamray.metrics.ngrams``), as ``match`` counts them."""
    return len(normalized_bytes(text, style).split())


def window(cfg: NGramOverlapConfig, index: NGramIndex) -> Window:
    """What ``match`` looks at, for matching a long document in pieces (``contamray.corpus.pieces``):
    grams of at most ``n`` normalised words (whole-example grams are shorter), so a piece needs the
    ``n - 1`` words after what it owns; the first occurrence per document is what ``fold`` keeps."""
    return Window(f"words:{cfg.style}", partial(word_count, style=cfg.style), after=max(index.n - 1, 0))


def gram_hits(batch: TokenBatch, index: NGramIndex) -> list[tuple[int, Windows, np.ndarray, np.ndarray]]:
    """(gram length, windows, positions, key indices) of every gram found in the batch.

    The n-grams through one window pass; whole-example grams (shorter examples) through their
    anchors, one more pass for all their lengths, each candidate checked by its full hash.
    """
    out = []
    if index.n in index.tables:
        windows = batch.windows(index.n)
        hit, key = index.lookup(index.n, windows.hashes)
        inside = windows.valid[hit]
        out.append((index.n, windows, hit[inside], key[inside]))
    if len(index.anchor_table):
        windows = batch.windows(index.anchor_len)
        pos, entry = index.anchor_table.lookup(windows.hashes)
        keep = windows.valid[pos]
        pos, entry = pos[keep], entry[keep]
        doc, offset = windows.locate(pos)
        length = index.anchor_length[entry]
        keep = offset + length <= windows.ends[doc] - windows.starts[doc]
        pos, entry, length = pos[keep], entry[keep], length[keep]
        full = finish(batch.prefix().spans(pos, pos + length), length)
        keep = full == index.anchor_full[entry]
        pos, length, full = pos[keep], length[keep], full[keep]
        for value in np.unique(length).tolist():
            sel = length == value
            keys = index.tables[value].keys
            out.append((value, windows, pos[sel], np.searchsorted(keys, full[sel])))
    return out


def _rows(
    docs: list[dict[str, Any]],
    batch: TokenBatch,
    index: NGramIndex,
    length: int,
    table: _Table,
    windows: Windows,
    hit: np.ndarray,
    key: np.ndarray,
    limit: int | None,
    bounds: Bounds,
) -> list[dict[str, Any]]:
    """Match rows of the hits of one gram length: one per distinct (record, doc, gram, region).

    A piece of a long document (``contamray.corpus.pieces``) reports the grams that start in the words
    it owns, at their offsets in the whole document.

    Everything up to the row dicts is array work; the rows are then built from column lists in one
    comprehension (a planted corpus gives thousands of rows per batch: a Python loop with a call per
    row cost a third of the scan).
    """
    doc, offset = windows.locate(hit)
    owned = bounds.owned(doc, offset)
    if not owned.all():
        hit, key, doc, offset = hit[owned], key[owned], doc[owned], offset[owned]
    if hit.shape[0] == 0:
        return []
    offset = offset + bounds.base[doc]
    # expand every hit to the (record, region) entries of its key
    counts = table.starts[key + 1] - table.starts[key]
    owner = np.repeat(np.arange(hit.shape[0]), counts)
    within = np.arange(owner.shape[0]) - np.repeat(np.cumsum(counts) - counts, counts)
    entry = table.starts[key][owner] + within
    e_doc, e_off, e_key, e_pos = doc[owner], offset[owner], key[owner], hit[owner]
    e_rec, e_reg = table.record[entry], table.region[entry]
    order = np.lexsort((e_off, e_reg, e_key, e_rec, e_doc))
    e_doc, e_off, e_key, e_pos, e_rec, e_reg = (a[order] for a in (e_doc, e_off, e_key, e_pos, e_rec, e_reg))
    first = np.ones(order.shape[0], dtype=bool)
    first[1:] = (
        (e_doc[1:] != e_doc[:-1]) | (e_rec[1:] != e_rec[:-1]) | (e_key[1:] != e_key[:-1]) | (e_reg[1:] != e_reg[:-1])
    )
    idx = np.flatnonzero(first)
    occurrences = np.diff(np.append(idx, order.shape[0])).tolist()
    signed = as_signed(table.keys[e_key[idx]]).tolist()
    items = table.items[e_key[idx]].tolist()
    doc_ids = [str(d.get("doc_id", "")) for d in docs]
    row_doc = [doc_ids[d] for d in e_doc[idx].tolist()]
    # the evidence: the matched words as they lie in the batch's normalised bytes (first occurrence)
    lo = batch.starts[e_pos[idx]].tolist()
    hi = batch.ends[e_pos[idx] + length - 1].tolist()
    buf = batch.buf
    ngram = [buf[a:b].decode("utf-8", "replace") for a, b in zip(lo, hi, strict=True)]
    ids, parts = index.record_ids, index.partitions
    rows = [
        {
            "record_id": ids[r],
            "partition": parts[r],
            "doc_id": d,
            "region": REGIONS[g],
            "ngram_hash": h,
            "ngram_len": length,
            "doc_offset": o,
            "occurrences": c,
            "ngram_items": k,
            "ngram": " ".join(text.split()) if "  " in text else text,
        }
        for r, g, d, h, o, c, k, text in zip(
            e_rec[idx].tolist(),
            e_reg[idx].tolist(),
            row_doc,
            signed,
            e_off[idx].tolist(),
            occurrences,
            items,
            ngram,
            strict=True,
        )
    ]
    if limit is not None:
        # this process stops emitting an n-gram once it has seen it in more than `limit` documents
        rows = [row for row in rows if index.note_document((length, row["ngram_hash"]), row["doc_id"], limit)]
    return rows


# --------------------------------------------------------------------------- folding (issue #16)

FOLD_MARK = "gram_hash"  # a column of every folded row and of no match row
REGION_BITS = {name: 1 << i for i, name in enumerate(REGIONS)}
MATCH_COLUMNS = ("record_id", "doc_id", "region", "ngram_hash", "ngram_len", "doc_offset", "ngram")


def fold(rows: Any, cfg: NGramOverlapConfig) -> list[dict[str, Any]]:
    """Match rows (or earlier folds' rows, or both) folded into one row per example (``FOLD_CONTRACT``).

    A folded row keeps, per matched gram (``gram_len``, ``gram_hash``, sorted): ``gram_regions`` (bits
    1 input, 2 label, 4 overlap) and ``gram_docs`` (distinct documents, capped at ``max_doc_frequency +
    1``: ``score`` only asks "more than the limit?"; 1 without the filter: "found at all" is all GPT-3's
    any-collision and PaLM's fraction ask); evidence texts ``text`` of grams ``text_gram`` (an index into
    the grams); hits ``hit_gram`` / ``hit_doc`` / ``hit_offset`` (where a gram lies in a document, in
    words), both sorted; and ``n_docs``.

    Without ``max_doc_frequency``: the hits of the first ``max_evidence`` documents (``doc_id``
    order), the example's first ``max_evidence`` texts, and ``n_docs`` adds up (a document is matched
    in one batch). With it, a document counts only through grams that stay under the limit, known at
    the end: the hits and texts of grams already over it are dropped (a document left without hits
    with them), the others kept (at most ``max_doc_frequency`` documents per gram, so at most the
    example's grams times that), and ``n_docs`` counts the documents of the hits kept.

    Template grams (``template_min_items``: held by that many benchmark items, ``ngram_items`` of the
    match rows, a property of the index) are folded apart, as a second row of the example with
    ``template=True`` and its own counts and evidence: ``score`` decides on the other grams, the
    example's own, and reads the template row only for an example found through template grams alone.
    So an example has at most two folded rows, in (record id, template) order.

    Match rows are folded as columns (``_fold_matches``: a batch's rows, the cost that matters), then
    merged with the folded rows (``_merge``).
    """
    raw, folded = common.split_fold_input(rows, FOLD_MARK)
    fresh = []
    for template, part in _channels(raw, cfg):
        fresh += [{**row, "template": template} for row in _fold_matches(part, cfg)]
    if not folded:
        return sorted(fresh, key=_row_key)
    return _merge(fresh + folded, cfg)


def _row_key(row: dict[str, Any]) -> tuple[str, bool]:
    return str(row["record_id"]), bool(row["template"])


def is_template(items: int, cfg: NGramOverlapConfig) -> bool:
    """Whether a gram held by ``items`` benchmark items is a template gram under ``cfg``."""
    return cfg.template_min_items is not None and items >= cfg.template_min_items


def _channels(raw: list[dict[str, Any]], cfg: NGramOverlapConfig) -> list[tuple[bool, list[dict[str, Any]]]]:
    """Match rows split into (False, the rows of the examples' own grams), (True, template grams' rows);
    empty parts left out."""
    if not raw:
        return []
    items = common.columns_of(raw, ("record_id", "ngram_items"), NAME)["ngram_items"]
    if cfg.template_min_items is None:
        return [(False, raw)]
    flags = [is_template(int(k), cfg) for k in items]
    parts = [(False, [r for r, t in zip(raw, flags, strict=True) if not t])]
    parts.append((True, [r for r, t in zip(raw, flags, strict=True) if t]))
    return [(template, part) for template, part in parts if part]


def _kept_texts(pairs: Iterable[tuple[Any, str]], frequent: Container[Any], limit: int, per_gram: bool) -> list:
    """The evidence texts kept, ``(gram, text)`` sorted: the example's first ``limit`` texts (``score``
    shows no more), or, ``per_gram`` (when any gram may turn out to be ignored), each gram's first
    ``limit``; none of the ``frequent`` grams."""
    pairs = sorted({(gram, text) for gram, text in pairs if gram not in frequent})
    if per_gram:
        kept, taken = [], {}
        for gram, text in pairs:
            taken[gram] = taken.get(gram, 0) + 1
            if taken[gram] <= limit:
                kept.append((gram, text))
        return kept
    first = set(sorted({text for _, text in pairs})[:limit])
    return [(gram, text) for gram, text in pairs if text in first]


# the match rows of a batch, as columns


def _changes(*columns: np.ndarray) -> np.ndarray:
    """True where a row of sorted ``columns`` differs from the previous one (and for the first row)."""
    new = np.zeros(columns[0].shape[0], dtype=bool)
    new[:1] = True
    for column in columns:
        new[1:] |= column[1:] != column[:-1]
    return new


@dataclass
class _Columns:
    """Match rows as sorted columns (record, gram, text, document, offset order): ids as codes that sort
    like them (``record_ids[rec]``, ...); ``gram`` numbers the distinct (record, gram) pairs."""

    record_ids: list[str]
    doc_ids: list[str]
    texts: list[str]
    partitions: dict[str, Any]
    col: dict[str, np.ndarray]

    @classmethod
    def of(cls, raw: list[dict[str, Any]]) -> _Columns:
        cols = common.columns_of(raw, MATCH_COLUMNS, NAME)
        record_ids, rec = common.value_codes(cols["record_id"])
        doc_ids, doc = common.value_codes(cols["doc_id"])
        texts, text = common.value_codes(cols["ngram"])
        n = len(raw)
        col = {
            "rec": rec,
            "len": np.fromiter(cols["ngram_len"], dtype=np.int64, count=n),
            "hash": np.fromiter(cols["ngram_hash"], dtype=np.int64, count=n),
            "doc": doc,
            "off": np.fromiter(cols["doc_offset"], dtype=np.int64, count=n),
            "bit": np.fromiter(map(REGION_BITS.__getitem__, cols["region"]), dtype=np.int64, count=n),
            "text": text,
        }
        # a (record, gram, document) has one text: that of its first occurrence, in every region
        order = np.lexsort((col["off"], col["doc"], col["text"], col["hash"], col["len"], col["rec"]))
        col = {key: value[order] for key, value in col.items()}
        col["gram"] = np.cumsum(_changes(col["rec"], col["len"], col["hash"])) - 1
        first = np.flatnonzero(_changes(col["rec"]))
        partitions = {record_ids[col["rec"][i]]: raw[order[i]].get("partition") for i in first.tolist()}
        return cls(record_ids, doc_ids, texts, partitions, col)


def _member(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """``np.isin(values, sorted_set)`` for a sorted ``sorted_set``, without ``isin``'s overhead."""
    at = np.minimum(np.searchsorted(sorted_set, values), max(sorted_set.shape[0] - 1, 0))
    return sorted_set[at] == values if sorted_set.shape[0] else np.zeros(values.shape[0], dtype=bool)


def _gram_table(c: _Columns, cfg: NGramOverlapConfig) -> dict[str, np.ndarray]:
    """Per (record, gram): its region bits, its documents (capped, see ``fold``), over the limit or not."""
    col = c.col
    starts = np.flatnonzero(_changes(col["gram"]))
    docs = np.add.reduceat(_changes(col["gram"], col["doc"]).astype(np.int64), starts)
    limit = cfg.max_doc_frequency
    return {
        "rec": col["rec"][starts],
        "len": col["len"][starts],
        "hash": col["hash"][starts],
        "mask": np.bitwise_or.reduceat(col["bit"], starts),
        "docs": np.minimum(docs, 1 if limit is None else limit + 1),
        "frequent": docs > limit if limit is not None else np.zeros(starts.shape[0], dtype=bool),
    }


def _hit_table(c: _Columns, frequent: np.ndarray, cfg: NGramOverlapConfig) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The hits kept, one per (record, gram, document) - its first offset, as a whole document's match
    row has it (the pieces of a long document give one each) - in that order, and documents per record."""
    col = c.col
    keep = _changes(col["gram"], col["doc"]) & ~frequent[col["gram"]]
    hit = {key: col[key][keep] for key in ("rec", "doc", "gram", "off")}
    n_doc = len(c.doc_ids)
    pairs = np.unique(hit["rec"] * n_doc + hit["doc"])  # (record, document), sorted
    n_docs = np.bincount(pairs // n_doc, minlength=len(c.record_ids))
    if cfg.max_doc_frequency is None:  # the first max_evidence documents of each record
        first = pairs[common.rank_in_group(pairs // n_doc) < cfg.max_evidence]
        kept = _member(hit["rec"] * n_doc + hit["doc"], first)
        hit = {key: value[kept] for key, value in hit.items()}
    return hit, n_docs


def _text_table(c: _Columns, grams: dict[str, np.ndarray], cfg: NGramOverlapConfig) -> tuple[np.ndarray, list[str]]:
    """The evidence texts kept (``_kept_texts``), sorted by (record, gram, text): (gram, text)."""
    n_text = len(c.texts)
    starts = np.flatnonzero(_changes(c.col["gram"], c.col["text"]))
    gram, text = c.col["gram"][starts], c.col["text"][starts]  # sorted by gram, then text
    if cfg.max_doc_frequency is not None:  # each gram's first texts, none of a frequent gram
        keep = (common.rank_in_group(gram) < cfg.max_evidence) & ~grams["frequent"][gram]
    else:  # each record's first distinct texts
        rec = grams["rec"][gram]
        firsts = np.unique(rec * n_text + text)
        firsts = firsts[common.rank_in_group(firsts // n_text) < cfg.max_evidence]
        keep = _member(rec * n_text + text, firsts)
    return gram[keep], [c.texts[t] for t in text[keep].tolist()]


def _fold_matches(raw: list[dict[str, Any]], cfg: NGramOverlapConfig) -> list[dict[str, Any]]:
    """``fold`` of match rows only, with column operations; one row per record, in record id order."""
    c = _Columns.of(raw)
    grams = _gram_table(c, cfg)
    hit, n_docs = _hit_table(c, grams["frequent"], cfg)
    text_gram, texts = _text_table(c, grams, cfg)
    n_rec = len(c.record_ids)
    gram_at = np.searchsorted(grams["rec"], np.arange(n_rec + 1))
    hit_at = np.searchsorted(hit["rec"], np.arange(n_rec + 1)).tolist()
    text_at = np.searchsorted(text_gram, gram_at).tolist()
    values = {key: grams[key].tolist() for key in ("len", "hash", "mask", "docs")}
    hit_doc = [c.doc_ids[d] for d in hit["doc"].tolist()]
    hit_gram, hit_off = (hit["gram"] - gram_at[hit["rec"]]).tolist(), hit["off"].tolist()
    text_gram = (text_gram - gram_at[grams["rec"][text_gram]]).tolist()
    gram_at = gram_at.tolist()
    out = []
    for r in np.unique(grams["rec"]).tolist():
        g0, g1, h0, h1, t0, t1 = gram_at[r], gram_at[r + 1], hit_at[r], hit_at[r + 1], text_at[r], text_at[r + 1]
        out.append(
            {
                "record_id": c.record_ids[r],
                "partition": c.partitions[c.record_ids[r]],
                "n_docs": int(n_docs[r]),
                "gram_len": values["len"][g0:g1],
                "gram_hash": values["hash"][g0:g1],
                "gram_regions": values["mask"][g0:g1],
                "gram_docs": values["docs"][g0:g1],
                "text_gram": text_gram[t0:t1],
                "text": texts[t0:t1],
                "hit_gram": hit_gram[h0:h1],
                "hit_doc": hit_doc[h0:h1],
                "hit_offset": hit_off[h0:h1],
            }
        )
    return out


# folded rows, merged per example

Gram = tuple[int, int]  # (length in words, hash as signed int64)


@dataclass
class _Example:
    """One example's folded rows, merged: per gram its region bits and documents; evidence texts,
    hits (doc_id, gram, word offset) and the documents the rows counted."""

    partition: Any
    regions: dict[Gram, int] = field(default_factory=dict)
    docs: dict[Gram, int] = field(default_factory=dict)
    texts: set[tuple[Gram, str]] = field(default_factory=set)
    hits: set[tuple[Gram, str, int]] = field(default_factory=set)
    n_docs: int = 0
    # without max_doc_frequency: only the first max_evidence documents' hits are kept (``row`` keeps no
    # more), so the merge holds O(max_evidence) documents' hits per example however many rows it adds
    doc_cap: int | None = None
    hit_docs: set[str] = field(default_factory=set)
    # with max_doc_frequency: a gram past it is dropped by ``row`` (and document counts only grow), so its hits are
    # not kept as rows come in - an example copied into thousands of documents holds no hit per copy
    limit: int | None = None

    def add(self, row: dict[str, Any]) -> None:
        """Add a folded row: gram documents add up (the rows' documents differ, ``FOLD_CONTRACT``)."""
        grams = [(int(n), int(h)) for n, h in zip(row["gram_len"], row["gram_hash"], strict=True)]
        crossed = set()
        for gram, bits, docs in zip(grams, row["gram_regions"], row["gram_docs"], strict=True):
            self.regions[gram] = self.regions.get(gram, 0) | int(bits)
            before = self.docs.get(gram, 0)
            self.docs[gram] = before + int(docs)
            if self.limit is not None and before <= self.limit < self.docs[gram]:
                crossed.add(gram)
        self.texts.update((grams[int(j)], str(text)) for j, text in zip(row["text_gram"], row["text"], strict=True))
        hits = zip(row["hit_gram"], row["hit_doc"], row["hit_offset"], strict=True)
        if self.limit is not None:
            if crossed:
                self.hits = {hit for hit in self.hits if hit[0] not in crossed}
            limit, counts = self.limit, self.docs
            kept = [(grams[int(j)], doc, offset) for j, doc, offset in hits if counts[grams[int(j)]] <= limit]
            self.hits.update((gram, str(doc), int(offset)) for gram, doc, offset in kept)
        elif self.doc_cap is None:  # neither bound: every hit
            self.hits.update((grams[int(j)], str(doc), int(offset)) for j, doc, offset in hits)
        else:  # the first doc_cap documents of those held and the row's: the others can never be kept
            new = set(map(str, row["hit_doc"]))
            docs = self.hit_docs | new
            keep = set(sorted(docs)[: self.doc_cap]) if len(docs) > self.doc_cap else docs
            if not self.hit_docs <= keep:
                self.hits = {hit for hit in self.hits if hit[1] in keep}
            if not new.isdisjoint(keep):  # a row whose documents are all past the cap adds no hit
                self.hits.update((grams[int(j)], str(doc), int(offset)) for j, doc, offset in hits if str(doc) in keep)
            self.hit_docs = keep
        self.n_docs += int(row["n_docs"])

    def row(self, rid: str, cfg: NGramOverlapConfig) -> dict[str, Any]:
        """The merged folded row, lists in the order ``_fold_matches`` gives them."""
        limit = cfg.max_doc_frequency
        grams = sorted(self.regions)
        docs = [min(self.docs[g], 1 if limit is None else limit + 1) for g in grams]
        frequent = {g for g, count in zip(grams, docs, strict=True) if limit is not None and count > limit}
        texts = _kept_texts(self.texts, frequent, cfg.max_evidence, limit is not None)
        hits = [(doc, gram, offset) for gram, doc, offset in self.hits if gram not in frequent]
        n_docs = self.n_docs if limit is None else len({doc for doc, _, _ in hits})
        if limit is None:  # the first max_evidence documents
            hits = common.first_doc_hits(hits, cfg.max_evidence)
        hits = sorted((gram, doc, offset) for doc, gram, offset in hits)
        position = {g: i for i, g in enumerate(grams)}
        return {
            "record_id": rid,
            "partition": self.partition,
            "n_docs": n_docs,
            "gram_len": [g[0] for g in grams],
            "gram_hash": [g[1] for g in grams],
            "gram_regions": [self.regions[g] for g in grams],
            "gram_docs": docs,
            "text_gram": [position[gram] for gram, _ in texts],
            "text": [text for _, text in texts],
            "hit_gram": [position[h[0]] for h in hits],
            "hit_doc": [h[1] for h in hits],
            "hit_offset": [h[2] for h in hits],
        }


def _merge(folded: list[dict[str, Any]], cfg: NGramOverlapConfig) -> list[dict[str, Any]]:
    """Folded rows merged into one per example and channel (own grams, template grams), in
    (record id, template) order."""
    examples: dict[tuple[str, bool], _Example] = {}
    cap = cfg.max_evidence if cfg.max_doc_frequency is None else None
    for row in folded:
        key = _row_key(row)
        if key not in examples:
            examples[key] = _Example(row.get("partition"), doc_cap=cap, limit=cfg.max_doc_frequency)
        examples[key].add(row)
    return [{**examples[key].row(key[0], cfg), "template": key[1]} for key in sorted(examples)]


# --------------------------------------------------------------------------- scoring and reduction


def _ignored(folded: dict[tuple[str, bool], dict[str, Any]], records: Sequence[Record], limit: int | None) -> set:
    """Grams ``(length, hash)`` in more than ``limit`` documents, counted over ``records``' rows (both
    channels: own and template grams)."""
    if limit is None:
        return set()
    docs: dict[tuple[int, int], int] = {}
    for record in records:
        for row in (folded.get((record.id, False)), folded.get((record.id, True))):
            for gram in zip(row["gram_len"], row["gram_hash"], row["gram_docs"], strict=True) if row else ():
                docs[gram[:2]] = max(docs.get(gram[:2], 0), gram[2])
    return {gram for gram, count in docs.items() if count > limit}


@dataclass
class _Found:
    """What one example's folded row shows once the ignored grams are left out."""

    matched: list[int]  # distinct grams per region
    ignored: list[int]  # distinct grams per region ignored as too frequent
    kept: set[tuple[int, int]]  # the grams (length, hash) matched and not ignored
    texts: list[str]  # sorted distinct evidence texts
    spans: list[tuple[str, int, int]]  # (doc_id, start, end) in words
    n_docs: int


def _found(row: dict[str, Any] | None, ignored: set[tuple[int, int]], filtered: bool) -> _Found:
    if row is None:
        return _Found([0, 0, 0], [0, 0, 0], set(), [], [], 0)
    lens = row["gram_len"]
    grams = [(int(length), int(value)) for length, value in zip(lens, row["gram_hash"], strict=True)]
    keep = [gram not in ignored for gram in grams]
    regions = row["gram_regions"]
    matched = [sum(k and bool(m & bit) for k, m in zip(keep, regions, strict=True)) for bit in (1, 2, 4)]
    dropped = [sum(not k and bool(m & bit) for k, m in zip(keep, regions, strict=True)) for bit in (1, 2, 4)]
    texts = sorted({text for j, text in zip(row["text_gram"], row["text"], strict=True) if keep[j]})
    spans = [
        (doc, offset, offset + lens[j])
        for j, doc, offset in zip(row["hit_gram"], row["hit_doc"], row["hit_offset"], strict=True)
        if keep[j]
    ]
    n_docs = len({doc for doc, _, _ in spans}) if filtered else int(row["n_docs"])
    kept = {gram for gram, k in zip(grams, keep, strict=True) if k}
    return _Found(matched, dropped, kept, texts, spans, n_docs)


def covered_words(record: Record, cfg: NGramOverlapConfig, grams: set[tuple[int, int]]) -> tuple[int, int, int, int]:
    """(input words, label words, input words inside a matched gram, label words inside one).

    ``grams`` are the matched grams ``(length, signed hash)``; a gram covers the words of every
    position of the example where it starts (an example shorter than ``n`` has one gram, all of it).
    """
    wi = word_hashes(common.join_fields(record, cfg.input_fields), cfg.normalization)
    wl = word_hashes(common.join_fields(record, cfg.label_fields), cfg.normalization)
    ni, total = wi.shape[0], wi.shape[0] + wl.shape[0]
    covered = np.zeros(total + 1, dtype=np.int64)
    for length in {length for length, _ in grams}:
        if length > total:
            continue
        starts = np.flatnonzero(
            np.isin(as_signed(window_hashes(np.concatenate([wi, wl]), length)), [h for n, h in grams if n == length])
        )
        np.add.at(covered, starts, 1)
        np.add.at(covered, starts + length, -1)
    inside = np.cumsum(covered[:total]) > 0
    return ni, total - ni, int(inside[:ni].sum()), int(inside[ni:].sum())


def match_type(contaminated: bool, apart: str, words: tuple[int, int, int, int], min_label_share: float) -> str:
    """The contamination type from where the matched words fall (``words``: see ``covered_words``).

    ``label_only``: no input word is matched (only the answer is in the corpus); ``input_and_label``:
    input words are, and at least ``min_label_share`` of the label's words; ``input_only``: input
    words are, fewer of the label's. Not contaminated: ``apart`` when it is set (``"template_only"``:
    only n-grams shared with other benchmark items would have made it contaminated;
    ``"frequent_only"``: only n-grams ignored as too frequent would have, ``max_doc_frequency``), else
    ``clean``.
    """
    if not contaminated:
        return apart or "clean"
    n_input, n_label, input_found, label_found = words
    if not input_found:
        return "label_only"
    return "input_and_label" if n_label and label_found >= min_label_share * n_label else "input_only"


def _decides(grams: ExampleGrams, matched: int, cfg: NGramOverlapConfig, shared: int = 0) -> bool:
    """GPT-3's "any collision" (``min_matches``) and PaLM's ``min_fraction`` rule for ``matched`` grams;
    ``shared`` template grams found are left out of the fraction's denominator (they are no evidence
    either way: an example's fraction is over its own grams and those of its template not found)."""
    if grams.status not in (STATUS_NGRAMS, STATUS_WHOLE) or matched < cfg.min_matches:
        return False
    return cfg.min_fraction is None or matched >= cfg.min_fraction * (sum(grams.counts) - shared)


def decision(grams: ExampleGrams, own: _Found, template: _Found, cfg: NGramOverlapConfig) -> tuple[bool, str]:
    """(contaminated, the type it is set apart as when not: ``""``, ``template_only`` or ``frequent_only``).

    Contaminated on the example's own grams (``own``: not template, not ignored as too frequent); else
    ``template_only`` when its template grams found (``template``) would have made it contaminated, else
    ``frequent_only`` when the grams ignored as too frequent (of either kind) would have.
    """
    mine, shared = sum(own.matched), sum(template.matched)
    if _decides(grams, mine, cfg, shared):
        return True, ""
    if shared and _decides(grams, mine + shared, cfg):
        return False, "template_only"
    if _decides(grams, mine + shared + sum(own.ignored) + sum(template.ignored), cfg):
        return False, "frequent_only"
    return False, ""


def score(records: Sequence[Record], matches: Any, cfg: NGramOverlapConfig) -> list[dict[str, Any]]:
    """One row per example (matched or not); see the columns below and the module docstring.

    ``matches`` are match rows, folded rows (``fold``, which ``score`` applies first) or both.
    ``n_ngrams`` and ``n_*_ngrams`` count the example's distinct grams per region; ``matched_*``
    how many of them were found in at least one corpus document; ``fraction_matched`` is
    ``matched_total / n_ngrams`` (None when the example was not checked); ``matched_ignored`` the
    grams found but ignored as too frequent; ``matched_template`` the template grams found (held by
    ``template_min_items`` benchmark items or more: not in ``matched_*``, see ``decision``);
    ``matched_input_words`` / ``matched_label_words`` how
    many of a contaminated example's input and label words lie in matched grams (they set
    ``contamination_type``: ``match_type``); ``n_docs`` counts the matched documents,
    ``doc_ids`` and ``evidence`` keep up to ``max_evidence`` matched document ids and n-grams
    (sorted); ``spans`` the word ranges the counted n-grams cover in the first ``max_evidence``
    documents (``{"doc_id", "start", "end", "unit"}``, at most ``max_evidence``). With
    ``max_doc_frequency``, an n-gram in more than that many distinct documents is ignored (not
    matched, no evidence, its documents not counted unless another n-gram matched them). The evidence
    (``n_docs``, ``doc_ids``, ``evidence``, ``spans``) is that of the example's own grams, or of its
    template grams for a ``template_only`` example.
    """
    folded = {_row_key(row): row for row in fold(matches, cfg)}
    ignored = _ignored(folded, records, cfg.max_doc_frequency)
    filtered = cfg.max_doc_frequency is not None
    rows = []
    for record, grams in zip(records, example_grams_batch(records, cfg), strict=True):
        own = _found(folded.get((record.id, False)), ignored, filtered)
        template = _found(folded.get((record.id, True)), ignored, filtered)
        contaminated, apart = decision(grams, own, template, cfg)
        found = template if apart == "template_only" else own  # the evidence shown
        counts, matched = grams.counts, own.matched
        total = sum(counts)
        matched_total = sum(matched)
        words = covered_words(record, cfg, own.kept) if contaminated else (0, 0, 0, 0)
        error = ""
        if grams.status == STATUS_EMPTY:
            fields = ", ".join(cfg.input_fields + cfg.label_fields)
            error = (
                f"example {record.id!r} of {record.partition!r} has no words in fields {fields} after "
                "normalisation; check the benchmark adapter or choose other input_fields/label_fields"
            )
        columns = {
            "status": grams.status,
            "n_words": grams.n_words,
            "ngram_len": grams.gram_len,
            "n_ngrams": total,
            "n_input_ngrams": counts[INPUT],
            "n_label_ngrams": counts[LABEL],
            "n_overlap_ngrams": counts[OVERLAP],
            "matched_input": matched[INPUT],
            "matched_label": matched[LABEL],
            "matched_overlap": matched[OVERLAP],
            "matched_total": matched_total,
            "matched_template": sum(template.matched),
            "matched_ignored": sum(own.ignored) + sum(template.ignored),
            "fraction_matched": matched_total / total if total else None,
            "matched_input_words": words[2],
            "matched_label_words": words[3],
        }
        row = common.example_row(
            record,
            columns,
            contaminated=contaminated,
            label_found=bool(matched[LABEL] or matched[OVERLAP]),
            docs=(doc for doc, _, _ in found.spans),
            evidence={"evidence": found.texts[: cfg.max_evidence]},
            spans=found.spans,
            unit="word",
            max_evidence=cfg.max_evidence,
            error=error,
        )
        row["contamination_type"] = match_type(contaminated, apart, words, cfg.min_label_share)
        row["n_docs"] = found.n_docs
        rows.append(row)
    return rows


def _type_counts(ok: list[dict[str, Any]]) -> dict[str, Any]:
    """The types ``open_verdict`` does not count: label-only examples (contaminated) and those set apart,
    neither contaminated nor clean: found only through n-grams too frequent to count, or only through
    template n-grams shared with other benchmark items."""
    out: dict[str, Any] = {}
    for kind in ("label_only", "frequent_only", "template_only"):
        n = sum(r.get("contamination_type") == kind for r in ok)
        out[f"n_{kind}"] = n
        out[f"{kind}_rate"] = common.fraction(n, len(ok))
    out["n_clean"] = sum(r.get("contamination_type") == "clean" for r in ok)
    return out


def _pct(part: int, whole: int) -> float:
    return 100.0 * common.fraction(part, whole)


def reduce(table: Any, cfg: NGramOverlapConfig) -> Verdict:
    """Partition verdict: the fraction of contaminated examples and the decision.

    ``rate`` and ``statistic`` are the fraction (0-1, like every method's ``rate``) of contaminated
    examples among those that did not fail (too-short examples stay in the denominator as clean, as
    in GPT-3's Table C.1).
    ``contaminated`` is ``rate > partition_threshold``. The default threshold 0 calls a partition
    contaminated as soon as one example is dirty: GPT-3's own per-example rule ("any collision")
    lifted to the partition, answering "is any of this partition in the corpus?". Random 13-word
    collisions are negligible, but the rule is deliberately sensitive: as GPT-3 App. C notes,
    benchmarks whose inputs come from the web (SQuAD, DROP) collide on the input alone, so
    ``details`` separates the input-only, input-and-label and label-only rates (read the latter two to
    see whether answers leaked), counts the examples clean only because their n-grams were too
    frequent (``n_frequent_only``, not in ``n_clean``) and those found only through template n-grams
    (``n_template_only``, neither), and gives GPT-2's statistic, the percentage of the partition's
    n-grams found in the corpus (template n-grams included: they were found). ``p_value`` is None: this
    is a measurement, not a test.
    """
    rows = common.table_rows(table)
    ok = [r for r in rows if not r.get("error")]
    ngrams_total = sum(int(r.get("n_ngrams") or 0) for r in ok)
    ngrams_matched = sum(int(r.get("matched_total") or 0) + int(r.get("matched_template") or 0) for r in ok)
    return common.open_verdict(
        NAME,
        rows,
        cfg.partition_threshold,
        details={
            **_type_counts(ok),
            "n_too_short": sum(r.get("status") == STATUS_TOO_SHORT for r in ok),
            "n_whole_example": sum(r.get("status") == STATUS_WHOLE for r in ok),
            "n_ngrams": ngrams_total,
            "n_ngrams_matched": ngrams_matched,
            "ngram_overlap_pct": _pct(ngrams_matched, ngrams_total),
        },
        params={
            "n": cfg.n,
            "min_matches": cfg.min_matches,
            "min_fraction": cfg.min_fraction,
            "max_doc_frequency": cfg.max_doc_frequency,
            "template_min_items": cfg.template_min_items,
            "min_label_share": cfg.min_label_share,
            "normalization": cfg.normalization,
            "fold_diacritics": cfg.fold_diacritics,
        },
    )


@register
class NGramOverlap(common.OpenMethod):
    """Registered as ``ngram_overlap`` (family ``open``); the steps are the module functions."""

    name = NAME
    outputs = Outputs(
        score="fraction_matched",
        score_label="fraction of n-grams matched",
        membership="fraction_matched",
        missing_as=0.0,
    )
    Config = NGramOverlapConfig
    steps = common.Steps(build_index, match, score, reduce, fold, window)


__all__ = [
    "CONTAMINATION_TYPES",
    "REGIONS",
    "ExampleGrams",
    "NGramIndex",
    "NGramOverlap",
    "NGramOverlapConfig",
    "build_index",
    "example_grams",
    "example_grams_batch",
    "fold",
    "gram_hits",
    "match",
    "reduce",
    "score",
    "token_batch",
    "tokenise_docs",
    "windows_of",
]
