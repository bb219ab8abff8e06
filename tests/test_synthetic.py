"""The generated synthetic_facts benchmark: deterministic, disjoint partitions, loadable with no data."""

from __future__ import annotations

import re

import pytest

from contamray.benchmarks import adapter_names, get_adapter, load_records
from contamray.benchmarks.synthetic import CONFIGS, ROWS_PER_SPLIT, SPLITS, generate_rows


def test_registered_and_loads_without_hub_or_mirror(tmp_path) -> None:
    assert "synthetic_facts" in adapter_names()
    adapter = get_adapter("synthetic_facts")
    assert adapter.generate is not None and adapter.default_split == "test"
    # an empty "mirror" directory is ignored: the rows are generated, nothing is read
    result = load_records("synthetic_facts", n=10, seed=3, mirror_dir=tmp_path)
    assert result.source == "generated:synthetic_facts/default/test"
    assert result.total_rows == ROWS_PER_SPLIT and len(result.records) == 10 and not result.failures
    orders = [r.order for r in result.records]
    assert orders == sorted(orders)  # canonical order, as for hub benchmarks
    for r in result.records:
        assert r.partition == "synthetic_facts/default/test"
        assert r.task == "question_answering"
        assert r.id == f"synthetic_facts/default/test#{r.order}"
        assert r.answer in r.label  # the answer sentence states the short answer
        assert r.input.endswith("?") and r.label.endswith(".")
        assert r.verbalized == f"{r.input} {r.label}"
        assert r.meta["kind"] and r.meta["attribute"] and r.meta["entity"]


def test_deterministic_and_seed_only_samples() -> None:
    assert generate_rows("default", "test") == generate_rows("default", "test")
    a = load_records("synthetic_facts", n=15, seed=0).records
    b = load_records("synthetic_facts", n=15, seed=0).records
    c = load_records("synthetic_facts", n=15, seed=1).records
    assert [r.id for r in a] == [r.id for r in b]
    assert [r.id for r in a] != [r.id for r in c]
    full = {r["id"]: r for r in generate_rows("default", "test")}
    for r in c:  # a different sample of the same rows
        assert full[r.id]["question"] == r.input


def test_partitions_are_disjoint_draws() -> None:
    questions = {}
    for config in CONFIGS[:3]:
        for split in SPLITS:
            rows = generate_rows(config, split)
            assert len({r["entity"].lower() for r in rows}) == len(rows)  # no entity twice in a partition
            questions[(config, split)] = {r["question"] for r in rows}
    keys = list(questions)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            assert not questions[a] & questions[b], (a, b)


def test_facts_are_well_formed() -> None:
    rows = generate_rows("set1", "validation")
    kinds = {r["attribute"] for r in rows}
    assert len(kinds) >= 8  # every fact kind is drawn
    for r in rows:
        name = r["entity"]
        assert name in r["question"] or name.lower() in r["question"]
        assert re.fullmatch(r"[A-Z][a-z]+( [A-Z][a-z]+)?", name)
        digits = re.findall(r"\d[\d,]*", r["answer"])
        for d in digits:
            assert d in r["answer_sentence"]


def test_unknown_config_or_split_names_choices() -> None:
    with pytest.raises(ValueError, match="no config 'nope'.*set1"):
        load_records("synthetic_facts", config="nope")
    with pytest.raises(ValueError, match="no split 'dev'.*validation"):
        load_records("synthetic_facts", split="dev")
