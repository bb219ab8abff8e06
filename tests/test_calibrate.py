"""``contamray calibrate``'s pieces without a model: slices, held-out blocks, the table (issue #13)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from contamray.records import Record
from contamray.validate.calibrate import END, START, heldouts, render, slices, update_readme


def _rows(n: int) -> list[Record]:
    return [Record(f"b#{i}", "b/default/test", f"q{i}", "a", "", "question_answering", order=i) for i in range(n)]


def test_slices_are_contiguous_spread_and_named() -> None:
    rows = _rows(100)
    top = slices(rows, 3, 10)
    assert [[r.order for r in s] for s in top] == [list(range(0, 10)), list(range(10, 20)), list(range(20, 30))]
    spread = slices(rows, 4, 10, spread=True)
    assert [s[0].order for s in spread] == [0, 25, 50, 75] and all(len(s) == 10 for s in spread)
    assert spread[1][0].partition == "b/default/test:rows25-34"
    assert len(slices(rows, 20, 10)) == 10  # no partial slice


def test_heldout_blocks_are_disjoint_outside_the_slices_and_seeded() -> None:
    rows = _rows(100)
    parts = slices(rows, 4, 10, spread=True)
    taken = {r.id for p in parts for r in p}
    blocks = heldouts(rows, taken, 4, 10, seed=0)
    ids = [r.id for b in blocks for r in b]
    assert len(blocks) == 4 and len(ids) == len(set(ids)) == 40 and not set(ids) & taken
    assert [r.id for r in heldouts(rows, taken, 4, 10, seed=0)[0]] == [r.id for r in blocks[0]]
    assert len(heldouts(rows, taken, 7, 10, seed=0)) == 6  # 60 rows left: six blocks of 10


def test_render_counts_flagged_decided_and_inconclusive(tmp_path: Path) -> None:
    table = pd.DataFrame({
        "benchmark": ["arc"] * 4 + ["mmlu"] * 2, "method": ["min_k"] * 6,
        "decision": ["contaminated", "clean", "clean", "inconclusive", "clean", "clean"],
    })  # fmt: skip
    markdown = render(table)
    assert "| `min_k` | 1 / 3 (+1 inconclusive) | 0 / 2 |" in markdown
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{START}\nold\n{END}\nrest\n")
    update_readme(readme, markdown)
    text = readme.read_text()
    assert "old" not in text and "1 / 3 (+1 inconclusive)" in text and text.endswith(f"{END}\nrest\n")
    readme.write_text("no markers")
    with pytest.raises(ValueError, match="no calibration section"):
        update_readme(readme, markdown)
