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


# ----------------------------------------------------------------------------- synthetic_structured


def _differing_words(a: str, b: str) -> list[tuple[str, str]]:
    wa, wb = a.split(), b.split()
    return [(x, y) for x, y in zip(wa, wb) if x != y] if len(wa) == len(wb) else [("<length>", "<length>")]


def test_structured_registered_deterministic_and_loads(tmp_path) -> None:
    from contamray.benchmarks import synthetic_structured as ss

    assert "synthetic_structured" in adapter_names()
    adapter = get_adapter("synthetic_structured")
    assert adapter.configs == CONFIGS and adapter.splits == SPLITS and adapter.default_split == "test"
    assert ss.generate_rows("set2", "train") == ss.generate_rows("set2", "train")
    result = load_records("synthetic_structured", n=40, sample="first", mirror_dir=tmp_path)
    assert result.source == "generated:synthetic_structured/default/test" and not result.failures
    assert result.total_rows == ss.ROWS_PER_SPLIT
    assert [r.order for r in result.records] == list(range(40))
    for r in result.records:
        assert r.id == f"synthetic_structured/default/test#{r.order}" and r.answer in r.label
        assert r.meta["group"] and r.meta["entity"]


def test_structured_partitions_are_disjoint_draws() -> None:
    from contamray.benchmarks import synthetic_structured as ss

    questions, entities = {}, {}
    for config in CONFIGS[:3]:
        for split in SPLITS:
            rows = ss.generate_rows(config, split)
            assert len(rows) == ss.ROWS_PER_SPLIT
            questions[(config, split)] = {r["question"] for r in rows}
            by_entity: dict[str, set[int]] = {}
            for r in rows:
                by_entity.setdefault(r["entity"].lower(), set()).add(r["run"])
            assert all(len(runs) == 1 for runs in by_entity.values())  # an entity lives in one block only
            entities[(config, split)] = set(by_entity)
    keys = list(questions)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            assert not questions[a] & questions[b], (a, b)


def test_structured_order_has_declared_twins_and_undeclared_runs() -> None:
    from contamray.benchmarks import synthetic_structured as ss

    records = load_records("synthetic_structured", config="set3", split="validation").records
    raw = ss.generate_rows("set3", "validation")
    shares = {k: sum(r["structure"] == k for r in raw) / len(raw) for k in ("twin", "run", "single")}
    assert 0.1 < shares["twin"] < 0.35 and 0.5 < shares["run"] < 0.85 and 0.03 < shares["single"] < 0.25
    twins = 0
    for a, b, ra, rb in zip(records, records[1:], raw, raw[1:]):
        same_group = a.meta["group"] == b.meta["group"]
        assert same_group == (ra["structure"] == "twin" and ra["run"] == rb["run"])  # groups = twin pairs only
        if same_group:
            twins += 1
            assert a.meta["twin"] == b.id and b.meta["twin"] == a.id and a.meta["group"] == a.id
            assert len(_differing_words(a.input, b.input)) == 1  # one word apart, and the answers differ
            assert a.answer != b.answer
        elif ra["run"] == rb["run"]:  # a topical run: same entity, different attributes, nothing declared
            assert ra["structure"] == "run" and a.meta["entity"] == b.meta["entity"]
            assert a.meta["attribute"] != b.meta["attribute"]
    assert twins == shares["twin"] * len(raw) / 2
    runs = {}
    for r in raw:
        if r["structure"] == "run":
            runs[r["run"]] = runs.get(r["run"], 0) + 1
    last = raw[-1]["run"]
    assert {v for k, v in runs.items() if k != last} == {3, 4, 5, 6}  # only the last block may be cut short


def test_structured_can_be_injected_in_canonical_order() -> None:
    from contamray.inject.spec import validate_inject_spec
    from contamray.inject.stream import build_stream

    records = load_records("synthetic_structured", n=12, sample="first").records
    spec = validate_inject_spec(
        {"partitions": [{"benchmark": "structured", "duplication": 2},
                        {"benchmark": "para", "form": "paraphrased"}]},
        "models.m.inject", {"structured", "para"},
    )  # fmt: skip
    stream = build_stream(spec, {"structured": records, "para": records}, [], seed=0)
    copies = [u for u in stream.units if u.benchmark == "structured"]
    assert len(copies) == 2 and all(u.record_ids == [r.id for r in records] for u in copies)
    assert records[4].input in copies[0].text and copies[0].text.index(records[4].input) < copies[0].text.index(
        records[5].input
    )  # the file keeps the structured canonical order
    assert all(stream.rows[r.id]["member"] for r in records)
    assert stream.partitions["para"]["form"] == "paraphrased" and stream.partitions["para"]["n_injected"] == 12
