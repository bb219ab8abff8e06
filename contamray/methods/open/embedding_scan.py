"""The corpus scan shared by the embedding matchers (Platypus, LLM Decontaminator).

Which side is indexed: the benchmark. Its examples are embedded once (``build_index``, on the
driver) and shipped to every match worker as one ``(n_examples, 384)`` float32 matrix; the corpus
streams past it, every passage of a batch is embedded and compared with *all* examples by one matrix
product (exact cosine similarity, BLAS), in column blocks so memory stays bounded. No approximate
nearest-neighbour index is needed: ANN libraries (faiss, hnswlib) pay off when the *indexed* side is
huge and queried a few times, but here the indexed side is a benchmark (thousands to ~100k rows) and
every corpus passage is a query, so the exact product is both faster per passage and exact — and it
adds no dependency. Encoding the passages dominates the cost by far: measured on one CPU thread, 256
passages against 8,210 examples take 13.7 ms of product and 4.37 s of MiniLM encoding.

Top-k over the whole corpus, streamed: each worker keeps, per example, the ``k`` best similarities it
has seen so far (``_best``, in its own copy of the index, never pickled) and emits a match row only
for a passage that enters that running top-k. The corpus-wide top-k of an example is a subset of the
rows emitted (a passage in the global top-k is in its worker's top-k when it is seen), so ``score``
recovers it exactly from the rows, while a worker emits about ``k * log(batches)`` rows per example
instead of one per batch. Build a fresh index for each scan.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from contamray.methods.open import common
from contamray.metrics import embedding as emb
from contamray.metrics import ngrams as ng
from contamray.records import Record

COLUMN_BLOCK = 2048  # examples compared per matrix product


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
    ) -> None:
        self.model = model
        self.passage_words = passage_words
        self.record_ids = [r.id for r in records]
        self.partitions = [r.partition for r in records]
        self.queries = [common.query_text(r, query_fields) for r in records]
        self.labels = [ng.word_hashes(common.join_fields(r, label_fields)) for r in records]
        self.vectors = emb.encode(self.queries, model, batch_size)
        self._best: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_best"] = None
        return state

    def running_best(self, k: int) -> np.ndarray:
        """This process's ``k`` best similarities per example so far (``-inf`` until seen)."""
        if self._best is None or self._best.shape[1] != k:
            self._best = np.full((len(self.record_ids), k), -np.inf, dtype=np.float32)
        return self._best


def build_index(records: list[Record], cfg: Any) -> EmbeddingIndex:
    """The index for an embedding method's Config (``query_fields``, ``label_fields``, ``model``,
    ``passage_words``, ``batch_size``)."""
    return EmbeddingIndex(records, cfg.query_fields, cfg.label_fields, cfg.model, cfg.passage_words, cfg.batch_size)


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
    pairs: set[tuple[int, int]] = set()  # (passage, record)
    sims: dict[tuple[int, int], float] = {}
    for c0 in range(0, len(index.record_ids), COLUMN_BLOCK):
        c1 = min(len(index.record_ids), c0 + COLUMN_BLOCK)
        similarity = vectors @ index.vectors[c0:c1].T  # (passages, examples)
        if threshold is not None:
            ps, cs = np.nonzero(similarity >= threshold)
            for p, c in zip(ps.tolist(), cs.tolist(), strict=True):
                pairs.add((p, c0 + c))
                sims[(p, c0 + c)] = float(similarity[p, c])
        idx, vals = emb.top_k(similarity, k)
        kth = best[c0:c1, k - 1]
        enters = (vals > kth[None, :]) & (vals >= floor)
        ranks, cs = np.nonzero(enters)
        for rank, c in zip(ranks.tolist(), cs.tolist(), strict=True):
            p = int(idx[rank, c])
            pairs.add((p, c0 + c))
            sims[(p, c0 + c)] = float(vals[rank, c])
        merged = np.concatenate([best[c0:c1], vals.T.astype(np.float32)], axis=1)
        best[c0:c1] = -np.sort(-merged, axis=1)[:, :k]
    rows = []
    doc_words: dict[int, list[str]] = {}
    for p, r in sorted(pairs, key=lambda pr: (passages[pr[0]].doc, pr[0], pr[1])):
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


def best_rows(rows: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """An example's ``k`` most similar distinct passages from its match rows (ties: by document, start)."""
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        key = (str(row["doc_id"]), int(row["start"]))
        if key not in seen or float(row["similarity"]) > float(seen[key]["similarity"]):
            seen[key] = row
    ordered = sorted(
        seen.values(), key=lambda r: (-float(r["similarity"]), str(r["doc_id"]), int(r["start"]))
    )
    return ordered[:k]
