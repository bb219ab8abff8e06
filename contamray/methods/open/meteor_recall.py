"""METEOR-recall matching of verbalised examples against corpus text (Li et al. 2023).

Paper: Yucheng Li, Frank Guerin, Chenghua Lin, "An Open-Source Data Contamination Report for Large
Language Models" (2023; the report this project's clean-vs-dirty evaluation follows), Sec. 3. Each
test example is *verbalised* (the question with its answer filled into the blank or appended;
``Record.verbalized``), candidate pages are retrieved (they used Bing restricted to Common Crawl),
and the overlap between example and page is measured with METEOR *recall* — how much of the example
the page contains, penalised when it is out of order — rather than exact match, so that formatting
differences and light edits still count. Parameters: METEOR with ``alpha = 1`` (recall only),
fragmentation penalty ``gamma = 0.8`` (``beta = 3``), an example is contaminated when its score is
``>= 0.75``; it is *input-and-label* contaminated when the matched text also contains the label
(label recall ``>= 0.75``, no order penalty: their released code scores the label with ``gamma=0``),
otherwise *input-only*. (The released code, liyucheng09/Contamination_Detector, used gamma 0.5 and a
threshold of 0.7 on search snippets; the paper's values are the defaults here.)

Here the corpus is local, so retrieval is an n-gram prefilter: a document is a candidate for an
example when it shares at least ``prefilter_min_matches`` distinct ``prefilter_n``-word n-grams with
the verbalised example (all of them for examples with fewer). Candidate documents are cut into
windows of ``window_factor`` (2) times the example's length, stepping by the example's length, so
any occurrence of the example lies wholly inside some window; the example's score is its best
window's METEOR recall (``contamray.metrics.meteor``: exact then Porter-stem matching; WordNet
synonyms are not available offline). Per example the row keeps the best window (document id and
word span) as evidence.

Light edits: a copy with every 5th word changed keeps recall 0.8 in 4-word chunks (penalty
0.8 * (1/4)**3 = 0.0125), scores 0.79 and is found — where every 8- or 13-gram matcher misses it.

Folding (``fold``, ``common.FOLD_CONTRACT``): per example the best window's match row and a summary of
the windows at or above the threshold (their documents counted, the first ``max_evidence`` documents and
spans, whether one shows the label): what ``score`` reads, whatever the number of copies.

Long documents are matched whole (no ``window``, ``contamray.corpus.pieces``): the prefilter counts a
*document's* distinct n-grams and the windows are laid from the document's start to its end, so a piece
would be a candidate, or hold windows, that the whole document is not. The cost: ``best_windows`` stems
and bounds every window of a candidate document once per candidate example, and a long document is a
candidate of many examples, so its time grows about with the square of its length (9.4 s for one 0.26 MB
document, issue #16); its memory stays that of the document's words.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from contamray.methods.base import Outputs, Verdict, register
from contamray.methods.open import common
from contamray.methods.open import ngram_overlap as ngo
from contamray.metrics import meteor as mt
from contamray.records import Record

NAME = "meteor_recall"


@dataclass(frozen=True)
class MeteorRecallConfig:
    """Parameters of ``meteor_recall``; defaults are Li et al. 2023's.

    Worked example: the verbalised example ``"Which gas do plants absorb? carbon dioxide"`` (7
    words) against a document containing ``"... which gas do plants absorb from the air? Carbon
    dioxide ..."``: windows of 14 words, the best aligns all 7 words in 2 chunks ("which gas do plants
    absorb", "carbon dioxide"): recall 1, penalty 0.8 * (2/7)**3 = 0.019, score 0.98 >= 0.75; the label
    recall is 1: ``input_and_label``.

    - ``query_fields``: the example's text (``verbalized``; input + label when an adapter leaves it
      empty). ``label_fields``: the label looked for in the matched window.
    - ``gamma`` / ``beta``: METEOR's fragmentation penalty ``gamma * (chunks/matches)**beta``.
    - ``threshold``: contaminated when the best window's METEOR recall is at least this (0.75).
    - ``label_gamma``: the penalty's gamma for the label's recall (0: order not checked).
    - ``window_factor``: window length as a multiple of the example's word count (2).
    - ``prefilter_n`` / ``prefilter_min_matches``: candidate documents share at least this many
      distinct n-grams of this length with the example.
    - ``min_report_score``: candidate windows scoring below this produce no match row (evidence).
    """

    query_fields: tuple[str, ...] = ("verbalized",)
    label_fields: tuple[str, ...] = ("label",)
    gamma: float = 0.8
    beta: float = 3.0
    threshold: float = 0.75
    label_gamma: float = 0.0
    window_factor: float = 2.0
    prefilter_n: int = 4
    prefilter_min_matches: int = 2
    min_report_score: float = 0.5
    partition_threshold: float = 0.0
    max_evidence: int = 5

    def __post_init__(self) -> None:
        common.check_config(
            NAME,
            self,
            [
                ("gamma", 0.0 <= float(self.gamma) <= 1.0, "a number in [0, 1] (0.8)"),
                ("beta", float(self.beta) >= 0.0, "a number >= 0 (3)"),
                ("threshold", 0.0 < float(self.threshold) <= 1.0, "a number in (0, 1] (0.75)"),
                ("label_gamma", 0.0 <= float(self.label_gamma) <= 1.0, "a number in [0, 1]"),
                ("window_factor", float(self.window_factor) >= 1.0, "a number >= 1 (2)"),
                common.integer(self, "prefilter_n", 1),
                common.integer(self, "prefilter_min_matches", 1),
                ("min_report_score", 0.0 <= float(self.min_report_score) <= 1.0, "a number in [0, 1]"),
            ],
            required_fields=("query_fields",),
            optional_fields=("label_fields",),
        )

    def prefilter(self) -> ngo.NGramOverlapConfig:
        """The n-gram index config of the prefilter (METEOR's words: the ``gpt2`` normalisation)."""
        return ngo.NGramOverlapConfig(
            n=self.prefilter_n,
            input_fields=self.query_fields,
            label_fields=(),
            normalization="gpt2",
            short_examples="whole",
            min_words=1,
        )


def _query(record: Record, cfg: MeteorRecallConfig) -> list[str]:
    return mt.tokens(common.query_text(record, cfg.query_fields))


class MeteorIndex:
    """The prefilter's n-gram index plus each example's METEOR words (picklable)."""

    def __init__(self, cfg: MeteorRecallConfig, records: list[Record]) -> None:
        self.prefilter_n = cfg.prefilter_n
        queried = [
            Record.from_row({**r.to_row(), "verbalized": common.query_text(r, cfg.query_fields)}) for r in records
        ]
        self.ngrams = ngo.build_index(queried, cfg.prefilter())
        self.queries = [_query(r, cfg) for r in records]
        self.inputs = [mt.tokens(r.input) for r in records]
        self.labels = [mt.tokens(common.join_fields(r, cfg.label_fields)) for r in records]
        self.n_grams = [sum(ngo.example_grams(r, cfg.prefilter()).counts) for r in queried]

    @property
    def record_ids(self) -> list[str]:
        return self.ngrams.record_ids


def candidates(docs: list[dict[str, Any]], index: ngo.NGramIndex) -> dict[tuple[int, int], int]:
    """(record index, document index) -> distinct n-grams of the record found in the document."""
    batch = ngo.token_batch(docs, index.style, NAME)
    grams: dict[tuple[int, int], set[tuple[int, int]]] = {}
    for length, windows, hit, key in ngo.gram_hits(batch, index):
        if hit.shape[0] == 0:
            continue
        table = index.tables[length]
        doc, _ = windows.locate(hit)
        counts = table.starts[key + 1] - table.starts[key]
        owner = np.repeat(np.arange(hit.shape[0]), counts)
        within = np.arange(owner.shape[0]) - np.repeat(np.cumsum(counts) - counts, counts)
        records = table.record[table.starts[key][owner] + within]
        for r, d, k in zip(records.tolist(), doc[owner].tolist(), key[owner].tolist(), strict=True):
            grams.setdefault((r, d), set()).add((length, k))
    return {pair: len(found) for pair, found in grams.items()}


@dataclass
class WindowScore:
    score: float
    start: int
    end: int


def window_starts(n_doc: int, width: int, stride: int) -> list[int]:
    """Window starts covering the document: every ``stride`` words, the last window ending at its end."""
    if n_doc <= width:
        return [0]
    starts = list(range(0, n_doc - width + 1, stride))
    if starts[-1] != n_doc - width:
        starts.append(n_doc - width)
    return starts


def best_windows(query: list[str], doc: list[str], cfg: MeteorRecallConfig) -> list[WindowScore]:
    """METEOR recall of ``query`` in every window of ``doc`` that can beat the best so far, best first.

    A window's bag-of-stems overlap with the query bounds its recall from above, so a window that can
    neither beat the best so far nor reach the threshold (or ``min_report_score``) is not aligned.
    """
    q = len(query)
    width = max(1, math.ceil(cfg.window_factor * q))
    stride = max(1, q)
    q_stems = Counter(mt.stem(w) for w in query)
    d_stems = [mt.stem(w) for w in doc]
    scored: list[WindowScore] = []
    best = -1.0
    for start in window_starts(len(doc), width, stride):
        end = min(len(doc), start + width)
        window_stems = Counter(d_stems[start:end])
        bound = sum(min(c, window_stems[s]) for s, c in q_stems.items()) / q
        if bound < cfg.min_report_score or (bound <= best and bound < cfg.threshold):
            continue
        value = mt.meteor_recall(query, doc[start:end], gamma=cfg.gamma, beta=cfg.beta)
        scored.append(WindowScore(value, start, end))
        best = max(best, value)
    return sorted(scored, key=lambda w: (-w.score, w.start))


def match(docs: list[dict[str, Any]], index: MeteorIndex, cfg: MeteorRecallConfig) -> list[dict[str, Any]]:
    """One row per (record, candidate document) whose best window scores ``min_report_score`` or more:
    the score, the window (normalised word offsets), the label's and the input's recall in it."""
    common.check_index(NAME, index, cfg, ("prefilter_n",))
    if not docs or not index.ngrams.tables:
        return []
    words, _ = ngo.tokenise_docs(docs, "gpt2", NAME)
    rows = []
    for (r, d), n_found in sorted(candidates(docs, index.ngrams).items(), key=lambda kv: (kv[0][1], kv[0][0])):
        query = index.queries[r]
        if not query or n_found < min(cfg.prefilter_min_matches, index.n_grams[r]):
            continue
        doc = [w.decode("utf-8", "replace") for w in words[d]]
        windows = best_windows(query, doc, cfg)
        if not windows or windows[0].score < cfg.min_report_score:
            continue
        best = windows[0]
        label_score = 0.0
        if index.labels[r]:  # the label's recall in any window that matches (Li et al.'s label check)
            matching = [w for w in windows if w.score >= cfg.threshold] or [best]
            label_score = max(
                mt.meteor_recall(index.labels[r], doc[w.start : w.end], gamma=cfg.label_gamma, beta=cfg.beta)
                for w in matching
            )
        input_score = mt.meteor_recall(index.inputs[r], doc[best.start : best.end], gamma=cfg.gamma, beta=cfg.beta)
        rows.append(
            {
                "record_id": index.record_ids[r],
                "partition": index.ngrams.partitions[r],
                "doc_id": str(docs[d].get("doc_id", "")),
                "score": float(best.score),
                "label_score": float(label_score),
                "input_score": float(input_score),
                "start": best.start,
                "end": best.end,
                "prefilter_ngrams": int(n_found),
                "text": " ".join(doc[best.start : best.end])[:400],
            }
        )
    return rows


_NEEDED = ("record_id", "doc_id", "score", "label_score", "start", "end")


def fold(rows: Any, cfg: MeteorRecallConfig) -> list[dict[str, Any]]:
    """Match rows (or earlier folds) as at most two rows per example: the summary of the windows at or above
    the threshold (documents counted, the first ``max_evidence`` documents and spans, whether one shows
    the label; none below), then the best window's match row, kept (``common.FOLD_CONTRACT``)."""
    return common.fold_ranked(
        rows,
        _NEEDED,
        NAME,
        column="score",
        limit=cfg.max_evidence,
        counts=lambda r: float(r["score"]) >= cfg.threshold,
        label=lambda r: float(r["label_score"]) >= cfg.threshold,
    )


def score(records: list[Record], matches: Any, cfg: MeteorRecallConfig) -> list[dict[str, Any]]:
    """One row per example: best METEOR recall, decision, input-only or input-and-label, evidence.
    ``matches``: match rows, folded rows (``fold``) or both."""
    grouped = common.by_record(fold(matches, cfg), {r.id for r in records})
    out = []
    for record in records:
        evidence, best = common.ranked_example(grouped.get(record.id, []))
        error = ""
        if not _query(record, cfg):
            error = (
                f"example {record.id!r} of {record.partition!r} has no words in "
                f"{', '.join(cfg.query_fields)}; check the benchmark adapter or query_fields"
            )
        columns = {
            "meteor_recall": float(best["score"]) if best else 0.0,
            "label_recall": float(best["label_score"]) if best else 0.0,
        }
        spans = [] if best is None else [(str(best["doc_id"]), int(best["start"]), int(best["end"]))]
        out.append(
            common.evidence_row(
                record,
                columns,
                evidence,
                contaminated=evidence.n_docs > 0,
                spans=None if evidence.n_docs else spans,  # none above the threshold: the best window
                unit="word",
                max_evidence=cfg.max_evidence,
                error=error,
                extra={"best_doc_id": str(best["doc_id"]) if best else ""},
            )
        )
    return out


def reduce(table: Any, cfg: MeteorRecallConfig) -> Verdict:
    return common.open_verdict(
        NAME,
        table,
        cfg.partition_threshold,
        {"threshold": cfg.threshold, "gamma": cfg.gamma, "beta": cfg.beta},
    )


def build_index(records: list[Record], cfg: MeteorRecallConfig) -> MeteorIndex:
    return MeteorIndex(cfg, records)


@register
class MeteorRecall(common.OpenMethod):
    """Registered as ``meteor_recall`` (family ``open``)."""

    name = NAME
    outputs = Outputs(
        score="meteor_recall",
        score_label="best METEOR recall over corpus windows",
        membership="meteor_recall",
    )
    Config = MeteorRecallConfig
    steps = common.Steps(build_index, match, score, reduce, fold)
