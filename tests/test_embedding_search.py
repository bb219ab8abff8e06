"""The embedding scan's two ways of searching the benchmark index agree where they must.

``exact`` compares every passage with every example; ``hnsw`` retrieves each passage's nearest
examples from a faiss HNSW graph and then applies the same threshold and running top-k. With as many
candidates as examples the graph search is exhaustive, so both must emit the very same pairs with
the same cosines, batch after batch (the running top-k is stateful); with fewer candidates the
graph emits a subset. No model is needed: the vectors are random unit vectors.
"""

from __future__ import annotations

import numpy as np
import pytest

from contamray.methods.base import get_method
from contamray.methods.open import embedding_scan as es
from contamray.metrics.ann import HNSWIndex


def unit(rng: np.random.Generator, n: int, d: int = 32) -> np.ndarray:
    v = rng.standard_normal((n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def bare_index(vectors: np.ndarray, **options) -> es.EmbeddingIndex:
    index = es.EmbeddingIndex.__new__(es.EmbeddingIndex)
    index.record_ids = [f"r{i}" for i in range(len(vectors))]
    index.vectors = vectors
    index.options = es.SearchOptions(**options)
    index.search = index.options.search_for(len(vectors))
    index._best = None
    index._graph = None
    return index


def scan_batches(index: es.EmbeddingIndex, batches: list[np.ndarray], k: int, threshold: float | None):
    step = es._candidates_by_graph if index.search == "hnsw" else es._candidates_exact
    best = index.running_best(k)
    return [step(batch, index, k, threshold, -1.0, best) for batch in batches]


def test_exhaustive_graph_search_emits_exactly_the_exact_pairs():
    rng = np.random.default_rng(0)
    examples = unit(rng, 60)
    # passages: random ones plus noisy copies of examples (so some pairs pass the threshold)
    batches = [np.vstack([unit(rng, 15), examples[i * 5 : i * 5 + 5] + 0.05 * unit(rng, 5)]) for i in range(4)]
    batches = [b / np.linalg.norm(b, axis=1, keepdims=True) for b in batches]
    exact = scan_batches(bare_index(examples, index="exact"), batches, 3, 0.9)
    graph = scan_batches(bare_index(examples, index="hnsw", ann_candidates=60), batches, 3, 0.9)
    for e_pairs, g_pairs in zip(exact, graph, strict=True):
        assert set(e_pairs) == set(g_pairs)
        assert all(g_pairs[p] == pytest.approx(e_pairs[p], abs=1e-5) for p in e_pairs)
    assert any(sim >= 0.9 for pairs in exact for sim in pairs.values())  # the threshold was exercised
    assert sum(len(p) for p in exact[1:]) < sum(len(p) for p in exact[:1]) * 3  # top-k entries thin out
    for search in ("exact", "hnsw"):  # after each example's own copy, nothing enters its running top-1
        index = bare_index(examples, index=search, ann_candidates=60)
        copies, later = scan_batches(index, [examples, batches[0]], 1, None)
        assert set(copies) == {(i, i) for i in range(60)} and later == {}


def test_fewer_candidates_keep_the_near_duplicates_and_never_overstate_a_top_1():
    rng = np.random.default_rng(1)
    examples = unit(rng, 500)
    planted = examples[:20] + 0.02 * unit(rng, 20)
    batch = np.vstack([unit(rng, 100), planted / np.linalg.norm(planted, axis=1, keepdims=True)])
    exact_index, graph_index = bare_index(examples, index="exact"), bare_index(examples, index="hnsw", ann_candidates=4)
    (exact,) = scan_batches(exact_index, [batch], 1, 0.8)
    (graph,) = scan_batches(graph_index, [batch], 1, 0.8)
    near = {pair for pair, sim in exact.items() if sim >= 0.8}
    assert near == {(100 + i, i) for i in range(20)}
    assert {pair for pair, sim in graph.items() if sim >= 0.8} == near
    # an example whose best passage did not retrieve it gets a lower top-1, never a higher one
    assert np.all(graph_index.running_best(1) <= exact_index.running_best(1) + 1e-6)
    assert np.any(graph_index.running_best(1) < exact_index.running_best(1) - 1e-3)  # approximate indeed


def test_graph_search_returns_the_nearest_rows_by_inner_product():
    rng = np.random.default_rng(2)
    data = unit(rng, 200)
    ids, sims = HNSWIndex(data, ef_search=256).search(data[:10], 3)
    assert ids[:, 0].tolist() == list(range(10))
    assert np.allclose(sims[:, 0], 1.0, atol=1e-5)
    truth = np.argsort(-(data[:10] @ data.T), axis=1)[:, :3]
    assert (ids == truth).mean() > 0.95
    empty_ids, _ = HNSWIndex(data[:0]).search(data[:2], 3)
    assert empty_ids.shape == (2, 0)


def test_auto_switches_at_the_configured_size_and_bad_options_are_named():
    assert es.SearchOptions(ann_min_examples=10).search_for(9) == "exact"
    assert es.SearchOptions(ann_min_examples=10).search_for(10) == "hnsw"
    assert es.SearchOptions(index="exact", ann_min_examples=0).search_for(10**6) == "exact"
    method = get_method("platypus_embedding")
    with pytest.raises(ValueError, match="index") as err:
        method.make_config({"index": "faiss"})
    assert "auto, exact, hnsw" in str(err.value)
    with pytest.raises(ValueError, match="ann_candidates"):
        get_method("llm_decontaminator").make_config({"ann_candidates": 0})


def test_each_process_builds_its_own_graph():
    """The index is shipped to Ray workers by pickling: the graph (a faiss object) and the running
    top-k stay behind, and the copy builds its own graph that answers the same."""
    import pickle

    rng = np.random.default_rng(3)
    examples = unit(rng, 40)
    index = bare_index(examples, index="hnsw", ann_candidates=40)
    scan_batches(index, [examples[:5]], 1, 0.9)
    copy = pickle.loads(pickle.dumps(index))
    assert copy._graph is None and copy._best is None and index._graph is not None
    (pairs,) = scan_batches(copy, [examples[:5]], 1, 0.9)
    assert {pair for pair, sim in pairs.items() if sim >= 0.9} == {(i, i) for i in range(5)}
