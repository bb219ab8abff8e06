"""A cheap content fingerprint of a corpus, so a finished open-data cell is reused only for the same corpus.

The config names a corpus by its paths (``/data/pile/*.jsonl.gz``); the files behind them can
change between runs (a shard added to the directory, a file re-exported). Hashing the contents
would mean reading the whole corpus before deciding that nothing needs reading, so the fingerprint
is the file listing instead: every resolved file with its size and modification time, as the
filesystem reports them (one ``list``/``stat`` per file, also on object stores). That is what
``make`` and ``rsync`` trust; a file rewritten with the same size within the same mtime tick goes
unnoticed, and ``--force`` (``run.force=true``) recomputes regardless.

Hub datasets are named by their URI; one without ``revision=`` can change upstream unseen, so the
fingerprint says so (``unpinned``) and pinning a revision is how to make the cache trustworthy. A
planted corpus is rebuilt from the config and the benchmark rows every run, so its fingerprint is
those rows' digests (the config is already part of the cell hash).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import pyarrow.fs as pafs

from contamray.corpus.readers import parse_hub_uri, resolve_paths, split_hub_uris


def file_listing(paths: Any) -> list[tuple[str, int, int]]:
    """``(path, size, mtime_ns)`` of every file ``paths`` resolves to; hub URIs as ``(uri, -1, -1)``."""
    hubs, files = split_hub_uris(paths)
    listing = []
    for uri in hubs:
        src = parse_hub_uri(uri)
        listing.append((f"{uri}#{src.revision or 'unpinned'}", -1, -1))
    if files:
        resolved = resolve_paths(files)
        for info in resolved.filesystem.get_file_info(resolved.paths):
            if info.type != pafs.FileType.File:
                raise FileNotFoundError(f"corpus: {resolved.display(info.path)!r} disappeared while listing")
            mtime = info.mtime_ns if info.mtime_ns is not None else -1
            listing.append((resolved.display(info.path), int(info.size or 0), int(mtime)))
    return listing


def corpus_fingerprint(corpus: Mapping[str, Any], row_digests: Mapping[str, str]) -> str:
    """A short digest of what the corpus ``corpus`` (the plan's ``corpus`` config) holds right now."""
    kind = corpus.get("kind", "none")
    if kind == "none":
        return ""
    if kind == "planted":
        content: Any = sorted(row_digests.items())
    else:
        paths = corpus.get("paths")
        if not paths or paths == "???":
            return ""  # the scan itself reports the missing corpus.paths
        content = file_listing([paths] if isinstance(paths, str) else list(paths))
    blob = json.dumps({"kind": kind, "content": content}, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
