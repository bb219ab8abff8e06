"""Answered batches kept as they come back, so a stage that is interrupted is not computed again.

A stage's requests go to a model in batches decided by the requests alone (``engine_pool.batched``: a forward
pass's last bits depend on its batch, so a config always sends the same batches), and a batch's answers are a
function of its requests and of the model. Each batch a model answers with no failed request is written here at
once, under what decides the model's answers (``hosting.answers_key``: its engine spec, a local checkpoint's
files, the device and threads of a replica, the results version - not how many replicas) and a digest of the
batch's requests, as the replica returned it. A run that stops mid-stage - Ctrl-C, a killed driver, a lost node -
keeps those batches; its re-run finds them and sends only the others, and ends with the bytes an uninterrupted run
gives. A batch with a failed request is not kept: the re-run asks it again.

The batches are a run's scratch, the cells its record: a run that ends with every cell of its plan stored removes
them all (``clear``; runs sharing a cells root through ``run.cells_uri`` lose at worst the reuse of batches another
one kept, never a result). Layout: ``<cells root>/answers/<answers key>/<digest>.json`` (any fsspec URI, as the
cells).
"""

from __future__ import annotations

import hashlib
import json

import fsspec

from contamray.engines.wire import Request
from contamray.pipeline.store import StoreWriteError, write_atomic


def batch_digest(batch: list[tuple[str, Request]]) -> str:
    """The digest of a batch's requests (in order; the cells asking them do not change the answers)."""
    h = hashlib.sha256()
    for _, request in batch:
        h.update(json.dumps(request.to_row(), sort_keys=True).encode())
        h.update(b"\n")
    return h.hexdigest()[:32]


class AnswerJournal:
    """The answered batches under ``root`` (``<cells root>/answers``), read and written by a run's stages."""

    def __init__(self, root: str) -> None:
        self.root = str(root).rstrip("/")
        self.fs, self._path = fsspec.core.url_to_fs(self.root)

    def _file(self, model: str, digest: str) -> str:
        return f"{self._path}/{model}/{digest}.json"

    def digests(self, model: str) -> set[str]:
        """The digests of the batches kept for ``model`` (one listing: a stage looks up its batches in it)."""
        try:
            names = self.fs.ls(f"{self._path}/{model}", detail=False)
        except OSError:  # none kept for it
            return set()
        return {str(n).rsplit("/", 1)[-1][: -len(".json")] for n in names if str(n).endswith(".json")}

    def get(self, model: str, digest: str, size: int) -> list[str] | None:
        """The output rows ``model`` (``hosting.answers_key``) gave the batch of ``digest`` (``size`` requests), or
        None when none are kept (or the file is not a whole answer: the batch is then asked again)."""
        path = self._file(model, digest)
        try:
            with self.fs.open(path, "rb") as fh:
                rows = json.loads(fh.read())["outputs"]
        except (OSError, ValueError, KeyError, TypeError):  # none kept, or not a whole answer
            return None
        if not isinstance(rows, list) or len(rows) != size:
            return None
        return [str(r) for r in rows]

    def put(self, model: str, digest: str, rows: list[str]) -> None:
        """Keep ``model``'s output rows for the batch of ``digest``, written whole or not at all. A store that
        cannot be written loses only the reuse: the run goes on."""
        try:
            write_atomic(self.fs, self._file(model, digest), json.dumps({"outputs": rows}).encode())
        except StoreWriteError:
            pass

    def clear(self) -> None:
        """Remove every kept batch (the run's cells are all stored)."""
        try:
            if self.fs.exists(self._path):
                self.fs.rm(self._path, recursive=True)
        except OSError:  # left behind: the next run that ends clears them
            pass

    def count(self) -> int:
        """The batches kept under the root (every model)."""
        try:
            return len(self.fs.glob(f"{self._path}/*/*.json"))
        except OSError:
            return 0

