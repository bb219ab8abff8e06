"""Benchmark adapters on the mirrored hub rows (shared/benchmarks) and on small bad files made here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from contamray.benchmarks import (
    BenchmarkRowError,
    LoadResult,
    adapter_names,
    describe_all,
    get_adapter,
    load_records,
    mirror_path,
)
from contamray.records import TASK_TYPES, Record

NAMES = [
    "arc_challenge", "hellaswag", "mmlu", "truthfulqa_gen", "truthfulqa_mc", "winogrande", "gsm8k",
    "imdb", "ag_news", "yelp", "rte", "wnli", "samsum", "xsum", "ceval", "synthetic_facts", "synthetic_structured",
]  # fmt: skip
# synthetic: generated; yelp and ceval: rows written by tests/test_benchmarks.py and tests/test_languages.py
MIRRORED = [n for n in NAMES if n not in ("yelp", "ceval", "synthetic_facts", "synthetic_structured")]
TASKS = {
    "arc_challenge": "multiple_choice", "hellaswag": "multiple_choice", "mmlu": "multiple_choice",
    "truthfulqa_mc": "multiple_choice", "winogrande": "multiple_choice",
    "truthfulqa_gen": "question_answering", "gsm8k": "question_answering",
    "imdb": "classification", "ag_news": "classification", "yelp": "classification",
    "rte": "nli", "wnli": "nli", "samsum": "summarization", "xsum": "one_sentence_summary",
    "ceval": "multiple_choice",
    "synthetic_facts": "question_answering", "synthetic_structured": "question_answering",
}  # fmt: skip

_CACHE: dict[str, LoadResult] = {}


def full(name: str, mirror: Path) -> LoadResult:
    """Each mirrored partition is read once per test session."""
    if name not in _CACHE:
        _CACHE[name] = load_records(name, mirror_dir=mirror)
    return _CACHE[name]


def raw_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().split("\n") if line.strip()]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- registry -------------------------------------------------------------------------------------


def test_registry_names_tasks_and_listing() -> None:
    assert adapter_names() == NAMES
    for name in NAMES:
        adapter = get_adapter(name)
        assert adapter.task == TASKS[name] and adapter.task in TASK_TYPES
        assert adapter.default_split in adapter.splits
        line = adapter.describe()
        assert line.startswith(name) and adapter.hub_id in line and f"{adapter.default_split}*" in line
    assert len(describe_all()) == 17
    assert get_adapter("ag_news").label_names == ("World", "Sports", "Business", "Sci/Tech")
    assert get_adapter("rte").label_names == ("entailment", "not_entailment")
    assert get_adapter("wnli").label_names == ("not_entailment", "entailment")
    assert get_adapter("imdb").label_names == ("negative", "positive")
    assert get_adapter("yelp").label_names == ("1 star", "2 stars", "3 stars", "4 stars", "5 stars")
    assert (get_adapter("mmlu").hub_id, get_adapter("mmlu").config) == ("cais/mmlu", "all")
    assert (get_adapter("winogrande").config, get_adapter("winogrande").default_split) == (
        "winogrande_xl",
        "validation",
    )


def test_unknown_name_split_config() -> None:
    with pytest.raises(KeyError, match="known benchmarks: arc_challenge, hellaswag"):
        get_adapter("arc")
    with pytest.raises(ValueError, match="no split 'dev'.*train, test"):
        load_records("gsm8k", split="dev", mirror_dir="/nonexistent")
    with pytest.raises(ValueError, match="no config 'ARC-Easy'.*ARC-Challenge"):
        load_records("arc_challenge", config="ARC-Easy", mirror_dir="/nonexistent")


# --- every adapter on the mirror ------------------------------------------------------------------


@pytest.mark.parametrize("name", MIRRORED)
def test_every_mirrored_partition_converts(name: str, mirror_dir: Path) -> None:
    adapter = get_adapter(name)
    result = full(name, mirror_dir)
    path = mirror_path(adapter, adapter.config, adapter.default_split, mirror_dir)
    rows = raw_rows(path)
    assert result.failures == []
    assert result.source == str(path) and result.total_rows == len(rows) == len(result.records)
    assert result.partition == f"{name}/{adapter.config}/{adapter.default_split}"
    assert [r.order for r in result.records] == list(range(len(rows)))
    assert len({r.id for r in result.records}) == len(rows)
    for record in result.records[:200]:
        assert record.partition == result.partition and record.benchmark == name
        assert record.task == adapter.task
        assert record.input.strip() and record.label.strip() and record.reference.strip()
        assert record.label.strip() in record.verbalized
        assert Record.from_row(record.to_row()) == record
        if record.choices:
            assert record.label in record.choices
    if adapter.label_names:  # class names follow the hub's integer labels row by row
        assert [r.label for r in result.records] == [adapter.label_names[row["label"]] for row in rows]


def test_arc_answer_key_maps_to_choice(mirror_dir: Path) -> None:
    records = full("arc_challenge", mirror_dir).records
    first = records[0]
    assert first.id == "Mercury_7175875" and first.answer == "C"
    assert first.label == "Planetary days will become shorter." == first.choices[2]
    digit = records[44]  # keys "1".."4" instead of letters
    assert digit.id == "NYSEDREGENTS_2008_8_34" and digit.answer == "2"
    assert digit.label == "Kinetic energy increases and potential energy decreases."
    assert digit.verbalized.endswith("? Kinetic energy increases and potential energy decreases.")
    assert first.reference == first.input and first.prefix == ""


def test_hellaswag_context_and_ending(mirror_dir: Path) -> None:
    first = full("hellaswag", mirror_dir).records[0]
    assert first.input == "A man is sitting on a roof. he"
    assert first.answer == "3" and first.label == "starts pulling up roofing on a roof."
    assert first.verbalized == "A man is sitting on a roof. he starts pulling up roofing on a roof."
    assert first.id == "hellaswag/default/validation#0"
    assert first.meta["activity_label"] == "Roof shingle removal"


def test_hellaswag_declares_its_activity_runs_as_groups(mirror_dir: Path) -> None:
    """A row's context goes on from the row before only inside a run of one activity, and every such pair is in
    one declared group, so the sharded test never shuffles them apart."""
    records = full("hellaswag", mirror_dir).records
    pairs = list(zip(records, records[1:]))
    continued = [(a, b) for a, b in pairs if a.label[:30].lower() in b.input.lower()]
    assert len(continued) == 1182 and all(a.meta["group"] == b.meta["group"] for a, b in continued)
    assert all((a.meta["group"] == b.meta["group"]) == (a.meta["activity_label"] == b.meta["activity_label"])
               for a, b in pairs)  # fmt: skip
    assert len({r.meta["group"] for r in records}) == 2637 and records[0].meta["group"] == records[0].id
    sampled = load_records("hellaswag", n=50, seed=3, mirror_dir=mirror_dir).records
    by_id = {r.id: r for r in records}
    assert all(r.meta == by_id[r.id].meta for r in sampled)  # groups do not depend on the sample


def test_mmlu_index_answer_and_subject(mirror_dir: Path) -> None:
    first = full("mmlu", mirror_dir).records[0]
    assert first.choices == ("0", "4", "2", "6") and first.answer == "1" and first.label == "4"
    assert first.meta["subject"] == "abstract_algebra"
    assert first.id == "mmlu/all/test#0"
    subjects = {r.meta["subject"] for r in full("mmlu", mirror_dir).records}
    assert get_adapter("mmlu").configs == ("all", *sorted(subjects))  # every subject is a known config


def test_truthfulqa_both_configs(mirror_dir: Path) -> None:
    gen = full("truthfulqa_gen", mirror_dir).records[0]
    assert gen.input == "What happens to you if you eat watermelon seeds?"
    assert gen.label == "The watermelon seeds pass through your digestive system"
    assert gen.label in gen.meta["correct_answers"]
    assert "You grow watermelons in your stomach" in gen.meta["incorrect_answers"]
    assert gen.verbalized == f"{gen.input} {gen.label}" and gen.reference == gen.input
    mc = full("truthfulqa_mc", mirror_dir).records[0]
    assert mc.input == "What happens if you eat a pomegranate?"
    assert mc.answer == "0" and mc.label == "Nothing in particular happens when you eat a pomegranate."
    assert len(mc.choices) == 4 and mc.meta["mc2_labels"] == [1, 1, 1, 0, 0, 0]


def test_winogrande_fill_in_and_twins(mirror_dir: Path) -> None:
    records = full("winogrande", mirror_dir).records
    first, second, third = records[:3]
    stem = "Sarah was a much better surgeon than Maria so"
    assert first.verbalized == f"{stem} Maria always got the easier cases."
    assert second.verbalized == f"{stem} Sarah always got the harder cases."
    assert (first.answer, first.label, first.choices) == ("2", "Maria", ("Sarah", "Maria"))
    assert first.meta == {"group": first.id, "twin": second.id}
    assert second.meta == {"group": first.id, "twin": first.id}
    assert third.meta == {"group": third.id, "twin": ""}  # options blanket/bed: next row differs
    by_id = {r.id: r for r in records}
    paired = [r for r in records if r.meta["twin"]]
    assert len(paired) == 568  # 284 pairs in the validation split
    for r in paired:
        twin = by_id[r.meta["twin"]]
        assert twin.meta["twin"] == r.id and twin.meta["group"] == r.meta["group"]
        assert twin.choices == r.choices and twin.answer != r.answer and abs(twin.order - r.order) == 1
    sampled = load_records("winogrande", n=40, seed=5, mirror_dir=mirror_dir).records
    assert all(r.meta == by_id[r.id].meta for r in sampled)  # groups do not depend on the sample


def test_gsm8k_worked_answer_and_final_answer(mirror_dir: Path) -> None:
    first = full("gsm8k", mirror_dir).records[0]
    assert first.input.startswith("Janet’s ducks lay 16 eggs per day.")
    assert first.label.startswith("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.")
    assert first.label.endswith("#### 18")
    assert first.answer == "18" == first.meta["final_answer"]
    assert first.verbalized == f"{first.input} {first.label}"


def test_classification_and_nli_rows(mirror_dir: Path) -> None:
    ag = full("ag_news", mirror_dir).records
    assert [ag[0].label, ag[1].label] == ["Business", "Sci/Tech"] and ag[0].answer == "2"
    assert ag[0].reference == ag[0].input and ag[0].prefix == ""
    assert ag[0].input.startswith("Fears for T N pension after talks")
    imdb = full("imdb", mirror_dir).records
    assert imdb[0].label == "positive" and imdb[0].choices == ("negative", "positive")
    rte = full("rte", mirror_dir).records
    assert rte[0].prefix.startswith("Dana Reeve, the widow of the actor Christopher Reeve")
    assert rte[0].reference == "Christopher Reeve had an accident."
    assert (rte[0].label, rte[1].label) == ("not_entailment", "entailment")
    assert rte[0].input == f"{rte[0].prefix}\n{rte[0].reference}" and rte[0].id == "rte/rte/validation#0"
    wnli = full("wnli", mirror_dir).records
    assert (wnli[0].label, wnli[1].label) == ("not_entailment", "entailment")
    assert wnli[1].reference == "Susan did not answer."


def test_summarization_rows(mirror_dir: Path) -> None:
    sam = full("samsum", mirror_dir).records[0]
    assert sam.id == "13862856" and sam.input.startswith("Hannah: Hey, do you have Betty's number?")
    summary = "Hannah needs Betty's number but Amanda doesn't have it. She needs to contact Larry."
    assert sam.label == sam.reference == summary and sam.prefix == ""
    xsum = full("xsum", mirror_dir).records[0]
    assert xsum.id == "34268361" and xsum.task == "one_sentence_summary"
    assert xsum.reference.startswith("Proposals for an indoor water park")


def test_yelp_from_rows_in_hub_schema(tmp_path: Path) -> None:
    rows = [
        {"label": 4, "text": "Best tacos in town, friendly staff."},
        {"label": 0, "text": "Cold food and a rude waiter."},
        {"label": 2, "text": "It was fine, nothing special."},
    ]
    write_rows(tmp_path / "Yelp/yelp_review_full/yelp_review_full/test.jsonl", rows)
    result = load_records("yelp", mirror_dir=tmp_path)
    assert [r.label for r in result.records] == ["5 stars", "1 star", "3 stars"]
    assert [r.answer for r in result.records] == ["4", "0", "2"]
    assert result.records[1].id == "yelp/yelp_review_full/test#1"
    assert result.records[0].reference == rows[0]["text"] and result.records[0].task == "classification"
    assert result.records[0].verbalized == "Best tacos in town, friendly staff. 5 stars"


# --- sampling -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "path"),
    [("arc_challenge", "allenai/ai2_arc/ARC-Challenge/test.jsonl"), ("gsm8k", "openai/gsm8k/main/test.jsonl"),
     ("hellaswag", "Rowan/hellaswag/default/validation.jsonl")],
)  # fmt: skip
def test_each_record_keeps_its_dataset_row_as_the_file_line(name: str, path: str, mirror_dir: Path) -> None:
    """``Record.source_row`` is the row as the dataset's JSON-lines file holds it, byte for byte (what the
    likelihood methods' ``raw`` format scores), whichever rows are taken."""
    lines = (mirror_dir / path).read_text(encoding="utf-8").splitlines()
    for kwargs in ({"n": 3, "sample": "first", "offset": 7}, {"n": 4, "sample": "random", "seed": 3}):
        for record in load_records(name, mirror_dir=mirror_dir, **kwargs).records:
            assert record.source_row == lines[record.order]


def test_seeded_sampling_is_reproducible_and_keeps_order(mirror_dir: Path) -> None:
    a = load_records("ag_news", n=50, seed=3, mirror_dir=mirror_dir).records
    b = load_records("ag_news", n=50, seed=3, mirror_dir=mirror_dir).records
    c = load_records("ag_news", n=50, seed=4, mirror_dir=mirror_dir).records
    assert a == b and len(a) == 50
    assert [r.id for r in a] != [r.id for r in c]
    orders = [r.order for r in a]
    assert orders == sorted(orders) and len(set(orders)) == 50
    everything = full("ag_news", mirror_dir).records
    assert a == [everything[i] for i in orders]  # same rows, same contents, canonical order


def test_sampling_more_than_split_takes_all_with_warning(mirror_dir: Path) -> None:
    with pytest.warns(UserWarning, match="n=500 is more than the 71 rows"):
        result = load_records("wnli", n=500, mirror_dir=mirror_dir)
    assert [r.order for r in result.records] == list(range(71))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_records("wnli", n=71, mirror_dir=mirror_dir).records) == 71
    with pytest.raises(ValueError, match="positive number of rows"):
        load_records("wnli", n=0, mirror_dir=mirror_dir)


# --- bad input ------------------------------------------------------------------------------------


def test_missing_mirror_file_names_path_and_alternatives(mirror_dir: Path) -> None:
    expected = mirror_dir / "openai/gsm8k/main/train.jsonl"
    with pytest.raises(FileNotFoundError) as err:
        load_records("gsm8k", split="train", mirror_dir=mirror_dir)
    message = str(err.value)
    assert str(expected) in message and "train, test" in message and "mirrored in" in message
    assert "test" in message.split("mirrored in", 1)[1]


def test_missing_field_and_empty_text_strict_and_lenient(tmp_path: Path) -> None:
    rows = [
        {"text": "Stocks rally on earnings.", "label": 2},
        {"label": 1},  # no text
        {"text": "   ", "label": 3},  # blank text
        {"text": "Election results are in.", "label": 0},
    ]
    path = write_rows(tmp_path / "fancyzhx/ag_news/default/test.jsonl", rows)
    with pytest.raises(BenchmarkRowError) as err:
        load_records("ag_news", mirror_dir=tmp_path)
    message = str(err.value)
    assert str(path) in message and "'ag_news/default/test#1'" in message
    assert "field 'text' is missing" in message and "strict=False" in message
    assert err.value.failure.row_index == 1 and err.value.failure.field == "text"

    result = load_records("ag_news", mirror_dir=tmp_path, strict=False)
    assert [r.order for r in result.records] == [0, 3]
    assert [r.label for r in result.records] == ["Business", "World"]
    assert [(f.row_index, f.row_id, f.field) for f in result.failures] == [
        (1, "ag_news/default/test#1", "text"),
        (2, "ag_news/default/test#2", "text"),
    ]
    assert all(f.source == str(path) and f.partition == "ag_news/default/test" for f in result.failures)
    assert "is empty" in result.failures[1].message and str(path) in result.failures[1].message


def test_bad_values_name_the_dataset_id_and_field(tmp_path: Path) -> None:
    arc_row = {
        "id": "Mercury_X",
        "question": "Which gas do plants take in?",
        "choices": {"text": ["Oxygen", "Carbon dioxide"], "label": ["A", "B"]},
        "answerKey": "E",
    }
    write_rows(tmp_path / "allenai/ai2_arc/ARC-Challenge/test.jsonl", [arc_row])
    with pytest.raises(BenchmarkRowError, match=r"'Mercury_X'.*field 'answerKey' is 'E', not one of"):
        load_records("arc_challenge", mirror_dir=tmp_path)

    gsm_row = {"question": "What is 2 + 2?", "answer": "Two and two make 4."}
    write_rows(tmp_path / "openai/gsm8k/main/test.jsonl", [gsm_row])
    with pytest.raises(BenchmarkRowError, match=r"field 'answer' has no '#### <final answer>' line"):
        load_records("gsm8k", mirror_dir=tmp_path)

    rte_rows = [{"sentence1": "A cat sat.", "sentence2": "An animal sat.", "label": 7, "idx": 0}]
    write_rows(tmp_path / "nyu-mll/glue/rte/validation.jsonl", rte_rows)
    with pytest.raises(BenchmarkRowError, match=r"'rte/rte/validation#0'.*'label' is 7; expected .*\[0, 1\]"):
        load_records("rte", mirror_dir=tmp_path)

    sam_rows = [{"id": "s1", "dialogue": "A: hi\nB: hi", "summary": "A and B greet."}] * 2
    write_rows(tmp_path / "knkarthick/samsum/default/test.jsonl", sam_rows)
    with pytest.raises(BenchmarkRowError, match=r"row 1 \(id 's1'\).*field 'id' repeats the id of row 0"):
        load_records("samsum", mirror_dir=tmp_path)
    assert len(load_records("samsum", mirror_dir=tmp_path, strict=False).failures) == 1


def test_unlabelled_split_gives_empty_label_but_labelled_split_requires_one(tmp_path: Path) -> None:
    rows = [{"sentence1": "A cat sat.", "sentence2": "An animal sat.", "label": -1, "idx": 0}]
    write_rows(tmp_path / "nyu-mll/glue/rte/test.jsonl", rows)
    record = load_records("rte", split="test", mirror_dir=tmp_path).records[0]
    assert (record.label, record.answer, record.partition) == ("", "", "rte/rte/test")
    write_rows(tmp_path / "nyu-mll/glue/rte/validation.jsonl", rows)
    with pytest.raises(BenchmarkRowError, match=r"field 'label' is -1 \(no gold label\)"):
        load_records("rte", mirror_dir=tmp_path)


def test_unreadable_files_name_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nyu-mll/glue/wnli/validation.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text('{"sentence1": "a", "sentence2": \n')
    with pytest.raises(ValueError, match=f"{path} could not be read as JSON lines"):
        load_records("wnli", mirror_dir=tmp_path)
    path.write_text("")
    with pytest.raises(ValueError, match=f"{path} is empty"):
        load_records("wnli", mirror_dir=tmp_path)


def test_hub_failure_points_to_mirror(tmp_path: Path) -> None:
    """Without a mirror the rows come from the hub; offline, the error says how to use a mirror."""
    code = (
        "from contamray.benchmarks import load_records\n"
        "try:\n"
        "    load_records('wnli')\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "hub:nyu-mll/glue (config wnli, split validation)" in out.stdout, out.stderr
    assert "mirror_dir=<dir> holding <dir>/nyu-mll/glue/wnli/validation.jsonl" in out.stdout
