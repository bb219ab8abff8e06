"""Corpus readers: jsonl / parquet / text files, local or remote, as ``doc_id`` + ``text`` rows."""

from contamray.corpus.readers import (
    ERROR_MODES,
    FORMATS,
    TEXT_MODES,
    detect_format,
    iter_documents,
    read_corpus,
    resolve_paths,
)

__all__ = [
    "ERROR_MODES",
    "FORMATS",
    "TEXT_MODES",
    "detect_format",
    "iter_documents",
    "read_corpus",
    "resolve_paths",
]
