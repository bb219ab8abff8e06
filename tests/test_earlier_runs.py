"""A run reuses the cells an earlier run of the same name finished (``run.reuse_earlier``, default true).

Runs land in ``<root>/<run.name>/<time>/`` (a sweep's jobs in ``<root>/<name>/<time>/<job>/``), each with its own
``cells/``; a cell's hash is everything that decides its result (config, benchmark rows, corpus files, a local
checkpoint's files), so a cell an earlier run of the name finished is this run's result too. The run copies it into
its own folder (which stays whole: the report, the tables, a later re-run read only it) - checked there as a cell of
its own is (examples matching their checksum, a verdict reduced from them): a cut or changed earlier cell is computed
again. Known answers: which earlier folders are looked at, newest first (none for a folder outside the layout, for a
shared ``run.cells_uri`` or with the key false), and which cells are copied. A real second run reusing a first's
cells, as a Ray Job in the default layout: ``test_jobs.py::test_a_bare_ray_job_writes_outside_rays_working_dir...``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from contamray.output_root import earlier_cells
from contamray.pipeline.plan import Cell
from contamray.pipeline.store import ResultStore


def _run_cfg(root: Path | str, **more) -> object:
    return OmegaConf.create({"name": "canary", "output_root": str(root), "cells_uri": None, "reuse_earlier": True,
                             **more})  # fmt: skip


def _finished(cells_root: Path, cell_hash: str, method: str = "x", rows: int = 3) -> None:
    store = ResultStore(cells_root.parent, cells_root=str(cells_root))
    table = pd.DataFrame({"record_id": [f"r{i}" for i in range(rows)], "score": range(rows)})
    store.put(Cell("m", "b", method, "closed"), cell_hash, table, {"decision": "clean", "p_value": 0.5})


def test_earlier_runs_of_the_name_newest_first_and_none_outside_the_layout(tmp_path):
    family = tmp_path / "canary"
    for when in ("2026-12-01_10-00-00", "2026-12-02_09-00-00"):
        (family / when / "cells").mkdir(parents=True)
    (family / "2026-12-02_12-00-00").mkdir()  # a run stopped before it stored anything: no cells folder
    (tmp_path / "other" / "2026-12-02_09-00-00" / "cells").mkdir(parents=True)  # another run name
    here = family / "2026-12-03_08-00-00"
    (here / "cells").mkdir(parents=True)
    assert earlier_cells(_run_cfg(tmp_path), here, None) == [
        str(family / "2026-12-02_09-00-00" / "cells"), str(family / "2026-12-01_10-00-00" / "cells")]  # fmt: skip
    assert earlier_cells(_run_cfg(tmp_path, reuse_earlier=False), here, None) == []
    assert earlier_cells(_run_cfg(tmp_path, cells_uri=str(tmp_path / "shared")), here, None) == []  # one store already
    assert earlier_cells(_run_cfg(tmp_path), tmp_path / "elsewhere" / "run", None) == []  # an explicit hydra.run.dir
    # a sweep's job looks through the job folders of the name's sweeps
    (family / "2026-12-01_10-00-00" / "0" / "cells").mkdir(parents=True)
    (family / "2026-12-01_10-00-00" / "1" / "cells").mkdir(parents=True)
    job = family / "2026-12-03_08-00-00" / "1"
    sweep = family / "2026-12-01_10-00-00"
    assert earlier_cells(_run_cfg(tmp_path), job, None) == [str(sweep / "1" / "cells"), str(sweep / "0" / "cells")]


def test_on_a_uri_root_the_earlier_runs_are_the_uris(tmp_path, monkeypatch):
    bucket = tmp_path / "bucket"
    (bucket / "canary" / "2026-12-01_10-00-00" / "cells").mkdir(parents=True)
    monkeypatch.setattr("contamray.output_root.STAGING", str(tmp_path / "staging"))
    from contamray.output_root import destination, local_root

    root = f"file://{bucket}"
    here = Path(local_root(root)) / "canary" / "2026-12-03_08-00-00"  # the run's local staging folder
    remote = destination(root, here)
    assert remote == f"{root}/canary/2026-12-03_08-00-00"
    assert earlier_cells(_run_cfg(root), here, remote) == [f"file://{bucket}/canary/2026-12-01_10-00-00/cells"]


def test_finished_earlier_cells_are_copied_in_and_cut_or_unfinished_ones_are_not(tmp_path, caplog):
    newer, older = tmp_path / "t2" / "cells", tmp_path / "t1" / "cells"
    _finished(older, "a", rows=3)
    _finished(older, "b", rows=3)
    _finished(newer, "b", rows=5)  # the newest earlier run wins
    _finished(older, "c")
    table = older / "c" / "examples.parquet"
    table.write_bytes(table.read_bytes()[:-40])  # cut short: not a result
    scored = ResultStore(tmp_path / "t1", cells_root=str(older))
    scored.put_examples(Cell("m", "b", "x", "closed"), "d", pd.DataFrame({"record_id": ["r0"]}))  # not reduced
    store = ResultStore(tmp_path / "t3")
    _finished(tmp_path / "t3" / "cells", "e", rows=1)  # its own: kept as it is
    with caplog.at_level("WARNING"):
        adopted = store.adopt(["a", "b", "c", "d", "e", "f"], [str(newer), str(older)])
    assert adopted == {"b": str(newer), "a": str(older)}
    assert "cell c: examples.parquet does not match its checksum" in caplog.text
    assert len(store.load_examples("b")) == 5 and len(store.load_examples("a")) == 3
    assert len(store.load_examples("e")) == 1
    fresh = ResultStore(tmp_path / "t3")  # a later re-run of this folder finds them whole
    assert all(fresh.has(h) for h in "abe") and not any(fresh.has(h) for h in "cdf")
    assert not (tmp_path / "t3" / "cells" / "c").exists() and not (tmp_path / "t3" / "cells" / "d").exists()
