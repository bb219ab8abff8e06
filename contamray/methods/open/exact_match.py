"""Normalised exact match of whole benchmark inputs in corpus documents (Dodge et al. 2021).

Paper: Dodge et al. 2021, "Documenting Large Webtext Corpora: A Case Study on the Colossal Clean
Crawled Corpus" (EMNLP), Sec. 4.2 "Benchmark data contamination": a benchmark example is found in C4
when its text occurs *exactly* in a document after normalising capitalisation and punctuation; the
tables report the share of a test set whose inputs occur, and whose inputs occur with their labels.
Here: the whole input (every word of ``input_fields``, normalised: lowercased, punctuation removed,
whitespace collapsed — ``normalization="gpt3"`` of ``contamray.metrics.ngrams``) must appear as one
contiguous run of words of a document (``input_only``); when the label's words follow in the same
document within ``label_window`` words of the input's end, the example is ``input_and_label``.

Known deviation of ntunlp/LLMSanitize (``open_data_methods/exact.py``), where we follow the paper: its
cleaning keeps ``isalpha`` characters only, so numbers vanish ("Janet has 16 ducks" equals "Janet
has ducks"); it also compares raw strings, so a match may start or end inside a word.

Scale: each input is indexed by its first ``anchor`` words (an 8-word window hash, like the
n-gram matchers), the corpus is hashed once per batch for that length, and only anchor hits are
compared word by word with the whole input, so the cost does not grow with the number of distinct
input lengths. Inputs shorter than ``anchor`` words are anchored on all their words.

Template n-grams (issue #16, ``ngram_overlap``'s ``template_min_items``) do not apply: an example is
found only when its *whole* input occurs, so a match is never made of a template it shares with other
items (two items with identical inputs are both found, as in Dodge et al.).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from contamray.corpus.pieces import Window, piece_bounds
from contamray.methods.base import Outputs, Verdict, register
from contamray.methods.open import common
from contamray.methods.open.ngram_overlap import tokenise_docs, windows_of, word_count
from contamray.metrics import ngrams as ng
from contamray.records import Record

NAME = "exact_match"


@dataclass(frozen=True)
class ExactMatchConfig:
    """Parameters of ``exact_match``.

    Worked example: input ``"Which gas do plants absorb?"`` and label ``"Carbon dioxide"`` normalise
    to ``which gas do plants absorb`` / ``carbon dioxide``. A document ``"... Which gas do plants
    absorb? (A) oxygen (B) carbon dioxide ..."`` contains the input (found) and the label 3 words
    after it (within ``label_window``): ``input_and_label``.

    - ``input_fields`` / ``label_fields``: Record fields forming the input and the label.
    - ``normalization``: ``gpt3`` (punctuation deleted) or ``gpt2`` (punctuation splits words); any
      language, as in ``contamray.metrics.ngrams`` (NFKC, a word per character of Chinese, ...).
    - ``fold_diacritics``: also delete non-spacing marks (``café`` = ``cafe``); off by default.
    - ``min_words``: inputs with fewer words are not checked (a 1-word input is found everywhere);
      they count as clean with ``status="too_short"``.
    - ``label_window``: how many words after the input the label may start (multiple-choice pages
      list the options between question and answer).
    - ``anchor``: words of the input used for the hash lookup before the full comparison.
    """

    input_fields: tuple[str, ...] = ("input",)
    label_fields: tuple[str, ...] = ("label",)
    normalization: str = "gpt3"
    fold_diacritics: bool = False
    min_words: int = 3
    label_window: int = 64
    anchor: int = 8
    partition_threshold: float = 0.0
    max_evidence: int = 5

    def __post_init__(self) -> None:
        common.check_config(
            NAME,
            self,
            [
                (
                    "normalization",
                    self.normalization in ng.NORMALIZATIONS,
                    f"one of {', '.join(ng.NORMALIZATIONS)}",
                ),
                ("fold_diacritics", isinstance(self.fold_diacritics, bool), "true or false"),
                common.integer(self, "min_words", 1),
                common.integer(self, "label_window", 0),
                common.integer(self, "anchor", 1, "(8)"),
            ],
            required_fields=("input_fields",),
            optional_fields=("label_fields",),
        )

    @property
    def style(self) -> str:
        """The ``contamray.metrics.ngrams`` style of ``normalization`` and ``fold_diacritics``."""
        return ng.style_name(self.normalization, self.fold_diacritics)


def example_words(record: Record, cfg: ExactMatchConfig) -> tuple[np.ndarray, np.ndarray]:
    """Word hashes of the normalised input and label."""
    return (
        ng.word_hashes(common.join_fields(record, cfg.input_fields), cfg.style),
        ng.word_hashes(common.join_fields(record, cfg.label_fields), cfg.style),
    )


class ExactIndex:
    """Input and label word hashes per record; inputs keyed by the hash of their first words."""

    def __init__(self, cfg: ExactMatchConfig, records: list[Record]) -> None:
        self.style = cfg.style
        self.record_ids = [r.id for r in records]
        self.partitions = [r.partition for r in records]
        self.inputs: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []
        by_anchor: dict[int, tuple[list[int], list[int]]] = {}
        for i, record in enumerate(records):
            inp, lab = example_words(record, cfg)
            self.inputs.append(inp)
            self.labels.append(lab)
            if inp.shape[0] < cfg.min_words:
                continue
            a = min(cfg.anchor, inp.shape[0])
            hashes, entries = by_anchor.setdefault(a, ([], []))
            hashes.append(int(ng.window_hashes(inp[:a], a)[0]))
            entries.append(i)
        self.tables = {
            a: common.HashTable.build(np.array(h, dtype=np.uint64), np.array(e, dtype=np.int64))
            for a, (h, e) in sorted(by_anchor.items())
        }


def match(docs: list[dict[str, Any]], index: ExactIndex, cfg: ExactMatchConfig) -> list[dict[str, Any]]:
    """One row per (record, document) where the whole input occurs: first word offset, occurrences,
    and whether (and where) the label follows."""
    common.check_index(NAME, index, cfg, ("style",))
    if not docs or not index.tables:
        return []
    words, hashes = tokenise_docs(docs, cfg.style, NAME)
    bounds = piece_bounds(docs)
    found: dict[tuple[int, int], list[int]] = {}
    for a, table in index.tables.items():
        windows = windows_of(a, hashes)
        positions, entries = table.lookup(windows.hashes)
        keep = windows.valid[positions]
        positions, entries = positions[keep], entries[keep]
        if positions.shape[0] == 0:
            continue
        doc, offset = windows.locate(positions)
        owned = bounds.owned(doc, offset)  # a piece of a long document: inputs starting in its own words
        doc, offset, entries = doc[owned], offset[owned], entries[owned]
        for d, o, r in zip(doc.tolist(), offset.tolist(), entries.tolist(), strict=True):
            inp = index.inputs[r]
            if not np.array_equal(hashes[d][o : o + inp.shape[0]], inp):
                continue
            slot = found.setdefault((r, d), [o, 0, -1])
            slot[1] += 1
            if slot[2] < 0 and index.labels[r].shape[0]:
                end = o + inp.shape[0]
                slot[2] = common.contains(hashes[d], index.labels[r], end, end + cfg.label_window)
                if slot[2] >= 0:
                    slot[0] = o  # report the occurrence the label follows
    rows = []
    for (r, d), (offset, occurrences, label_at) in sorted(found.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        n = index.inputs[r].shape[0]
        base = int(bounds.base[d])  # word offsets in the whole document
        rows.append(
            {
                "record_id": index.record_ids[r],
                "partition": index.partitions[r],
                "doc_id": str(docs[d].get("doc_id", "")),
                "start": base + offset,
                "end": base + offset + n,
                "occurrences": occurrences,
                "label_found": label_at >= 0,
                "label_start": base + label_at if label_at >= 0 else -1,
                "label_end": base + label_at + index.labels[r].shape[0] if label_at >= 0 else -1,
                "text": b" ".join(words[d][offset : offset + min(n, 40)]).decode("utf-8", "replace"),
            }
        )
    return rows


FOLD_MARK = "hit_doc"  # a column of every folded row and of no match row
MATCH_COLUMNS = ("record_id", "doc_id", "start", "end", "label_found", "label_start", "label_end")


def fold(rows: Any, cfg: ExactMatchConfig) -> list[dict[str, Any]]:
    """Match rows (or earlier folds' rows, or both) folded into one row per example (``FOLD_CONTRACT``).

    A folded row keeps ``n_docs`` (documents holding the input: they add up, a document is matched in
    one batch), ``label_found`` (any of them has the label after it) and the hits of the first
    ``max_evidence`` documents in ``doc_id`` order: ``hit_doc``, ``hit_start`` / ``hit_end`` (the
    input's words) and ``hit_label_start`` / ``hit_label_end`` (the label's, -1 when not found).
    """
    raw, folded = common.split_fold_input(rows, FOLD_MARK)
    examples: dict[str, dict[str, Any]] = {}

    def example(row: dict[str, Any]) -> dict[str, Any]:
        new = {"partition": row.get("partition"), "n_docs": 0, "label_found": False, "hits": set()}
        return examples.setdefault(str(row["record_id"]), new)

    cols = common.columns_of(raw, MATCH_COLUMNS, NAME)
    first: dict[tuple[str, str], tuple[bool, tuple[str, int, int, int, int]]] = {}
    for row, rid, doc, start, end, found, label_start, label_end in zip(raw, *cols.values(), strict=True):
        found = bool(found)
        hit = (str(doc), int(start), int(end), int(label_start) if found else -1, int(label_end) if found else -1)
        ex = example(row)
        ex["label_found"] |= found
        # one hit per document, as a whole document's row has it: the first occurrence the label
        # follows, else the first (the pieces of a long document give one each)
        key = (str(rid), str(doc))
        if key not in first or (not found, hit[1]) < (not first[key][0], first[key][1][1]):
            first[key] = (found, hit)
    for (rid, _), (_, hit) in first.items():
        examples[rid]["hits"].add(hit)
    for ex in examples.values():  # match rows: one per (record, document)
        ex["n_docs"] = len({hit[0] for hit in ex["hits"]})
    for row in folded:
        ex = example(row)
        columns = ("hit_doc", "hit_start", "hit_end", "hit_label_start", "hit_label_end")
        ex["hits"].update(
            (str(d), int(s), int(e), int(ls), int(le))
            for d, s, e, ls, le in zip(*(row[c] for c in columns), strict=True)
        )
        ex["n_docs"] += int(row["n_docs"])
        ex["label_found"] |= bool(row["label_found"])
    return [_folded_row(rid, examples[rid], cfg.max_evidence) for rid in sorted(examples)]


def _folded_row(rid: str, example: dict[str, Any], max_evidence: int) -> dict[str, Any]:
    hits = common.first_doc_hits(example["hits"], max_evidence)
    return {
        "record_id": rid,
        "partition": example["partition"],
        "n_docs": example["n_docs"],
        "label_found": example["label_found"],
        **{
            column: [hit[i] for hit in hits]
            for i, column in enumerate(("hit_doc", "hit_start", "hit_end", "hit_label_start", "hit_label_end"))
        },
    }


def score(records: list[Record], matches: Any, cfg: ExactMatchConfig) -> list[dict[str, Any]]:
    """One row per example: found or not, input-only or with its label, documents and word spans.

    ``matches`` are match rows, folded rows (``fold``, applied first) or both; ``spans`` are those of
    the first ``max_evidence`` documents (``doc_id`` order), at most ``max_evidence`` of them.
    """
    folded = {row["record_id"]: row for row in fold(matches, cfg)}
    out = []
    for record in records:
        inp, lab = example_words(record, cfg)
        found = folded.get(record.id)
        hits = (
            list(
                zip(
                    *(found[c] for c in ("hit_doc", "hit_start", "hit_end", "hit_label_start", "hit_label_end")),
                    strict=True,
                )
            )
            if found
            else []
        )
        checked = inp.shape[0] >= cfg.min_words
        spans = [(doc, start, end) for doc, start, end, _, _ in hits]
        spans += [(doc, start, end) for doc, _, _, start, end in hits if start >= 0]
        error = ""
        if inp.shape[0] == 0:
            error = (
                f"example {record.id!r} of {record.partition!r} has no words in "
                f"{', '.join(cfg.input_fields)} "
                "after normalisation; check the benchmark adapter or input_fields"
            )
        columns = {
            "status": "checked" if checked else "too_short",
            "n_input_words": int(inp.shape[0]),
            "n_label_words": int(lab.shape[0]),
        }
        row = common.example_row(
            record,
            columns,
            contaminated=checked and bool(found and found["n_docs"]),
            label_found=bool(found and found["label_found"]),
            docs=(hit[0] for hit in hits),
            spans=spans,
            unit="word",
            max_evidence=cfg.max_evidence,
            error=error,
        )
        row["n_docs"] = int(found["n_docs"]) if found else 0
        out.append(row)
    return out


def reduce(table: Any, cfg: ExactMatchConfig) -> Verdict:
    rows = common.table_rows(table)
    too_short = sum(r.get("status") == "too_short" and not r.get("error") for r in rows)
    return common.open_verdict(
        NAME,
        rows,
        cfg.partition_threshold,
        {"normalization": cfg.normalization, "fold_diacritics": cfg.fold_diacritics, "n_too_short": too_short},
    )


def build_index(records: list[Record], cfg: ExactMatchConfig) -> ExactIndex:
    return ExactIndex(cfg, records)


def window(cfg: ExactMatchConfig, index: ExactIndex) -> Window:
    """What ``match`` looks at, for matching a long document in pieces (``contamray.corpus.pieces``): an
    input, then its label within ``label_window`` words: a piece needs that many words, less one, after
    the words it owns (for the longest input and label of the index)."""
    longest = max(
        (inp.shape[0] + cfg.label_window + lab.shape[0] for inp, lab in zip(index.inputs, index.labels, strict=True)),
        default=1,
    )
    return Window(f"words:{cfg.style}", partial(word_count, style=cfg.style), after=max(int(longest) - 1, 0))


@register
class ExactMatch(common.OpenMethod):
    """Registered as ``exact_match`` (family ``open``)."""

    name = NAME
    outputs = Outputs(
        score="n_docs",
        score_label="corpus documents holding the normalised example",
        membership="contaminated",
    )
    Config = ExactMatchConfig
    steps = common.Steps(build_index, match, score, reduce, fold, window)
