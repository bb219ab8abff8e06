"""The result store's ``progress.json``: what a run has stored so far, as the API reports it."""

from __future__ import annotations

import json

import pandas as pd

from contamray.pipeline.plan import Cell
from contamray.pipeline.store import PROGRESS_FILE, ResultStore
from contamray.serve.jobs import read_progress


def test_progress_counts_scored_and_done_cells_and_says_when_finished(tmp_path):
    cells = [Cell("m", "b", f"method{i}", "closed") for i in range(3)]
    hashes = [f"h{i}" for i in range(3)]
    earlier = ResultStore(tmp_path / "old", cells_root=str(tmp_path / "cells"))
    earlier.put(cells[0], hashes[0], pd.DataFrame({"record_id": ["a"]}), {"decision": "clean"})  # a reused cell
    store = ResultStore(tmp_path / "run", cells_root=str(tmp_path / "cells"))
    assert read_progress(str(tmp_path / "run")) is None  # nothing written before the run tracks its cells
    store.track(hashes)
    assert read_progress(str(tmp_path / "run")) == {
        "status": "running", "cells_total": 3, "cells_scored": 1, "cells_done": 1,
        "updated": read_progress(str(tmp_path / "run"))["updated"],
    }  # fmt: skip
    store.put_examples(cells[1], hashes[1], pd.DataFrame({"record_id": ["a"]}))
    got = read_progress(str(tmp_path / "run"))
    assert (got["cells_scored"], got["cells_done"]) == (2, 1)
    store.put_verdict(cells[1], hashes[1], {"decision": "clean"})
    store.put(cells[2], hashes[2], pd.DataFrame({"record_id": ["a"]}), {"decision": "clean"})
    store.finish()
    got = json.loads((tmp_path / "run" / PROGRESS_FILE).read_text())
    assert (got["status"], got["cells_scored"], got["cells_done"], got["cells_total"]) == ("finished", 3, 3, 3)


def _cell(tmp_path, i: int = 0) -> tuple[ResultStore, Cell, str]:
    return ResultStore(tmp_path / "run", cells_root=str(tmp_path / "cells")), Cell("m", "b", f"x{i}", "closed"), f"h{i}"


def test_a_changed_or_cut_examples_table_is_not_reused(tmp_path, caplog):
    store, cell, h = _cell(tmp_path)
    store.put(cell, h, pd.DataFrame({"record_id": list("abcdef"), "score": range(6)}), {"decision": "clean"})
    fresh = ResultStore(tmp_path / "run", cells_root=str(tmp_path / "cells"))  # a re-run reads it back
    assert fresh.has(h) and fresh.has_examples(h)
    table = tmp_path / "cells" / h / "examples.parquet"
    table.write_bytes(table.read_bytes()[:-40])  # cut short (a store without atomic renames, a full disk)
    again = ResultStore(tmp_path / "run", cells_root=str(tmp_path / "cells"))
    with caplog.at_level("WARNING"):
        assert not again.has_examples(h) and not again.has(h)
    assert "does not match its checksum" in caplog.text
    # scoring it again replaces it; a verdict of the old examples does not count for the new ones
    again.put_examples(cell, h, pd.DataFrame({"record_id": ["a"], "score": [1.0]}))
    assert again.has_examples(h) and not again.has(h)
    assert not ResultStore(tmp_path / "run", cells_root=str(tmp_path / "cells")).has(h)


KILLED_WRITER = """
import sys, time
import fsspec.implementations.local as local
import numpy as np, pandas as pd
from contamray.pipeline.plan import Cell
from contamray.pipeline.store import ResultStore

# a slow disk: the store's own write protocol, each write in 1 MB pieces with a pause between them
original = local.LocalFileOpener.write
def slow_write(self, data):
    for start in range(0, len(data), 1 << 20):
        original(self, data[start:start + (1 << 20)])
        time.sleep(0.05)
    return len(data)
local.LocalFileOpener.write = slow_write
store = ResultStore(sys.argv[1] + "/run", cells_root=sys.argv[1] + "/cells")
blob = np.random.default_rng(0).bytes(40 << 20)  # 40 MB that do not compress: about 2 s of writing
frame = pd.DataFrame({"record_id": ["a"], "blob": [blob]})
print("writing", flush=True)
store.put(Cell("m", "b", "x0", "closed"), "h0", frame, {"decision": "clean"})
print("done", flush=True)
"""


def test_a_write_killed_midway_leaves_no_cell_a_rerun_would_reuse(tmp_path):
    """The writer is SIGKILLed while the table's bytes are going to disk (its temporary file exists):
    nothing of the cell is reused by the next run, which scores it again."""
    import os
    import signal
    import subprocess
    import sys
    import time

    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "writing"
    folder = tmp_path / "cells" / "h0"
    deadline = time.monotonic() + 60
    while not (folder.is_dir() and any(".tmp-" in p.name for p in folder.iterdir())):
        assert time.monotonic() < deadline and child.poll() is None, "the write never started"
        time.sleep(0.01)
    time.sleep(0.3)  # some pieces written, most not
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert not (folder / "examples.parquet").exists()  # only the temporary file, never the table's name
    store = ResultStore(tmp_path / "run", cells_root=str(tmp_path / "cells"))
    assert not store.has_examples("h0") and not store.has("h0")
