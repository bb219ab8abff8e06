"""Order structure and the structure-aware sharded likelihood test (issue #7).

Known answers used here:
- Winogrande's twins are adjacent rows with the same (option1, option2) and opposite answers: counted
  here straight from the mirrored JSON lines, independently of the adapter;
- ARC-Challenge's test order has no structure an adjacent-pair check could find;
- planted near-duplicate neighbours (no declared group) are found and linked, and nothing else is;
- under ``permute: groups`` every shuffled order keeps every group whole and in its own order.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pandas as pd
import pytest

from contamray.benchmarks import load_records
from contamray.methods.base import Output, get_method
from contamray.methods.closed import sharded_likelihood as sl
from contamray.methods.closed.likelihood_text import serialise
from contamray.methods.closed.order_structure import RESIDUAL_ALPHA, STRUCTURE_ALPHA, diagnose
from contamray.records import Record

METHOD = get_method("sharded_likelihood")
WORDS = (
    "apple river stone cloud lamp violin desert pencil harbor tiger garden mirror rocket candle forest "
    "bottle planet wallet ladder castle"
).split()


def _texts(records: list[Record]) -> list[str]:
    return [serialise(r, ("input", "label"), "json") for r in records]


def _twin_pairs(rows: list[dict]) -> int:
    """Adjacent rows with the same options and opposite answers, paired greedily from the top."""
    pairs, i = 0, 0
    while i < len(rows) - 1:
        a, b = rows[i], rows[i + 1]
        if (a["option1"], a["option2"]) == (b["option1"], b["option2"]) and a["answer"] != b["answer"]:
            pairs += 1
            i += 2
        else:
            i += 1
    return pairs


def test_winogrande_twins_are_declared_groups_and_its_order_is_structured(mirror_dir: Path):
    records = load_records("winogrande", n=100, sample="first", mirror_dir=mirror_dir).records
    raw = [json.loads(line) for line in (mirror_dir / "allenai/winogrande/winogrande_xl/validation.jsonl").open()]
    structure = diagnose(records, _texts(records), seed=0)
    assert structure.declared_groups == _twin_pairs(raw[:100]) > 15
    assert structure.structured and structure.p_value < 1e-4
    assert structure.adjacent_similarity > 2 * structure.random_similarity
    assert len(structure.units) == 100 - structure.declared_groups - structure.detected_links
    assert "declared group" in structure.summary()
    assert f"<= {STRUCTURE_ALPHA:g}, structured)" in structure.summary()  # the diagnosis says its bar


def test_arc_order_has_no_structure(mirror_dir: Path):
    records = load_records("arc_challenge", n=100, sample="first", mirror_dir=mirror_dir).records
    structure = diagnose(records, _texts(records), seed=0)
    assert not structure.structured and structure.p_value > STRUCTURE_ALPHA
    assert structure.declared_groups == structure.detected_links == 0
    assert structure.units == [[i] for i in range(100)]
    assert f"> {STRUCTURE_ALPHA:g}, no structure found)" in structure.summary()


def _record(i: int, text: str) -> Record:
    return Record(id=f"r{i}", partition="bench/default/test", input=text, label=f"answer {i}", reference="",
                  task="question_answering", order=i)


def _planted(n_pairs: int, n_single: int) -> tuple[list[Record], set[int]]:
    """Distinct texts, with ``n_pairs`` adjacent near-duplicates planted (the second row of each pair)."""
    texts, seconds = [], set()
    for i in range(n_pairs + n_single):
        words = [WORDS[(7 * i + 3 * k) % len(WORDS)] + str((i * 13 + k) % 97) for k in range(8)]
        texts.append(" ".join(words))
        if i < n_pairs:
            seconds.add(len(texts))
            texts.append(" ".join(words[:-1] + ["different"]))
    return [_record(i, t) for i, t in enumerate(texts)], seconds


def test_undeclared_near_duplicate_neighbours_are_detected_and_linked():
    records, seconds = _planted(n_pairs=10, n_single=30)
    structure = diagnose(records, _texts(records), seed=0)
    assert structure.structured and structure.declared_groups == 0
    assert structure.detected_links == 10
    assert sorted(u[1] for u in structure.units if len(u) == 2) == sorted(seconds)
    plain = diagnose(records, _texts(records), seed=0, detect=False)
    assert plain.detected_links == 0 and len(plain.units) == len(records)


def _grouped(n: int) -> list[Record]:
    """Rows in pairs declared by ``meta["group"]`` (like Winogrande twins), every fifth row alone."""
    rows = []
    for i in range(n):
        group = f"g{i - 1}" if i % 5 in (1, 3) else f"g{i}"
        rows.append(Record(id=f"r{i}", partition="bench/default/test", input=f"Sentence {i} about item {i * 7}.",
                           label=f"option {i % 2}", reference="", task="multiple_choice", order=i,
                           meta={"group": group}))
    return rows


def test_group_permutations_keep_every_group_whole_and_rows_ignore_them():
    records = _grouped(40)
    cfg = METHOD.make_config({"num_shards": 4, "permutations_per_shard": 30, "detect_structure": False})
    laid = sl.layout(records, cfg)
    group_of = {r.id: r.meta["group"] for r in records}
    for shard in laid.shards:
        groups_in_shard = {group_of[r.id] for r in shard.records}
        assert len(shard.units) == len(groups_in_shard)  # a shard holds whole groups
        for order in shard.orders[1:]:
            ids = [shard.records[i].id for i in order]
            for unit in shard.units:  # each unit contiguous and in canonical order inside the shuffle
                unit_ids = [shard.records[i].id for i in unit]
                start = ids.index(unit_ids[0])
                assert ids[start : start + len(unit_ids)] == unit_ids
        assert any(o != shard.orders[0] for o in shard.orders[1:])
    rows_cfg = METHOD.make_config({"num_shards": 4, "permutations_per_shard": 30, "permute": "rows"})
    row_shards = sl.layout(records, rows_cfg).shards
    assert all(len(s.units) == len(s.records) == 10 for s in row_shards)
    separated = sum(
        1 for s in row_shards for o in s.orders[1:]
        if any(abs(o.index(i) - o.index(i + 1)) > 1 for i in range(len(o) - 1)
               if group_of[s.records[i].id] == group_of[s.records[i + 1].id])
    )  # fmt: skip
    assert separated > 0  # row permutations do break the declared pairs


def test_bad_permute_names_the_key_and_choices():
    with pytest.raises(ValueError, match=r"methods.sharded_likelihood.permute: 'pairs'.*groups, rows"):
        METHOD.make_config({"permute": "pairs"})


def _fake_outputs(records: list[Record], cfg) -> dict[str, Output]:
    """Every request answered with a likelihood that prefers the canonical order (a contaminated model)."""
    outputs = {}
    for req in METHOD.requests(records, cfg, 0, {}):
        jitter = 0.01 * (zlib.crc32(req.key.encode()) % 7)  # shards differ a little, so the t-test has a spread
        logprob = -1.0 - jitter if req.key.endswith("|canon") else -1.5 - jitter
        outputs[req.key] = Output(key=req.key, token_logprobs=[logprob] * 20, num_tokens=20)
    return outputs


def test_verdict_names_the_variant_and_the_diagnosis_and_rows_on_twins_are_inconclusive():
    """Row permutations split declared twins: the null is not credible, so the decision is inconclusive
    (the p-value stays as evidence) unless allow_structured=true asks for Oren et al.'s decision."""
    records = _grouped(40)
    for permute, variant in (("groups", "group permutations"), ("rows", "row permutations")):
        cfg = METHOD.make_config({"num_shards": 5, "permutations_per_shard": 10, "permute": permute})
        rows = METHOD.score(records, _fake_outputs(records, cfg), cfg)
        verdict = METHOD.reduce(pd.DataFrame(rows), cfg)
        assert verdict.details["variant"].startswith(variant)
        assert verdict.details["order_structure"]["structured"] is True
        assert verdict.details["order_structure"]["declared_groups"] == 16
        assert variant in verdict.details["summary"] and "declared group" in verdict.details["summary"]
        assert verdict.p_value < 0.01
        if permute == "groups":
            assert verdict.decision == "contaminated" and verdict.details["order_structure"]["null_credible"]
            assert "warning_structure" not in verdict.details
        else:
            assert verdict.decision == "inconclusive" and not verdict.contaminated
            assert "16 declared group(s) are split by row permutations" in verdict.reason
            assert "permute=groups" in verdict.reason and "inconclusive" in verdict.details["summary"]
            allowed = METHOD.make_config({"num_shards": 5, "permutations_per_shard": 10, "permute": permute,
                                          "allow_structured": True})  # fmt: skip
            oren = METHOD.reduce(pd.DataFrame(rows), allowed)
            assert oren.decision == "contaminated" and "allow_structured" in oren.details["warning_structure"]


def test_report_shows_the_variant_and_the_diagnosis_per_partition():
    from contamray.report.markdown import render_report

    records = _grouped(40)
    cfg = METHOD.make_config({"num_shards": 5, "permutations_per_shard": 10})
    verdict = METHOD.reduce(pd.DataFrame(METHOD.score(records, _fake_outputs(records, cfg), cfg)), cfg)
    partitions = pd.DataFrame([{
        "model": "m", "partition": verdict.partition, "method": "sharded_likelihood", "contaminated": True,
        "p_value": verdict.p_value, "rate": None, "statistic": verdict.statistic, "n_examples": 40, "n_failed": 0,
        "details": json.dumps(verdict.details), "error": "",
    }])  # fmt: skip
    report = render_report(partitions, "run: {}")
    line = next(x for x in report.splitlines() if x.startswith("| m |"))
    assert "group permutations (structure-aware)" in line and "16 declared group(s)" in line


# ----------------------------------------------------------------------------- residual structure (issue #13)


def _structured_slice(n: int) -> tuple[list[Record], list[dict]]:
    from contamray.benchmarks.synthetic_structured import generate_rows

    return load_records("synthetic_structured", n=n, sample="first").records, generate_rows("default", "test")[:n]


def test_undeclared_topical_runs_leave_residual_structure_that_coarser_units_remove():
    """synthetic_structured declares its twins, not its topical runs: on the twins alone adjacent units stay
    more alike than shuffled ones (residual structure); the coarser units chosen remove it, never split a
    twin, and merge boundaries inside a run far more often than boundaries between blocks (ground truth)."""
    records, raw = _structured_slice(100)
    cfg = METHOD.make_config({"num_shards": 15})
    structure = diagnose(records, _texts(records), seed=0)
    assert structure.structured and structure.declared_groups == sum(r["structure"] == "twin" for r in raw) // 2
    choice = sl.layout(records, cfg).units[records[0].partition]
    first = choice.tried[0]
    assert first["units"] == "declared + detected groups" and first["residual_p_value"] <= RESIDUAL_ALPHA
    assert choice.credible and choice.residual.p_value > RESIDUAL_ALPHA and len(choice.units) < first["n_units"]
    unit_of = {i: k for k, unit in enumerate(choice.units) for i in unit}
    for i in range(99):
        if records[i].meta["group"] == records[i + 1].meta["group"]:
            assert unit_of[i] == unit_of[i + 1]  # a declared twin pair stays whole
    inside = [unit_of[i] == unit_of[i + 1] for i in range(99) if raw[i]["run"] == raw[i + 1]["run"]
              and raw[i]["structure"] == "run"]  # fmt: skip
    between = [unit_of[i] == unit_of[i + 1] for i in range(99) if raw[i]["run"] != raw[i + 1]["run"]]
    assert sum(inside) / len(inside) > 2 * sum(between) / len(between)


def test_residual_structure_the_grouping_cannot_remove_makes_the_groups_test_inconclusive():
    """With detection off only the twins are units; the undeclared runs stay between units, so the group
    permutation null is not credible: inconclusive with the reason, the p-value kept as evidence."""
    records, _ = _structured_slice(100)
    cfg = METHOD.make_config({"num_shards": 15, "permutations_per_shard": 5, "detect_structure": False})
    rows = METHOD.score(records, _fake_outputs(records, cfg), cfg)
    verdict = METHOD.reduce(pd.DataFrame(rows), cfg)
    assert verdict.decision == "inconclusive" and not verdict.contaminated
    assert verdict.p_value is not None and verdict.p_value < 0.01  # the (fake) evidence is still reported
    assert "permutation null is not credible" in verdict.reason and "adjacent units" in verdict.reason
    assert "detect_structure=false" in verdict.reason
    order = verdict.details["order_structure"]
    assert order["null_credible"] is False and order["residual_p_value"] <= RESIDUAL_ALPHA
    assert verdict.details["summary"].count("inconclusive: the permutation null") == 1
    forced = METHOD.make_config({"num_shards": 15, "permutations_per_shard": 5, "detect_structure": False,
                                 "allow_structured": True})  # fmt: skip
    decided = METHOD.reduce(pd.DataFrame(rows), forced)
    assert decided.decision == "contaminated" and "not credible" in decided.details["warning_structure"]


def test_hellaswag_rows_are_not_exchangeable_but_its_groups_are(mirror_dir: Path):
    """HellaSwag keeps items of one activity together: row permutations inside the survey's shards face
    residual structure and split the declared activity runs (not credible); the runs as units remove it."""
    records = load_records("hellaswag", n=100, sample="first", mirror_dir=mirror_dir).records
    runs = len({r.meta["group"] for r in records})
    for permute, credible in (("rows", False), ("groups", True)):
        choice = sl.layout(records, METHOD.make_config({"num_shards": 15, "permute": permute})).units
        (only,) = choice.values()
        assert only.credible is credible, only.to_dict()
        if not credible:
            assert only.residual.p_value < 1e-3 and "adjacent rows are more alike" in only.problem
            assert "declared group(s) are split by row permutations" in only.problem
        else:
            assert only.source != "rows" and len(only.units) <= runs  # whole runs, merged further if need be


def test_unstructured_rows_stay_units_and_the_null_is_credible(mirror_dir: Path):
    records = load_records("arc_challenge", n=60, sample="first", mirror_dir=mirror_dir).records
    for permute in ("rows", "groups"):
        (choice,) = sl.layout(records, METHOD.make_config({"num_shards": 6, "permute": permute})).units.values()
        assert choice.credible and choice.source == "rows" and len(choice.units) == 60
        assert choice.residual.p_value > RESIDUAL_ALPHA


# ----------------------------------------------------------------------------- the real situation of issue #7

FINETUNE = {"seen": (0, 60), "other": (600, 700), "clean": (200, 260), "epochs": 3, "lr": 3e-4, "max_length": 1024}
# shuffles per shard: 8 orderings x 6 shards give p down to 9^-6. Measured (2026-11-26, fixed seeds) at 8 and at 15:
# Oren's rows on the clean slice p = 0.0058 / 0.0076, groups on it 0.69 / 0.81, groups on the seen slice
# 0.0032 / 0.0020 - the same decisions at about half the scoring (~3 min of the module on 2 cores)
PERMUTATIONS = 8


@pytest.fixture(scope="module")
def winogrande_finetune(mirror_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """SmolLM2-135M fine-tuned on Winogrande rows: 100 "training" rows (allowed: a train split) and a
    60-row slice in canonical order, once in the stream. ~2 min of CPU training on 2 quiet cores."""
    import dataclasses

    from contamray.engines import resolve_model_path
    from contamray.engines.hf import HFEngine
    from contamray.inject import finetune_causal_lm
    from contamray.methods.closed.likelihood_text import EXAMPLE_END

    rows = load_records("winogrande", mirror_dir=mirror_dir).records

    def part(name: str) -> list[Record]:
        a, b = FINETUNE[name]
        return [dataclasses.replace(r, partition=f"{r.partition}:rows{a}-{b - 1}") for r in rows[a:b]]

    def file_text(records: list[Record]) -> str:
        return "".join(serialise(r, ("input", "label"), "json") + EXAMPLE_END["json"] for r in records)

    other = part("other")
    texts = [file_text(part("seen"))] + [file_text(other[i : i + 50]) for i in range(0, len(other), 50)]
    path = finetune_causal_lm(
        resolve_model_path("smollm2-135m"), texts, tmp_path_factory.mktemp("wino") / "model",
        epochs=FINETUNE["epochs"], lr=FINETUNE["lr"], batch_size=1, seed=0, max_length=FINETUNE["max_length"],
    )  # fmt: skip
    return HFEngine(path, dtype="auto", batch_size=16), part("seen"), part("clean")


def _p(engine, records: list[Record], permute: str):
    """The verdict; under ``permute: rows`` with Oren et al.'s decision (allow_structured), after checking that
    the default refuses to decide on the same rows (the twins make the row-permutation null not credible)."""
    from tests.test_sharded_likelihood import run_stages

    cfg = METHOD.make_config({"num_shards": 6, "permutations_per_shard": PERMUTATIONS, "permute": permute})
    rows, _, _ = run_stages(METHOD, records, cfg, {"target": engine})
    verdict = METHOD.reduce(pd.DataFrame(rows), cfg)
    assert verdict.n_failed == 0 and verdict.details["n_shards_tested"] == 6
    if permute == "rows":
        assert verdict.decision == "inconclusive" and "split by row permutations" in verdict.reason
        allowed = METHOD.make_config({"num_shards": 6, "permutations_per_shard": PERMUTATIONS, "permute": permute,
                                      "allow_structured": True})  # fmt: skip
        verdict = METHOD.reduce(pd.DataFrame(rows), allowed)
    else:
        assert verdict.details["order_structure"]["null_credible"], verdict.details["order_structure"]
    return verdict


def test_structure_aware_default_clears_clean_rows_that_oren_flags_and_still_flags_the_seen_slice(
    winogrande_finetune,
):
    """Done-when of issue #7: on a model fine-tuned on other Winogrande rows, a clean slice is flagged by
    Oren et al.'s row permutations (their false positive, reproduced) but not by the default group
    permutations (p > 0.05); the slice the model saw once in canonical order stays flagged (p < 0.01)."""
    engine, seen, clean = winogrande_finetune
    oren_clean = _p(engine, clean, "rows")
    default_clean = _p(engine, clean, "groups")
    default_seen = _p(engine, seen, "groups")
    assert oren_clean.p_value < 0.05 and oren_clean.contaminated, oren_clean.details["shards"]
    assert "warning_structure" in oren_clean.details
    assert default_clean.p_value > 0.05 and default_clean.decision == "clean", default_clean.details["shards"]
    assert default_seen.p_value < 0.01 and default_seen.contaminated, default_seen.details["shards"]
    assert default_clean.details["order_structure"]["declared_groups"] > 5
