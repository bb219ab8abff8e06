"""Embedding search benchmark: a worker's HNSW graph against the exact product, by benchmark size.

The embedding matchers (``platypus_embedding``, ``llm_decontaminator``) index the benchmark and query
it with every corpus passage (``contamray.methods.open.embedding_scan``). Per batch of passages a
worker either multiplies them with all examples (``index=exact``) or searches an HNSW graph of the
examples (``index=hnsw``); ``index=auto`` switches at ``ann_min_examples``. This script measures, in
one run, for growing example sets:

- the search step of one batch (256 passages) both ways, exactly as the scan runs it (the running
  top-1 and the 0.8 threshold of Platypus), best of three, and their ratio ``exact / hnsw``;
- the MiniLM encoding of the same batch, the cost both ways share (the search matters only where it
  is not small next to it);
- the one-off graph build per worker;
- recall: the share of the exact scan's emitted (passage, example) pairs that the graph also emits.

Examples are real MiniLM embeddings of mirrored benchmark questions (GSM8K, ARC, MMLU, ...), grown
to the larger sizes by perturbed copies (each a distinct unit vector at cosine ~0.7 to its source,
so the set keeps the clusters of real text without piling up near-duplicates); passages are real corpus lines
(XSum articles) plus planted verbatim questions. The last line is
``ratio_exact_vs_hnsw_at_<largest>: <x>x``.

    python bench/embedding_index.py --mirror ../shared/benchmarks [--sizes 10000,100000,300000]
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

print = functools.partial(print, flush=True)  # noqa: A001 - progress shows up in pipes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUESTIONS = (  # (mirror file, question field)
    ("openai/gsm8k/main/test.jsonl", "question"),
    ("allenai/ai2_arc/ARC-Challenge/test.jsonl", "question"),
    ("cais/mmlu/all/test.jsonl", "question"),
    ("Rowan/hellaswag/default/validation.jsonl", "ctx"),
    ("truthfulqa/truthful_qa/generation/validation.jsonl", "question"),
)
PASSAGES = ("EdinburghNLP/xsum/default/test.jsonl", "document")
BATCH = 256


def read_field(mirror: Path, rel: str, field: str, limit: int) -> list[str]:
    path = mirror / rel
    if not path.is_file():
        return []
    out = []
    with path.open() as fh:
        for line in fh:
            text = json.loads(line).get(field)
            if isinstance(text, str) and text.strip():
                out.append(text.strip())
            if len(out) >= limit:
                break
    return out


def grown(base: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` unit vectors: ``base`` itself, then perturbed copies (cosine ~0.7 to their source: related
    questions, as in a list pooled from many benchmarks, not near-duplicates of each other)."""
    picks = np.concatenate([np.arange(len(base)), rng.integers(0, len(base), size=max(0, n - len(base)))])[:n]
    out = base[picks].copy()
    extra = slice(len(base), n)
    noise = rng.standard_normal((max(0, n - len(base)), base.shape[1])).astype(np.float32)
    out[extra] += noise / np.sqrt(base.shape[1])
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def index_of(vectors: np.ndarray, search: str):
    from contamray.methods.open.embedding_scan import EmbeddingIndex, SearchOptions

    index = EmbeddingIndex.__new__(EmbeddingIndex)
    index.record_ids = [str(i) for i in range(len(vectors))]
    index.vectors = vectors
    index.options = SearchOptions(index=search)
    index.search = search
    index._best = None
    index._graph = None
    return index


def search_once(index, passages: np.ndarray) -> tuple[float, set]:
    from contamray.methods.open import embedding_scan as es

    index._best = None
    best = index.running_best(1)
    step = es._candidates_by_graph if index.search == "hnsw" else es._candidates_exact
    start = time.perf_counter()
    pairs = step(passages, index, 1, 0.8, -1.0, best)
    elapsed = time.perf_counter() - start
    return elapsed, {pair for pair, sim in pairs.items() if sim >= 0.8}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=ROOT.parent / "shared" / "benchmarks")
    parser.add_argument("--sizes", default="10000,100000,300000")
    parser.add_argument("--questions", type=int, default=3000)
    args = parser.parse_args()
    from contamray.metrics import embedding as emb

    rng = np.random.default_rng(0)
    questions = [q for rel, field in QUESTIONS for q in read_field(args.mirror, rel, field, args.questions // 5)]
    lines = [
        line.strip() for doc in read_field(args.mirror, *PASSAGES, 400) for line in doc.splitlines() if line.strip()
    ]
    random.Random(0).shuffle(lines)
    planted = random.Random(1).sample(questions, 32)
    texts = lines[: BATCH - len(planted)] + planted
    print(f"{len(questions)} real questions, {len(texts)} passages per batch ({len(planted)} planted questions)")

    start = time.perf_counter()
    base = emb.encode(questions, emb.MINILM, 64)
    print(f"encoded the questions in {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    passages = emb.encode(texts, emb.MINILM, 64)
    encode_s = time.perf_counter() - start
    print(f"encode one batch of {len(texts)} passages: {encode_s * 1000:.0f} ms (shared by both searches)")

    ratio = 0.0
    largest = 0
    for n in [int(s) for s in args.sizes.split(",")]:
        vectors = grown(base, n, rng)
        exact, hnsw = index_of(vectors, "exact"), index_of(vectors, "hnsw")
        start = time.perf_counter()
        hnsw.graph()
        build_s = time.perf_counter() - start
        exact_runs = [search_once(exact, passages) for _ in range(3)]
        hnsw_runs = [search_once(hnsw, passages) for _ in range(3)]
        exact_s, truth = min(t for t, _ in exact_runs), exact_runs[0][1]
        hnsw_s, got = min(t for t, _ in hnsw_runs), hnsw_runs[0][1]
        recall = len(truth & got) / len(truth) if truth else 1.0
        ratio, largest = exact_s / hnsw_s, n
        print(
            f"examples {n:>8,}: exact {exact_s * 1000:8.1f} ms  hnsw {hnsw_s * 1000:6.1f} ms  "
            f"ratio {ratio:6.1f}x  graph build {build_s:6.1f} s  recall {recall:.4f} "
            f"({len(got & truth)}/{len(truth)} pairs >= 0.8)  exact search / encode {exact_s / encode_s:.2f}"
        )
    print(f"ratio_exact_vs_hnsw_at_{largest}: {ratio:.1f}x")


if __name__ == "__main__":
    main()
