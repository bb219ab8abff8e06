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
