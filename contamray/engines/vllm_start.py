"""Why vLLM's engine did not start, in the error a run shows.

vLLM runs its engine core (and on more than one device its workers) in processes of their own. When one fails to
start - a checkpoint missing weights, CUDA out of memory, a context longer than the KV cache holds - that process
logs its own traceback on the output it shares with this one, and this process raises only ``RuntimeError: Engine
core initialization failed. See root cause above``. In a Ray Serve replica "above" is the replica's log files
(``worker-*.out`` / ``.err`` under the Ray session's logs, on whichever node ran it), so the run said only that.

``explained_start`` notes where this process's stdout and stderr files end before the engine starts; if the start
fails so, it reads what was written since and raises ``EngineStartError`` with the last error line that is not one
of vLLM's wrappers ("See root cause above", "See stack trace for root cause"): e.g. ``ValueError: Following weights
were not initialized from checkpoint: {'model.layers.29...'}``. Outputs that are not files (a terminal, a pipe) hold
nothing to read: the error is vLLM's, and the cause is on the screen above it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

START_FAILED = "Engine core initialization failed"
WRAPPERS = ("See root cause above", "See stack trace for root cause")
# an error line as vLLM's processes print it: "(Worker pid=12) ERROR 12-03 14:13:26 [file.py:953] ValueError: ...",
# or a traceback's last line, with or without the process prefix vLLM puts on its children's output
ERROR_LINE = re.compile(
    r"^(?:\([^)]*pid=\d+\)\s*)?(?:(?:ERROR|CRITICAL)\s+\S+\s+\S+\s+\[[^\]]*\]\s*)?"
    r"((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception): \S.*)$"
)
MAX_READ = 4 << 20  # bytes of each output read back (the newest, when more was written since the start)


class EngineStartError(RuntimeError):
    """vLLM's engine did not start; the message carries its own process's error."""


def output_files() -> list[str]:
    """The paths of this process's stdout and stderr, where they are regular files (a Ray worker's logs)."""
    files = []
    for fd in (1, 2):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # not Linux, or the fd is closed
            continue
        if os.path.isfile(path):
            files.append(path)
    return files


def cause(files: dict[str, int]) -> str | None:
    """The last error line written to ``files`` (path -> the size it had before the start) since then, vLLM's own
    wrappers left out; None when there is none."""
    found: list[str] = []
    for path, start in files.items():
        try:
            with open(path, "rb") as fh:
                end = fh.seek(0, os.SEEK_END)
                fh.seek(max(start, end - MAX_READ))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            continue
        for line in text.splitlines():
            match = ERROR_LINE.match(line.strip())
            if match and not any(wrapper in match.group(1) for wrapper in WRAPPERS):
                found.append(match.group(1).strip())
    return found[-1] if found else None


@contextmanager
def explained_start(where: str) -> Iterator[None]:
    """Start vLLM's engine inside this block: a start that fails with vLLM's "see root cause above" raises
    ``EngineStartError`` naming ``where`` (the model's config key) and the engine process's own error."""
    files = {}
    for path in output_files():
        try:
            files[path] = os.path.getsize(path)
        except OSError:
            continue
    try:
        yield
    except RuntimeError as err:
        found = cause(files) if START_FAILED in str(err) else None
        if found is None:
            raise
        raise EngineStartError(
            f"{where}: vLLM's engine did not start: {found} (its engine process's own error; the whole traceback is "
            f"in {' and '.join(files)})"
        ) from err
