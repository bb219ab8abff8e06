"""The corpus scan shared by the embedding matchers (Platypus, LLM Decontaminator).

Which side is indexed: the benchmark. Its examples are embedded once (``build_index``, on the
driver) and shipped to every match worker as one ``(n_examples, 384)`` float32 matrix; the corpus
streams past it and every passage of a batch is a query. The other way round (an index of the
corpus, queried by the examples at the end, as LLMSanitize does in memory) would grow with the
corpus: 1.5 KB per passage, terabytes for a pretraining corpus.

How each worker searches its copy of the benchmark (``index``):

- ``exact``: every passage of a batch against *all* examples by one matrix product (BLAS), in column
  blocks so memory stays bounded. This is the paper's all-pairs cosine. At benchmark scale it is
  also the fastest: measured on one CPU thread, 256 passages against 8,210 examples take 13.7 ms of
  product and 4.37 s of MiniLM encoding.
- ``hnsw``: an approximate-nearest-neighbour graph (HNSW, ``contamray.metrics.ann``) built once per
  worker over the examples; each passage retrieves its ``ann_candidates`` nearest examples, whose
  cosines are then recomputed exactly. Search costs ~log(n) instead of n. Measured here
  (``bench/embedding_index.py``, one batch of 256 passages, whose MiniLM encoding takes ~3.5 s):
  exact 131 ms / 1.07 s / 3.79 s against HNSW 95 / 133 / 119 ms at 10k / 100k / 300k examples, one-off
  graph builds of 0.7 / 12 / 45 s, and every pair at cosine >= 0.8 found by both.
  What it can miss, by construction: an example that is not among the ``ann_candidates`` nearest
  examples of any passage it matches (more than that many examples closer to the same passage), or
  one the graph search itself misses (recall below 1, raised by ``hnsw_ef_search``). An example's
  top-1 through the graph is never higher than the exact one, only possibly lower.
- ``auto`` (the default): ``hnsw`` from ``ann_min_examples`` (100,000) examples on, where the exact
  search grows to a third of the encoding; ``exact`` below, where it is cheap and exact.

Words: passages are cut at whitespace (``contamray.metrics.embedding.passages``), deliberately not
with ``contamray.metrics.ngrams``: the encoder reads the raw text and does its own tokenisation, and
the spans are whitespace-word offsets of the document. A line of Chinese or Japanese (no spaces) is
one "word", so it is one passage however long (the default MiniLM encoder is English and truncates at
256 tokens). The label check next to a passage (``label_near``) does use the n-gram words, so it
works in every language.

Top-k over the whole corpus, streamed: each worker keeps, per example, the ``k`` best similarities it
has seen so far (``_best``, in its own copy of the index, never pickled) and emits a match row only
for a passage at or above that running top-k's k-th value once the batch is in it, ties included (a
passage as similar as the k-th best may still rank before it: equal similarities rank by document,
then start). The corpus-wide top-k of an example is a subset of the rows emitted (a passage in the
global top-k is at or above its worker's running k-th best when it is seen), so the methods' ``fold``
(``best_rows``, on the worker) and ``score`` recover it exactly from the rows, while a worker emits
about ``k * log(batches)`` rows per example instead of one per batch. Build a fresh index for each
scan: a second scan through the same index only emits what beats the first one.

Long documents are embedded whole (no ``window``, ``contamray.corpus.pieces``): a passage's label check
reads the words after it, across lines, and the running top-k must never see a passage the whole
document does not have (a piece's cut-off context line would be one), so a piece would need its own
passages filtered before the search; not done. A document costs one encoder pass per passage either way,
linear in its length; only its passages and their 1.5 KB vectors are held per batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from contamray.methods.open import common
from contamray.metrics import embedding as emb
from contamray.metrics import ngrams as ng
from contamray.metrics.ann import HNSWIndex
from contamray.records import Record

COLUMN_BLOCK = 2048  # examples compared per matrix product
SEARCHES = ("auto", "exact", "hnsw")


@dataclass(frozen=True)
class SearchOptions:
    """How a worker searches the benchmark index; the embedding methods' Configs extend this.

    - ``index``: ``auto`` | ``exact`` | ``hnsw`` (see the module docstring).
    - ``ann_min_examples``: from this many examples on, ``auto`` means ``hnsw``.
    - ``ann_candidates``: examples retrieved per passage by the HNSW search.
    - ``hnsw_m`` / ``hnsw_ef_search``: links per graph node, and the search breadth (recall).
    """

    index: str = "auto"
    ann_min_examples: int = 100_000
    ann_candidates: int = 32
    hnsw_m: int = 32
    hnsw_ef_search: int = 128

    def search_checks(self) -> list[tuple[str, bool, str]]:
        """The checks of these keys, for ``common.check_config``."""
        return [
            ("index", self.index in SEARCHES, f"one of {', '.join(SEARCHES)}"),
            common.integer(self, "ann_min_examples", 0),
            common.integer(self, "ann_candidates", 1),
            common.integer(self, "hnsw_m", 2),
            common.integer(self, "hnsw_ef_search", 1),
        ]

    def search_for(self, n_examples: int) -> str:
        """``exact`` or ``hnsw`` for a benchmark of ``n_examples``."""
        if self.index != "auto":
            return self.index
        return "hnsw" if n_examples >= self.ann_min_examples else "exact"


class EmbeddingIndex:
    """Unit-normalised embeddings of the examples' query text, their labels, and the running top-k."""

    def __init__(
        self,
        records: list[Record],
        query_fields: tuple[str, ...],
        label_fields: tuple[str, ...],
        model: str,
        passage_words: int,
        batch_size: int,
        search: SearchOptions | None = None,
    ) -> None:
        self.model = model
        self.passage_words = passage_words
        self.record_ids = [r.id for r in records]
        self.partitions = [r.partition for r in records]
        self.queries = [common.query_text(r, query_fields) for r in records]
        self.labels = [ng.word_hashes(common.join_fields(r, label_fields)) for r in records]
        self.vectors = emb.encode(self.queries, model, batch_size)
        self.options = search or SearchOptions()
        self.search = self.options.search_for(len(records))
        self._best: np.ndarray | None = None
        self._graph: HNSWIndex | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_best"] = None
        state["_graph"] = None  # each process builds its own graph
        return state

    def graph(self) -> HNSWIndex:
        """This process's HNSW graph over the examples (built on first use)."""
        if self._graph is None:
            opts = self.options
            self._graph = HNSWIndex(self.vectors, m=opts.hnsw_m, ef_search=opts.hnsw_ef_search)
        return self._graph

    def running_best(self, k: int) -> np.ndarray:
        """This process's ``k`` best similarities per example so far (``-inf`` until seen)."""
        if self._best is None or self._best.shape[1] != k:
            self._best = np.full((len(self.record_ids), k), -np.inf, dtype=np.float32)
        return self._best


def build_index(records: list[Record], cfg: Any) -> EmbeddingIndex:
    """The index for an embedding method's Config (``query_fields``, ``label_fields``, ``model``,
    ``passage_words``, ``batch_size``)."""
    options = SearchOptions(**{f: getattr(cfg, f) for f in SearchOptions.__dataclass_fields__})
    return EmbeddingIndex(
        records, cfg.query_fields, cfg.label_fields, cfg.model, cfg.passage_words, cfg.batch_size, options
    )


def label_near(doc_words: list[str], passage: emb.Passage, label: np.ndarray) -> bool:
    """Whether the label's normalised words occur in the passage or right after it in its document
    (within twice the label's length plus 16 words: a multi-line answer follows its question line)."""
    if label.shape[0] == 0:
        return False
    stop = passage.end + 2 * int(label.shape[0]) + 16
    return common.contains(ng.word_hashes(" ".join(doc_words[passage.start : stop])), label) >= 0


def scan(
    docs: list[dict[str, Any]],
    index: EmbeddingIndex,
    *,
    method: str,
    k: int,
    threshold: float | None,
    floor: float,
    batch_size: int,
    text_chars: int,
) -> list[dict[str, Any]]:
    """Match rows for a batch: every (example, passage) with similarity >= ``threshold`` (when given),
    plus every passage entering an example's running top-``k`` with similarity >= ``floor``."""
    passages, vectors = emb.embed_documents(docs, index.model, index.passage_words, batch_size, method)
    if not passages or not index.record_ids:
        return []
    best = index.running_best(k)
    if index.search == "hnsw":
        sims = _candidates_by_graph(vectors, index, k, threshold, floor, best)
    else:
        sims = _candidates_exact(vectors, index, k, threshold, floor, best)
    rows = []
    doc_words: dict[int, list[str]] = {}
    for p, r in sorted(sims, key=lambda pr: (passages[pr[0]].doc, pr[0], pr[1])):
        passage = passages[p]
        if passage.doc not in doc_words:
            doc_words[passage.doc] = str(docs[passage.doc]["text"]).split()
        rows.append(
            {
                "record_id": index.record_ids[r],
                "partition": index.partitions[r],
                "doc_id": str(docs[passage.doc].get("doc_id", "")),
                "similarity": sims[(p, r)],
                "start": passage.start,
                "end": passage.end,
                "label_found": label_near(doc_words[passage.doc], passage, index.labels[r]),
                "passage": passage.text[:text_chars],
            }
        )
    return rows


def cosines(passages: np.ndarray, examples: np.ndarray) -> np.ndarray:
    """The float32 cosines of unit ``passages`` (rows) and ``examples`` (columns), summed in float64: a
    float32 product's last bit depends on how many passages share the batch (the BLAS kernel), so the
    same pair would score an ulp apart in two batchings of the corpus."""
    return (passages.astype(np.float64) @ examples.astype(np.float64)).astype(np.float32)


def _candidates_exact(
    vectors: np.ndarray, index: EmbeddingIndex, k: int, threshold: float | None, floor: float, best: np.ndarray
) -> dict[tuple[int, int], float]:
    """(passage, example) -> cosine for the pairs to emit, comparing every passage with every example."""
    sims: dict[tuple[int, int], float] = {}
    for c0 in range(0, len(index.record_ids), COLUMN_BLOCK):
        c1 = min(len(index.record_ids), c0 + COLUMN_BLOCK)
        similarity = cosines(vectors, index.vectors[c0:c1].T)  # (passages, examples)
        if threshold is not None:
            ps, cs = np.nonzero(similarity >= threshold)
            for p, c in zip(ps.tolist(), cs.tolist(), strict=True):
                sims[(p, c0 + c)] = float(similarity[p, c])
        _, vals = emb.top_k(similarity, k)
        merged = np.concatenate([best[c0:c1], vals.T.astype(np.float32)], axis=1)
        best[c0:c1] = -np.sort(-merged, axis=1)[:, :k]
        # every passage at or above the example's new running k-th best enters, ties included
        enters = (similarity >= best[c0:c1, k - 1][None, :]) & (similarity >= floor)
        ps, cs = np.nonzero(enters)
        for p, c in zip(ps.tolist(), cs.tolist(), strict=True):
            sims[(p, c0 + c)] = float(similarity[p, c])
    return sims


def _candidates_by_graph(
    vectors: np.ndarray, index: EmbeddingIndex, k: int, threshold: float | None, floor: float, best: np.ndarray
) -> dict[tuple[int, int], float]:
    """As ``_candidates_exact``, over the pairs the HNSW graph retrieves (each passage's
    ``ann_candidates`` nearest examples), with their cosines recomputed exactly."""
    ids, _ = index.graph().search(vectors, index.options.ann_candidates)
    ps, slots = np.nonzero(ids >= 0)
    es = ids[ps, slots]
    cos = np.einsum("ij,ij->i", vectors[ps].astype(np.float64), index.vectors[es]).astype(np.float32)
    sims: dict[tuple[int, int], float] = {}
    if threshold is not None:
        for i in np.flatnonzero(cos >= threshold).tolist():
            sims[(int(ps[i]), int(es[i]))] = float(cos[i])
    # as in the exact scan: the running top-k of each example is updated with its best candidates of the
    # batch, and those at or above its new k-th best (ties included) enter and are emitted
    keep = (cos >= floor) & (cos >= best[es, k - 1])
    ps, es, cos = ps[keep], es[keep], cos[keep]
    if es.size == 0:
        return sims
    order = np.lexsort((-cos, es))
    ps, es, cos = ps[order], es[order], cos[order]
    starts = np.flatnonzero(np.r_[True, es[1:] != es[:-1]])
    for start, stop in zip(starts.tolist(), [*starts[1:].tolist(), int(es.size)], strict=True):
        e = int(es[start])
        merged = np.concatenate([best[e], cos[start : min(stop, start + k)].astype(np.float32)])
        best[e] = -np.sort(-merged)[:k]
        top = slice(start, start + int(np.count_nonzero(cos[start:stop] >= best[e, k - 1])))
        for p, c in zip(ps[top].tolist(), cos[top].tolist(), strict=True):
            sims[(p, e)] = float(c)
    return sims


def best_rows(rows: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """An example's ``k`` most similar distinct passages from its match rows (ties: by document, start;
    ``common.top_rows``)."""
    return common.top_rows(rows, k, "similarity")
