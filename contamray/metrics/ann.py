"""Approximate nearest neighbours by inner product: an HNSW graph (faiss) over unit vectors.

HNSW (Malkov & Yashunin, "Efficient and robust approximate nearest neighbor search using
Hierarchical Navigable Small World graphs", TPAMI 2018) answers a query in about ``log(n)``
distance computations instead of ``n``. ``m`` (links per node, 32) and ``ef_construction`` (40, faiss'
default) set the graph's quality, ``ef_search`` (128) the breadth of each search: recall against
the exact answer rises with it, and ``bench/embedding_index.py`` measures both.

Vectors are unit-normalised, so inner product is cosine similarity. The graph is built in the
process that searches it (a Ray match worker builds its own once: faiss indexes are not shipped
between processes), with as many OpenMP threads as the Ray actor holds CPUs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from contamray.ray_threads import allocated_cpus


def _faiss() -> Any:
    try:
        import faiss
    except ImportError as err:  # pragma: no cover - faiss-cpu is a dependency
        raise ImportError(
            "the HNSW index needs faiss (`pip install faiss-cpu`, or faiss-gpu); or set the method's "
            "index=exact to compare every passage with every example instead"
        ) from err
    return faiss


class HNSWIndex:
    """An HNSW graph over the rows of ``vectors`` (float32, unit norm); ``search`` gives the nearest rows."""

    def __init__(self, vectors: np.ndarray, m: int = 32, ef_construction: int = 40, ef_search: int = 128) -> None:
        faiss = _faiss()
        cpus = allocated_cpus()
        if cpus is not None:  # inside a Ray worker: one OpenMP thread per CPU it holds
            faiss.omp_set_num_threads(cpus)
        data = np.ascontiguousarray(vectors, dtype=np.float32)
        self.size = int(data.shape[0])
        self._index = faiss.IndexHNSWFlat(int(data.shape[1]), int(m), faiss.METRIC_INNER_PRODUCT)
        self._index.hnsw.efConstruction = int(ef_construction)
        self._index.hnsw.efSearch = int(ef_search)
        if self.size:
            self._index.add(data)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, similarities)``, each ``(n_queries, k')`` with ``k' = min(k, size)``, most similar
        first; an id is ``-1`` where the graph search found fewer than ``k'`` rows."""
        k = min(int(k), self.size)
        if k == 0 or queries.shape[0] == 0:
            return np.zeros((queries.shape[0], 0), dtype=np.int64), np.zeros((queries.shape[0], 0), dtype=np.float32)
        sims, ids = self._index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        return ids, sims
