"""Files a run makes for its workers - injected checkpoints, a planted corpus - where every node can read them.

An injected model is fine-tuned by a Ray task into the cache of the node it ran on (the node the model's
resources chose, ``contamray.pipeline.injections``), and the driver builds a planted corpus in the run's
folder: both on one node's disk, while Serve replicas and corpus read tasks may run on any node. With an
artifacts root (``run.artifacts_uri``: a local path on shared storage or any fsspec URI; default
``<cells URI>/artifacts`` when the cells go to a URI, as under ``run.output_root=s3://...``) the node that
holds them publishes them there (``publish_dir``) and workers read them from there: corpus readers read URIs
directly, and an engine whose model ``source`` is a URI fetches the checkpoint once per node into
``$CONTAMRAY_CACHE/artifacts/`` (``fetch_dir``, called by ``engines.models.resolve_model_path``).

A published folder is complete when its ``_COMPLETE`` marker exists: it is written last, so a publish cut
short is published again and a fetch never takes a partial checkpoint. Content-addressed names (the
injection's cache key, the planted corpus' digest) make a published folder immutable: it is published once.

With no artifacts root, a run on a cluster of more than one node that needs such files refuses to start
(``check_artifacts``; a dry run prints it as a warning), naming the key to set.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import fsspec

log = logging.getLogger("contamray")

COMPLETE = "_COMPLETE"


def artifacts_root(artifacts_uri: str | None, cells_uri: str | None) -> str | None:
    """``run.artifacts_uri``, else ``<cells_uri>/artifacts`` when the cells go to a URI, else None (local run)."""
    if artifacts_uri:
        return str(artifacts_uri).rstrip("/")
    if cells_uri and "://" in str(cells_uri):
        return f"{str(cells_uri).rstrip('/')}/artifacts"
    return None


def publish_dir(local: str | Path, uri: str) -> str:
    """Copy the folder ``local`` to ``uri`` (once: a complete copy is kept); returns ``uri``."""
    fs, root = fsspec.core.url_to_fs(uri)
    if fs.exists(f"{root}/{COMPLETE}"):
        return uri
    local = Path(local)
    files = sorted(p for p in local.rglob("*") if p.is_file())
    log.info("publishing %s (%d files, %.1f MB) to %s", local, len(files), sum(p.stat().st_size for p in files) / 1e6,
             uri)  # fmt: skip
    for path in files:
        target = f"{root}/{path.relative_to(local).as_posix()}"
        fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        fs.put_file(str(path), target)
    with fs.open(f"{root}/{COMPLETE}", "wb") as fh:
        fh.write(b"ok\n")
    return uri


def fetch_dir(uri: str, where: str = "artifact") -> Path:
    """The folder published at ``uri``, as a local directory: fetched once per machine (and kept)."""
    base = os.environ.get("CONTAMRAY_CACHE")
    cache = (Path(base).expanduser() if base else Path("~/.cache/contamray").expanduser()) / "artifacts"
    local = cache / hashlib.sha256(uri.encode()).hexdigest()[:20]
    if (local / COMPLETE).is_file():
        return local
    fs, root = fsspec.core.url_to_fs(uri)
    if not fs.exists(f"{root}/{COMPLETE}"):
        raise FileNotFoundError(
            f"{where}: {uri} holds no complete published folder (no {COMPLETE} marker); the driver publishes it "
            "before the workers start - check run.artifacts_uri is readable from every node"
        )
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{local.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (local / COMPLETE).is_file():  # another replica on this machine fetched it meanwhile
            return local
        tmp = Path(tempfile.mkdtemp(prefix=f".{local.name}.tmp-", dir=cache))
        try:
            for remote in sorted(fs.find(root)):
                rel = remote[len(root.rstrip("/")) + 1 :]
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(remote, str(tmp / rel))
            shutil.rmtree(local, ignore_errors=True)
            tmp.rename(local)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("fetched %s into %s", uri, local)
    return local


def content_digest(folder: str | Path) -> str:
    """A short digest of a folder's files (names and bytes): the published name of a planted corpus."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def needs_artifacts(plan: Any) -> list[str]:
    """What of ``plan`` its workers read from one node's disk unless published: injected models (the node of
    their fine-tune), a planted corpus (the driver's)."""
    needs = [f"models.{name}.inject" for name, model in sorted(plan.models.items()) if model.inject]
    if plan.corpus.get("kind") == "planted" and any(c.family == "open" for c in plan.cells):
        needs.append("corpus=planted")
    return needs


def check_artifacts(plan: Any, root: str | None) -> str | None:
    """Why a cluster of more than one node cannot run ``plan`` (its workers would read files only the driver's
    node has), or None."""
    import ray

    needs = needs_artifacts(plan)
    if root or not needs:
        return None
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    if nodes <= 1:
        return None
    return (
        f"{', '.join(needs)}: these are written to one node's disk (a planted corpus to the driver's, an injected "
        f"model to its fine-tune's), and this cluster has {nodes} nodes whose workers must read them: set "
        "run.artifacts_uri to shared storage or a URI every node can read (s3://..., gs://...; "
        "run.output_root=<URI> sets it too)"
    )
