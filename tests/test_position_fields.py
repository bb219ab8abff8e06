"""The sharded test's raw form on files that number their rows (``methods/closed/position_fields.py``).

Known answers:
- a "model" that only likes counting (its score rises with every number that follows the one before, plus noise
  that depends on the text alone) never saw any file, so the test must hold its level on its clean partitions -
  and it does not when the shuffles keep the rows' own numbers (the failure measured on the base model: 3 of 4
  clean ``synthetic_facts`` slices flagged in the raw form);
- a "model" that learnt the canonical order (it likes rows next to the ones they followed in the file) is still
  found when the file numbers its rows;
- the generated ``synthetic_structured`` file numbers rows (``id``), points at twins (``twin``) and counts runs
  (``run``): every scored order reads as that file would, written in that order.
"""

from __future__ import annotations

import hashlib
import json
import random
import re

import pandas as pd
import pytest

from contamray.benchmarks import load_records
from contamray.methods.base import Output, get_method
from contamray.methods.closed import position_fields as pf
from contamray.methods.closed import sharded_likelihood as sl
from contamray.records import Record

METHOD = get_method("sharded_likelihood")
WORDS = [f"w{k}" for k in range(400)]
NUMBER = re.compile(r'"ind": (\d+)')


def _rows(n: int, seed: int, extra=None) -> list[Record]:
    """A HellaSwag-like file: ``ind`` counts the rows, the content is drawn independently per row."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        row = {"ind": 100 + i, "ctx": " ".join(rng.sample(WORDS, 6)), "label": rng.randrange(4), "split": "val"}
        row.update(extra(i, rng) if extra else {})
        out.append(Record(id=f"p{seed}#{i}", partition=f"file{seed}", input=row["ctx"], label=str(row["label"]),
                          reference="", task="classification",
                          order=i, source_row=json.dumps(row, ensure_ascii=False)))  # fmt: skip
    return out


def _noise(text: str) -> float:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") / 2**64


def _counting(text: str) -> float:
    """Score of a model that never saw the file but likes counting: +1 per number one above the previous."""
    numbers = [int(n) for n in NUMBER.findall(text)]
    return sum(b == a + 1 for a, b in zip(numbers, numbers[1:])) + _noise(text)


def _verdict(records: list[Record], config, score) -> object:
    outputs = {r.key: Output(key=r.key, token_logprobs=[score(r.text)], num_tokens=1)
               for r in METHOD.requests(records, config, 0, {})}  # fmt: skip
    return METHOD.reduce(pd.DataFrame(METHOD.score(records, outputs, config)), config)


RAW = {"num_shards": 5, "permutations_per_shard": 5, "format": "raw"}


def test_a_numbered_file_keeps_its_numbers_in_place_and_its_canonical_text_byte_for_byte():
    records = _rows(20, 0)
    config = METHOD.make_config(RAW)
    laid = sl.layout(records, config)
    found = laid.positions["file0"]
    assert found.index == ("ind",) and not found.references and not found.counters and not found.unheld
    for shard in laid.shards:
        canon, _ = shard.text(shard.orders[0])
        assert canon == "".join(r.source_row + "\n" for r in shard.records)
        for order in shard.orders[1:]:
            rows = [json.loads(line) for line in shard.text(order)[0].splitlines()]
            assert [r["ind"] for r in rows] == [json.loads(r.source_row)["ind"] for r in shard.records]
            assert [r["ctx"] for r in rows] == [json.loads(shard.records[i].source_row)["ctx"] for i in order]
            assert [r["label"] for r in rows] == [json.loads(shard.records[i].source_row)["label"] for i in order]
    summary = _verdict(records, config, _counting).details["summary"]
    assert "raw rows renumbered in every order (index ind)" in summary


def test_a_model_that_likes_counting_is_not_taken_for_one_that_read_the_file():
    """The level on 120 clean partitions at alpha = 0.05 (a valid test flags 6 on average; P(>= 13) < 0.01)."""
    config = METHOD.make_config(RAW)
    flagged = sum(_verdict(_rows(20, seed), config, _counting).decision == "contaminated" for seed in range(120))
    assert flagged <= 12, flagged


def test_without_the_renumbering_the_counting_model_is_flagged_everywhere(monkeypatch):
    """What the test did before: the rows' own numbers moved with them, so the canonical file counted upward."""
    monkeypatch.setattr(sl, "find_position_fields", lambda lines: pf.PositionFields())
    config = METHOD.make_config(RAW)
    assert all(_verdict(_rows(20, seed), config, _counting).decision == "contaminated" for seed in range(5))


def test_a_model_that_learnt_the_order_is_found_in_a_numbered_file():
    def learnt(records: list[Record]):
        ctx = [json.loads(r.source_row)["ctx"] for r in records]
        follows = dict(zip(ctx, ctx[1:]))

        def score(text: str) -> float:
            ctxs = [json.loads(line)["ctx"] for line in text.splitlines()]
            return 2.0 * sum(follows.get(a) == b for a, b in zip(ctxs, ctxs[1:])) + _counting(text)

        return score

    config = METHOD.make_config(RAW)
    for seed in range(5):
        records = _rows(20, seed)
        verdict = _verdict(records, config, learnt(records))
        assert verdict.decision == "contaminated" and verdict.p_value < 0.01, (seed, verdict.p_value)


def test_a_field_that_follows_the_order_but_cannot_be_renumbered_leaves_the_test_inconclusive():
    """``score`` mostly rises with the row but not always: no renumbering reproduces it, so the raw form declines."""
    records = _rows(20, 1, extra=lambda i, rng: {"score": i + rng.choice([0, 0, 0, 3])})
    config = METHOD.make_config(RAW)
    found = sl.layout(records, config).positions["file1"]
    assert found.index == ("ind",) and list(found.unheld) == ["score"] and found.unheld["score"] > 0.5
    verdict = METHOD.settle(_verdict(records, config, _counting), config)
    assert verdict.decision == "inconclusive"
    assert "the raw rows' field(s) 'score' (Kendall tau" in verdict.reason and "format json" in verdict.reason
    anyway = METHOD.make_config({**RAW, "allow_structured": True})
    decided = _verdict(records, anyway, _counting)
    assert decided.decision != "inconclusive" and "'score'" in decided.details["warning_position_fields"]
    # the JSON form of input and label carries none of the file's numbers: nothing to renumber, it decides
    plain = METHOD.make_config({k: v for k, v in RAW.items() if k != "format"})
    assert not sl.layout(records, plain).positions and _verdict(records, plain, _counting).decision != "inconclusive"


def test_the_generated_structured_file_reads_as_written_in_every_order():
    """``id`` counts rows, ``twin`` names the twin's id, ``run`` counts runs of one entity: in each scored order the
    ids count up, a twin names the row beside it, and each run's value is one more than the run before."""
    records = load_records("synthetic_structured", config="set2", split="test").records[:60]
    config = METHOD.make_config({**RAW, "num_shards": 3})
    laid = sl.layout(records, config)
    found = laid.positions[records[0].partition]
    assert (found.index, found.references, found.counters, found.unheld) == (("id",), ("twin",), ("run",), {})
    unit_of = {i: k for k, unit in enumerate(laid.units[records[0].partition].units) for i in unit}
    runs = [json.loads(r.source_row)["run"] for r in records]
    assert all(unit_of[i] == unit_of[i + 1] for i in range(59) if runs[i] == runs[i + 1])  # each run moves whole
    checked = 0
    for shard in laid.shards:
        first = [json.loads(r.source_row) for r in shard.records]
        for order in shard.orders:
            rows = [json.loads(line) for line in shard.text(order)[0].splitlines()]
            assert [r["id"] for r in rows] == [r["id"] for r in first]
            runs = [r["run"] for r in rows]
            assert runs[0] == first[0]["run"] and all(b - a in (0, 1) for a, b in zip(runs, runs[1:]))
            ids = [r["id"] for r in rows]
            for k, r in enumerate(rows):
                if r["twin"] and any(r["twin"] == i["id"] for i in first):
                    assert r["twin"] in ids[max(0, k - 1) : k + 2] and r["twin"] != r["id"]
                    checked += 1
    assert checked >= 4


@pytest.mark.parametrize(
    ("lines", "index"),
    [
        (['{"a": "x-001"}', '{"a": "x-002"}', '{"a": "x-010"}'], ("a",)),  # zero-padded, gaps: still an index
        (['{"a": 3.5}', '{"a": 2}', '{"a": -1}'], ("a",)),  # decreasing
        (['{"a": 1}', '{"a": 1}', '{"a": 1}'], ()),  # constant: nothing moves
        (['{"a": true}', '{"a": false}', '{"a": true}'], ()),
        (["not json", '{"a": 1}', '{"a": 2}'], ()),
    ],
)
def test_what_counts_as_an_index(lines, index):
    assert pf.find(lines).index == index


def test_a_string_index_keeps_its_own_text_and_padding():
    fields = pf.find(['{"a": "x-001", "b": "p"}', '{"a": "y-002", "b": "q"}', '{"a": "x-010", "b": "r"}'])
    texts = pf.Renumber(fields, ['{"a": "x-001", "b": "p"}', '{"a": "y-002", "b": "q"}', '{"a": "x-010", "b": "r"}'],
                        "\n").texts([2, 0, 1])  # fmt: skip
    assert [json.loads(t) for t in texts] == [{"a": "x-001", "b": "r"}, {"a": "x-002", "b": "p"},
                                              {"a": "y-010", "b": "q"}]  # fmt: skip


def test_a_counters_runs_are_joined_into_whole_units_and_renumbered_as_they_come():
    """Rows of one ``run`` value are alike in nothing the structure check sees, so they would be shuffled apart; the
    raw form joins each run into one unit, and a shuffle numbers the runs in the order it meets them."""
    records = _rows(30, 2, extra=lambda i, rng: {"run": 7 + i // 2})
    config = METHOD.make_config(RAW)
    laid = sl.layout(records, config)
    choice = laid.units["file2"]
    assert laid.positions["file2"].counters == ("run",) and "joined into whole runs" in choice.source
    assert choice.units == [[2 * k, 2 * k + 1] for k in range(15)] and choice.credible
    for shard in laid.shards:
        own = [json.loads(r.source_row)["run"] for r in shard.records]
        for order in shard.orders[1:]:
            rows = [json.loads(line) for line in shard.text(order)[0].splitlines()]
            assert [r["run"] for r in rows] == own  # the same count in every order
            assert [r["ctx"] for r in rows] == [json.loads(shard.records[i].source_row)["ctx"] for i in order]
    assert _verdict(records, config, _counting).details["order_structure"]["position_fields"]["counters"] == ["run"]


@pytest.mark.slow
def test_a_model_fine_tuned_on_the_raw_file_is_found_and_an_unseen_slice_is_not(tmp_path_factory):
    """The embedded model fine-tuned on ``synthetic_facts`` rows 200-219 as the raw file (the rows' own JSON lines,
    ids and all; 12 epochs of one sequence): renumbering the shuffles keeps the test's power on the file it read,
    and rows 220-239 of the same file, never seen, stay clean. Measured 2026-12-06 (two fine-tunes, CPU training is
    not bit-reproducible): seen p = 0.0040 and 0.0096, unseen 0.49 and 0.45; the JSON form of input and label missed
    the leak (p = 0.17) - the serialisation the model saw is the one to test."""
    import dataclasses

    from contamray.engines import resolve_model_path
    from contamray.engines.hf import HFEngine
    from contamray.inject import finetune_causal_lm
    from contamray.validate.calibrate import SharedEngines, decide

    rows = load_records("synthetic_facts", config="set2", split="test").records
    seen = [dataclasses.replace(r, partition=r.partition + ":rows200-219") for r in rows[200:220]]
    unseen = [dataclasses.replace(r, partition=r.partition + ":rows220-239") for r in rows[220:240]]
    out = tmp_path_factory.mktemp("raw_leak") / "model"
    finetune_causal_lm(resolve_model_path("smollm2-135m"), ["".join(r.source_row + "\n" for r in seen)], out,
                       epochs=12, lr=5e-4, batch_size=1, seed=0, max_length=2048)  # fmt: skip
    engines = SharedEngines({"target": HFEngine(str(out), dtype="float32", batch_size=16)})
    config = METHOD.make_config(RAW)
    found, clean = (decide(METHOD, config, engines.run(METHOD, part, config)) for part in (seen, unseen))
    print("raw leak:", found.p_value, "unseen:", clean.p_value)
    assert found.decision == "contaminated", (found.p_value, found.details["summary"])  # p <= alpha = 0.05
    assert clean.decision == "clean", (clean.p_value, clean.reason)
    assert found.details["order_structure"]["position_fields"]["index"] == ["id"]
