"""Llama 2's token-level contamination: the share of an example's tokens in long matched spans.

Paper: Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models", Appendix A.6
("Dataset Contamination"): "we consider a token to be contaminated if it appears in any token n-gram
longer than 10 tokens in both the evaluation sample and the training set, and define the
contamination percentage of a sample to be the percentage of tokens contaminated". Matched spans may
differ in a few positions: "a 'skipgram budget' of four tokens, so that matched spans between an
evaluation sample and the training data can differ in at most four positions (we do not allow
trailing mismatches, or mismatches in the first 10 tokens)" — found as "10(+)-skipgrams" with suffix
arrays. Samples fall in four non-exclusive buckets: *Clean* (< 20 % of tokens contaminated), *Not
clean* (>= 20 %), *Not dirty* (< 80 %), *Dirty* (>= 80 %). Parameters: ``min_span=10``,
``skip_budget=4``, ``clean_below=0.2``, ``dirty_at=0.8``. An example is ``contaminated`` when it is
Dirty; the verdict reports all four bucket shares.

A span here: a run of at least ``min_span`` tokens equal in the example and a document (found by
hashing every ``min_span``-token window, the "first 10 tokens" that must match exactly), extended
forward along the same alignment while at most ``skip_budget`` positions differ, and ending on a
match. Every token of the span is contaminated, mismatched positions inside it included. Spans are
found per document (a span never joins two documents). ``input_only`` / ``input_and_label``: whether
any contaminated token belongs to the label part of the example (input tokens, then label tokens).

Tokens: Llama 2 used its own tokenizer; ``tokenizer`` names any Hugging Face tokenizer by model
source (an embedded model such as ``smollm2-135m``, a local directory, or a hub id like
``meta-llama/Llama-2-7b-hf`` where the hub is reachable). The default ``"words"`` uses normalised
words (lowercased letters-and-digits runs) instead, which needs nothing and makes the 10-token span
about 10 words (roughly 13 Llama tokens): say so when comparing numbers with the paper's Table 51.
The words are ``contamray.metrics.ngrams``'s ``gpt2`` normalisation on both sides, so every language
is covered as there (NFKC; a character of Chinese, Japanese kana, Thai ... is a word; no diacritic
folding); a Hugging Face tokenizer does its own normalisation.

Template spans (issue #16): ``ngram_overlap`` sets apart n-grams several benchmark items share; this
method does not. Llama 2's measure is the share of a sample's *tokens* in long matched spans, and the
paper counts every such token whatever other samples hold it; a template shared by siblings adds its
tokens to each sibling's share, but 80 % of an example's tokens (Dirty) is not reached through a template
alone unless the example is mostly template, which is then what the paper reports.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import numpy as np

from contamray.corpus.pieces import Window, piece_bounds
from contamray.methods.base import Outputs, Verdict, register
from contamray.methods.open import common
from contamray.methods.open.ngram_overlap import tokenise_docs, windows_of, word_count
from contamray.metrics import ngrams as ng
from contamray.records import Record

NAME = "llama2_tokens"
WORDS = "words"
BUCKETS = ("clean", "not_clean", "not_dirty", "dirty")


@dataclass(frozen=True)
class Llama2TokensConfig:
    """Parameters of ``llama2_tokens``; defaults are the Llama 2 paper's (App. A.6).

    Worked example (``min_span=10``, ``skip_budget=4``): an example of 20 tokens of which tokens 0-14
    appear in a document except token 12 (one mismatch inside the span): the span is tokens 0-14, 15
    of 20 tokens = 75 % contaminated: Not clean and Not dirty, so not ``contaminated``.

    - ``tokenizer``: ``"words"`` or a model source for a Hugging Face tokenizer (see the docstring).
    - ``min_span``: tokens a span starts with, all equal (10).
    - ``skip_budget``: mismatched positions a span may contain after them (4).
    - ``clean_below`` / ``dirty_at``: bucket thresholds on the contaminated-token share (0.2 / 0.8).
    - ``input_fields`` / ``label_fields``: the example is input tokens followed by label tokens.
    """

    tokenizer: str = WORDS
    min_span: int = 10
    skip_budget: int = 4
    clean_below: float = 0.2
    dirty_at: float = 0.8
    input_fields: tuple[str, ...] = ("input",)
    label_fields: tuple[str, ...] = ("label",)
    partition_threshold: float = 0.0
    max_evidence: int = 5

    def __post_init__(self) -> None:
        common.check_config(
            NAME,
            self,
            [
                (
                    "tokenizer",
                    isinstance(self.tokenizer, str) and bool(self.tokenizer.strip()),
                    "'words' or a model source",
                ),
                common.integer(self, "min_span", 1, "(10)"),
                common.integer(self, "skip_budget", 0, "(4)"),
                ("clean_below", 0.0 < float(self.clean_below) <= 1.0, "a fraction in (0, 1] (0.2)"),
                (
                    "dirty_at",
                    float(self.clean_below) <= float(self.dirty_at) <= 1.0,
                    "a fraction in [clean_below, 1]",
                ),
            ],
            optional_fields=("input_fields", "label_fields"),
        )


@lru_cache(maxsize=4)
def load_tokenizer(source: str) -> Any:
    """A Hugging Face tokenizer for ``source`` (model source as in ``contamray.engines.models``)."""
    from transformers import AutoTokenizer

    from contamray.engines.models import resolve_model_path

    path = resolve_model_path(source, where=f"methods.{NAME}.tokenizer")
    return AutoTokenizer.from_pretrained(path)


def tokenize(texts: list[str], tokenizer: str) -> list[np.ndarray]:
    """Token ids (uint64) per text: word hashes for ``"words"``, else the tokenizer's ids."""
    if tokenizer == WORDS:
        return [ng.word_hashes(t, "gpt2") for t in texts]
    tok = load_tokenizer(tokenizer)
    ids = tok(list(texts), add_special_tokens=False)["input_ids"] if texts else []
    return [np.asarray(x, dtype=np.uint64) for x in ids]


def example_tokens(record: Record, cfg: Llama2TokensConfig) -> tuple[np.ndarray, int]:
    """The example's tokens (input then label) and how many belong to the input."""
    inp = common.join_fields(record, cfg.input_fields)
    lab = common.join_fields(record, cfg.label_fields)
    if cfg.tokenizer != WORDS and lab and inp:
        lab = " " + lab  # a label continues the input: tokenise it as a continuation
    ti, tl = tokenize([inp, lab], cfg.tokenizer)
    return np.concatenate([ti, tl]), int(ti.shape[0])


class TokenIndex:
    """Every ``min_span``-token window of every example, hashed, with the example's tokens."""

    def __init__(self, cfg: Llama2TokensConfig, records: list[Record]) -> None:
        self.tokenizer = cfg.tokenizer
        self.min_span = cfg.min_span
        self.record_ids = [r.id for r in records]
        self.partitions = [r.partition for r in records]
        self.tokens: list[np.ndarray] = []
        self.boundaries: list[int] = []
        hashes, entries = [], []
        self.entry_record: list[int] = []
        self.entry_position: list[int] = []
        for i, record in enumerate(records):
            toks, boundary = example_tokens(record, cfg)
            self.tokens.append(toks)
            self.boundaries.append(boundary)
            windows = ng.window_hashes(toks, cfg.min_span)
            base = len(self.entry_record)
            self.entry_record.extend([i] * windows.shape[0])
            self.entry_position.extend(range(windows.shape[0]))
            hashes.append(windows)
            entries.append(np.arange(base, base + windows.shape[0], dtype=np.int64))
        self.table = common.HashTable.build(
            np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64),
            np.concatenate(entries) if entries else np.zeros(0, dtype=np.int64),
        )


class _Cache(threading.local):
    docs: Any = None
    tokenizer: str = ""
    tokens: list[np.ndarray] = []


_CACHE = _Cache()


def _doc_tokens(docs: list[dict[str, Any]], tokenizer: str) -> list[np.ndarray]:
    if tokenizer == WORDS:
        return tokenise_docs(docs, "gpt2", NAME)[1]
    cache = _CACHE
    if cache.docs is not docs or cache.tokenizer != tokenizer:
        cache.tokens = tokenize(common.doc_texts(docs, NAME), tokenizer)
        cache.docs, cache.tokenizer = docs, tokenizer
    return cache.tokens


def extend_span(
    example: np.ndarray, doc: np.ndarray, start: int, shift: int, min_span: int, budget: int
) -> tuple[int, int]:
    """End (exclusive) of the span starting at ``example[start]`` = ``doc[start + shift]`` and its mismatches.

    The first ``min_span`` tokens are equal (the caller found them by hash and checked them); the span
    then runs on while at most ``budget`` positions differ, and ends on the last equal token.
    """
    length = min(example.shape[0] - start, doc.shape[0] - (start + shift))
    equal = example[start : start + length] == doc[start + shift : start + shift + length]
    mismatches = np.cumsum(~equal)
    ok = equal & (mismatches <= budget)
    last = int(np.flatnonzero(ok)[-1])
    return start + last + 1, int(mismatches[last])


def match(docs: list[dict[str, Any]], index: TokenIndex, cfg: Llama2TokensConfig) -> list[dict[str, Any]]:
    """One row per matched span: example token range ``[start, end)``, where it starts in the document
    (token offset), its mismatches, and whether it reaches into the label."""
    common.check_index(NAME, index, cfg, ("tokenizer", "min_span"))
    if not docs or len(index.table) == 0:
        return []
    doc_tokens = _doc_tokens(docs, cfg.tokenizer)
    windows = windows_of(cfg.min_span, doc_tokens)  # the batch's shared windows for "words"
    positions, entries = index.table.lookup(windows.hashes)
    keep = windows.valid[positions]
    positions, entries = positions[keep], entries[keep]
    if positions.shape[0] == 0:
        return []
    doc, offset = windows.locate(positions)
    bounds = piece_bounds(docs)  # a piece of a long document reports the spans starting in its own tokens
    seeds: dict[tuple[int, int, int], set[int]] = {}  # (record, doc, shift) -> example positions
    for d, o, e in zip(doc.tolist(), offset.tolist(), entries.tolist(), strict=True):
        r, i = index.entry_record[e], index.entry_position[e]
        example = index.tokens[r]
        if not np.array_equal(example[i : i + cfg.min_span], doc_tokens[d][o : o + cfg.min_span]):
            continue  # hash collision
        seeds.setdefault((r, d, o - i), set()).add(i)
    rows = []
    for (r, d, shift), starts in sorted(seeds.items()):
        example = index.tokens[r]
        for i in sorted(starts):
            if i - 1 in starts:
                continue  # inside an exact run: its span ends where the run start's span ends
            if not bounds.lo[d] <= i + shift < bounds.hi[d]:
                continue  # another piece of the document reports it
            end, mismatches = extend_span(example, doc_tokens[d], i, shift, cfg.min_span, cfg.skip_budget)
            rows.append(
                {
                    "record_id": index.record_ids[r],
                    "partition": index.partitions[r],
                    "doc_id": str(docs[d].get("doc_id", "")),
                    "start": i,
                    "end": end,
                    "doc_start": int(bounds.base[d]) + i + shift,
                    "mismatches": mismatches,
                    "n_tokens": int(example.shape[0]),
                    "label_tokens": max(0, end - max(i, index.boundaries[r])),
                }
            )
    return rows


def buckets(share: float, cfg: Llama2TokensConfig) -> dict[str, bool]:
    return {
        "clean": share < cfg.clean_below,
        "not_clean": share >= cfg.clean_below,
        "not_dirty": share < cfg.dirty_at,
        "dirty": share >= cfg.dirty_at,
    }


FOLD_MARK = "covered_start"  # a column of every folded row and of no match row
MATCH_COLUMNS = ("record_id", "doc_id", "start", "end", "doc_start")


def fold(rows: Any, cfg: Llama2TokensConfig) -> list[dict[str, Any]]:
    """Match rows (or earlier folds' rows, or both) folded into one row per example (``FOLD_CONTRACT``).

    A folded row keeps the example's contaminated tokens as merged ``[covered_start, covered_end)``
    ranges (at most half its tokens many), ``n_docs`` (matched documents: they add up, a document is
    matched in one batch) and the document-side spans of the first ``max_evidence`` documents in
    ``doc_id`` order, merged per document, at most ``max_evidence`` each (``hit_doc``, ``hit_start``,
    ``hit_end``, in tokens): all that ``score`` shows.
    """
    raw, folded = common.split_fold_input(rows, FOLD_MARK)
    examples: dict[str, dict[str, Any]] = {}
    cols = common.columns_of(raw, MATCH_COLUMNS, NAME)
    for row, _, doc, start, end, doc_start in zip(raw, *cols.values(), strict=True):
        example = _example(examples, row)
        example["covered"].append((int(start), int(end)))
        example["hits"].append((str(doc), int(doc_start), int(doc_start) + int(end) - int(start)))
    for example in examples.values():  # match rows: documents counted once
        example["n_docs"] = len({hit[0] for hit in example["hits"]})
    for row in folded:
        example = _example(examples, row)
        example["covered"] += zip(map(int, row["covered_start"]), map(int, row["covered_end"]), strict=True)
        hits = zip(row["hit_doc"], row["hit_start"], row["hit_end"], strict=True)
        example["hits"] += ((str(d), int(s), int(e)) for d, s, e in hits)
        example["n_docs"] += int(row["n_docs"])
    return [_folded_row(rid, examples[rid], cfg.max_evidence) for rid in sorted(examples)]


def _example(examples: dict[str, dict[str, Any]], row: dict[str, Any]) -> dict[str, Any]:
    new = {"partition": row.get("partition"), "n_docs": 0, "covered": [], "hits": []}
    return examples.setdefault(str(row["record_id"]), new)


def _folded_row(rid: str, example: dict[str, Any], max_evidence: int) -> dict[str, Any]:
    by_doc: dict[str, list[tuple[int, int]]] = {}
    for doc, start, end in example["hits"]:
        by_doc.setdefault(doc, []).append((start, end))
    hits = [
        (doc, start, end)
        for doc in sorted(by_doc)[:max_evidence]
        for start, end in common.merged_intervals(by_doc[doc])[:max_evidence]
    ]
    covered = common.merged_intervals(example["covered"])
    return {
        "record_id": rid,
        "partition": example["partition"],
        "n_docs": example["n_docs"],
        "covered_start": [start for start, _ in covered],
        "covered_end": [end for _, end in covered],
        "hit_doc": [doc for doc, _, _ in hits],
        "hit_start": [start for _, start, _ in hits],
        "hit_end": [end for _, _, end in hits],
    }


def score(records: list[Record], matches: Any, cfg: Llama2TokensConfig) -> list[dict[str, Any]]:
    """One row per example: contaminated-token share, the four buckets, type, documents and spans.

    ``matches`` are match rows, folded rows (``fold``, applied first) or both; ``spans`` are those of
    the first ``max_evidence`` documents (``doc_id`` order), at most ``max_evidence`` of them.
    """
    folded = {row["record_id"]: row for row in fold(matches, cfg)}
    out = []
    for record in records:
        tokens, boundary = example_tokens(record, cfg)
        n = int(tokens.shape[0])
        mask = np.zeros(n, dtype=bool)
        found = folded.get(record.id)
        for start, end in zip(found["covered_start"], found["covered_end"], strict=True) if found else ():
            mask[int(start) : int(end)] = True
        share = float(mask.mean()) if n else 0.0
        flags = buckets(share, cfg)
        error = ""
        if n == 0:
            error = (
                f"example {record.id!r} of {record.partition!r} has no tokens in "
                f"{', '.join(cfg.input_fields + cfg.label_fields)}; check the adapter or the fields"
            )
        columns = {
            "n_tokens": n,
            "n_input_tokens": boundary,
            "n_contaminated_tokens": int(mask.sum()),
            "contaminated_share": share,
            **{f"is_{name}": bool(flags[name]) and bool(n) for name in BUCKETS},
        }
        hits = list(zip(found["hit_doc"], found["hit_start"], found["hit_end"], strict=True)) if found else []
        row = common.example_row(
            record,
            columns,
            contaminated=bool(n) and flags["dirty"],
            label_found=bool(mask[boundary:].any()),
            docs=(doc for doc, _, _ in hits),
            spans=hits,
            unit="token",
            max_evidence=cfg.max_evidence,
            error=error,
        )
        row["n_docs"] = int(found["n_docs"]) if found else 0
        out.append(row)
    return out


def reduce(table: Any, cfg: Llama2TokensConfig) -> Verdict:
    """Fraction of Dirty examples, with the shares of all four buckets and the mean token share."""
    rows = [r for r in common.table_rows(table)]
    ok = [r for r in rows if not r.get("error")]
    details: dict[str, Any] = {
        f"{name}_rate": common.fraction(sum(bool(r.get(f"is_{name}")) for r in ok), len(ok)) for name in BUCKETS
    }
    details.update(
        {
            "mean_contaminated_share": float(np.mean([r.get("contaminated_share") or 0.0 for r in ok]))
            if ok
            else float("nan"),
            "tokenizer": cfg.tokenizer,
            "min_span": cfg.min_span,
            "skip_budget": cfg.skip_budget,
        }
    )
    return common.open_verdict(NAME, rows, cfg.partition_threshold, details)


def build_index(records: list[Record], cfg: Llama2TokensConfig) -> TokenIndex:
    return TokenIndex(cfg, records)


def window(cfg: Llama2TokensConfig, index: TokenIndex) -> Window | None:
    """What ``match`` looks at, for matching a long document in pieces (``contamray.corpus.pieces``): a
    span starts at an exact run of ``min_span`` tokens - a piece needs the token before what it owns, to
    see whether the run started earlier - and runs on at most to its example's end, so a piece needs the
    longest example's tokens, less one, after. Only with ``"words"``: a Hugging Face tokenizer's ids of a
    piece need not be those of the whole text (a word's first piece token differs at a text's start), so
    such documents are matched whole."""
    if cfg.tokenizer != WORDS:
        return None
    longest = max((int(t.shape[0]) for t in index.tokens), default=cfg.min_span)
    return Window("words:gpt2", partial(word_count, style="gpt2"), after=max(longest, cfg.min_span) - 1, before=1)


@register
class Llama2Tokens(common.OpenMethod):
    """Registered as ``llama2_tokens`` (family ``open``)."""

    name = NAME
    outputs = Outputs(
        score="contaminated_share",
        score_label="share of tokens in contaminated spans",
        membership="contaminated_share",
    )
    Config = Llama2TokensConfig
    steps = common.Steps(build_index, match, score, reduce, fold, window)
