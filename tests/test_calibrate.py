"""``contamray calibrate``'s pieces without a model: slices, held-out blocks, the table (issue #13)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest

from contamray.records import Record
from contamray.validate.calibrate import (
    END,
    START,
    benchmark_rows,
    check_heldouts,
    check_overrides,
    heldouts,
    parse_overrides,
    render,
    slices,
    update_readme,
)


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
    blocks = heldouts(rows, parts, seed=0)
    ids = [r.id for b in blocks for r in b]
    assert len(blocks) == 4 and len(ids) == len(set(ids)) == 40 and not set(ids) & taken
    assert [r.id for r in heldouts(rows, parts, seed=0)[0]] == [r.id for r in blocks[0]]
    assert len(heldouts(rows, slices(rows, 7, 10, spread=True), seed=0)) == 3  # 30 rows left: three blocks of 10


def test_too_many_slices_for_their_heldouts_are_refused_naming_the_benchmark_and_the_fix() -> None:
    """25 slices of 20 rows fill a 500-row split: no rows are left for the held-out blocks the membership scores
    compare each slice with. Refused before any model loads (it had tested nothing and crashed on the empty
    table), naming the benchmark, the methods and the largest --slices that fits; a method with no held-out (the
    sharded test) is not concerned."""
    rows = {"synthetic_facts": _rows(500)}
    with pytest.raises(ValueError) as err:
        check_heldouts(rows, ["sharded_likelihood", "min_k", "zlib_ratio"], n_slices=25, size=20)
    message = str(err.value)
    assert message.startswith("synthetic_facts: its split has 500 rows")
    assert "a block of its own for min_k, zlib_ratio;" in message
    assert "use --slices 12 or fewer" in message and "sharded_likelihood" not in message
    check_heldouts(rows, ["sharded_likelihood"], n_slices=25, size=20)  # no held-out: every slice tested
    check_heldouts(rows, ["min_k", "zlib_ratio"], n_slices=12, size=20)  # 240 rows in slices, 260 left
    with pytest.raises(ValueError, match="use --slices 12 or fewer"):
        check_heldouts(rows, ["min_k"], n_slices=13, size=20)


def test_a_benchmark_entry_may_name_its_config() -> None:
    """``--benchmarks synthetic_facts:set4`` calibrates on another draw of the generator (the default config
    without one); a config the benchmark lacks is a ValueError naming the choices (calibrate exits 2 with it)."""
    rows = benchmark_rows("synthetic_facts:set4", None)
    assert len(rows) == 500 and rows[0].id.startswith("synthetic_facts/set4/test#")
    assert benchmark_rows("synthetic_facts", None)[0].id.startswith("synthetic_facts/default/test#")
    with pytest.raises(ValueError, match="no config 'set99'; use one of: default, set1"):
        benchmark_rows("synthetic_facts:set99", None)


def test_a_slice_of_one_topic_takes_its_heldout_from_that_topic() -> None:
    """MMLU-like: 4 subjects of 25 rows in split order. A slice within one subject is compared with rows of that
    subject (one subject against many could not be decided); a slice across two subjects, or a subject with too
    few rows left, with a random sample of the rest."""
    rows = [dataclasses.replace(r, meta={"subject": f"s{r.order // 25}"}) for r in _rows(100)]
    parts = [rows[0:10], rows[20:30], rows[50:60], rows[75:90]]
    blocks = heldouts(rows, parts, seed=0)
    subjects = [{r.meta["subject"] for r in b} for b in blocks]
    assert subjects[0] == {"s0"} and subjects[2] == {"s2"}  # 15 rows of s0 and of s2 left: enough
    assert len(subjects[1]) > 1  # the slice spans s0 and s1: a random sample of the rest
    assert len(subjects[3]) > 1  # s3 has 10 rows left, the slice 15
    ids = [r.id for b in blocks for r in b]
    assert len(ids) == len(set(ids)) == 45 and not set(ids) & {r.id for p in parts for r in p}


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


def test_set_overrides_a_config_field_and_labels_the_row() -> None:
    """``--set KEY=VALUE``: values read as YAML; a key no chosen method has, or a value its config refuses, is
    refused before any model loads; the table's row names the setting."""
    assert parse_overrides(["chat=both", "units=rows", "k_fractions=[0.2]"]) == {
        "chat": "both", "units": "rows", "k_fractions": [0.2]
    }
    with pytest.raises(ValueError, match=r"--set 'chat': expected KEY=VALUE"):
        parse_overrides(["chat"])
    check_overrides(["min_k", "sharded_likelihood"], {"chat": "both"})  # the sharded test has no chat: not refused
    with pytest.raises(ValueError, match=r"--set nope: no chosen method \(min_k\) has such a config field"):
        check_overrides(["min_k"], {"nope": 1})
    with pytest.raises(ValueError, match=r"methods\.min_k\.chat must be false .* got 'maybe'"):
        check_overrides(["min_k"], {"chat": "maybe"})
    table = pd.DataFrame({
        "benchmark": ["arc"] * 3, "method": ["min_k"] * 3, "settings": ["", "chat=both", "chat=both"],
        "decision": ["clean", "contaminated", "clean"],
    })  # fmt: skip
    markdown = render(table)
    assert "| `min_k` | 0 / 1 |" in markdown and "| `min_k` (chat=both) | 1 / 2 |" in markdown


def test_each_method_is_calibrated_as_its_preset_configures_a_run() -> None:
    """The preset's values (``conf/method/<name>.yaml``: both prompt forms for the membership scores and the held-out
    accuracy gap, where the Config's own default is the papers' raw form), then the cheap settings, the seed and the
    overrides; a preset's interpolation (``seed: ${run.seed}``) is a composed run's and is left out."""
    from contamray.methods.base import get_method
    from contamray.presets import method_params, preset
    from contamray.validate.calibrate import _config

    for name in ("min_k", "heldout_accuracy"):
        method = get_method(name)
        assert method.make_config({}).chat is False  # a library caller's default
        cfg, own = _config(method, name, {}, seed=3)
        assert (cfg.chat, cfg.reference, own) == ("both", "heldout", {})
        assert _config(method, name, {"chat": False}, seed=3)[0].chat is False
    sharded = get_method("sharded_likelihood")
    assert "seed" not in method_params(preset("method", "sharded_likelihood"), sharded.Config)
    cfg, _ = _config(sharded, "sharded_likelihood", {}, seed=3)
    assert (cfg.seed, cfg.num_shards, cfg.permutations_per_shard) == (3, 5, 10)


@pytest.mark.slow
def test_calibrate_decides_each_slice_against_its_own_heldout_with_the_embedded_model(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole loop on a generated benchmark the model never saw: 2 slices of 12 rows spread over 70 rows of
    ``synthetic_facts``, each with a held-out block of 12 of the 46 rows left, so Min-K% and zlib decide both
    slices (these rows are independent draws: every row is a unit; a third slice would leave rows for two blocks
    only, and is refused: ``check_heldouts``); one scoring pass serves both; a progress line counts the 4 slices.
    Each method runs as its preset configures it (the membership scores in both prompt forms: each example scored
    raw and in the chat form); ``overrides``
    (``--set chat=false``) reach the config: the rows are labelled, and the raw form's scores are reused."""
    from contamray.benchmarks import load_records
    from contamray.engines import resolve_model_path
    from contamray.engines.hf import HFEngine
    from contamray.validate.calibrate import SharedEngines, calibrate

    monkeypatch.setenv("CONTAMRAY_PROGRESS_SECONDS", "0")
    records = load_records("synthetic_facts", config="set2", split="test").records[:70]
    engines = SharedEngines({"target": HFEngine(resolve_model_path("smollm2-135m"), dtype="float32", batch_size=16)})
    with caplog.at_level("INFO", logger="contamray"):
        table = calibrate({"synthetic_facts": records}, engines, ["min_k", "zlib_ratio"], n_slices=2, size=12)
    assert list(table["method"]) == ["min_k"] * 2 + ["zlib_ratio"] * 2 and list(table["slice"]) == [0, 1] * 2
    assert set(table["decision"]) <= {"clean", "contaminated"}, table
    # two slices and their two held-out blocks, in both prompt forms (the presets' chat: both), scored once for both
    # methods; each row's chat form asked in one request: the engine says where its reply starts
    assert len(engines.cache) == 4 * 12 * 2
    chat_outputs = [out for (_, key), out in engines.cache.items() if key[3]]  # key[3]: chat
    assert len(chat_outputs) == 4 * 12 and all(out.prompt_tokens > 1 for out in chat_outputs)
    assert any("calibrate: done 4/4 slices" in r.getMessage() for r in caplog.records), caplog.text
    raw = calibrate({"synthetic_facts": records}, engines, ["min_k"], n_slices=2, size=12, overrides={"chat": False})
    assert list(raw["settings"]) == ["chat=false"] * 2 and set(raw["decision"]) <= {"clean", "contaminated"}, raw
    assert len(engines.cache) == 4 * 12 * 2  # the raw form's scores reused
