"""Corpus readers: jsonl / parquet / text files, local or remote, and hub datasets streamed, as
``doc_id`` + ``text`` rows."""

from contamray.corpus.readers import (
    ERROR_MODES,
    FORMATS,
    HUB_SCHEME,
    TEXT_MODES,
    HubSource,
    detect_format,
    is_hub_uri,
    iter_documents,
    parse_hub_uri,
    read_corpus,
    read_listed_file,
    resolve_paths,
)

__all__ = [
    "ERROR_MODES",
    "FORMATS",
    "HUB_SCHEME",
    "TEXT_MODES",
    "HubSource",
    "detect_format",
    "is_hub_uri",
    "iter_documents",
    "parse_hub_uri",
    "read_corpus",
    "read_listed_file",
    "resolve_paths",
]
