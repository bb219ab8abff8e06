"""Injection: the spec's checks, the paraphraser, the training stream, and a real (tiny) fine-tune."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from contamray.benchmarks import load_records
from contamray.inject import InjectedModel, prepare_injected_model, validate_inject_spec
from contamray.inject.background import BackgroundDoc
from contamray.inject.corpus import injected_corpus
from contamray.inject.paraphrase import changed_fraction, paraphrase
from contamray.inject.stream import build_stream

WHERE = "models.canary.inject"


def spec(**partition) -> dict:
    return {"partitions": [{"benchmark": "sf", **partition}], "background": {"docs": 0}}


# --- the spec ------------------------------------------------------------------------------------


def test_spec_is_normalised() -> None:
    parsed = validate_inject_spec(spec(duplication=5, form="paraphrased", fraction=0.5), WHERE, {"sf", "arc"})
    p = parsed.partitions[0]
    assert (p.benchmark, p.duplication, p.form, p.content, p.order, p.format, p.fraction) == (
        "sf", 5, "paraphrased", "input_and_label", "canonical", "json", 0.5
    )
    assert p.kind == "paraphrased/input_and_label/canonical"
    assert parsed.epochs == 1 and parsed.background.docs == 0
    assert parsed.to_dict()["partitions"][0]["duplication"] == 5


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"partitions": []}, r"models\.canary\.inject\.partitions: expected a non-empty list"),
        ({"partitions": [{"duplication": 2}]}, r"partitions\[0\]\.benchmark: missing"),
        (spec(duplication=0), r"partitions\[0\]\.duplication: expected an integer >= 1, got 0"),
        (spec(duplication=True), r"partitions\[0\]\.duplication"),
        (spec(form="rewritten"), r"partitions\[0\]\.form: 'rewritten' is not one of verbatim, paraphrased"),
        (spec(content="label_only"), r"partitions\[0\]\.content: 'label_only'"),
        (spec(order="random"), r"partitions\[0\]\.order: 'random' is not one of canonical, shuffled"),
        (spec(fraction=0), r"partitions\[0\]\.fraction: expected a number in \(0, 1\]"),
        (spec(copies=3), r"partitions\[0\]: unknown key\(s\) copies; known keys: .*duplication"),
        ({"partitions": [{"benchmark": "gsm8k"}]}, r"partitions\[0\]\.benchmark: 'gsm8k' is not a benchmark of "
                                                    r"this run.*choices: arc, sf"),
        ({"partitions": [{"benchmark": "sf"}, {"benchmark": "sf"}]}, r"partitions\[1\]\.benchmark: 'sf' is "
                                                                     r"already injected by partitions\[0\]"),
        ({**spec(), "background": {"source": "wikipedia"}}, r"background\.source: 'wikipedia' is not a benchmark"),
        ({**spec(), "lr": -1}, r"inject\.lr: expected a finite number > 0"),
        ({**spec(), "precision": "fp16"}, r"inject\.precision: unknown precision 'fp16'; choose one of float32"),
        ({**spec(), "epochs": 0}, r"inject\.epochs"),
        ({**spec(), "steps": 10}, r"models\.canary\.inject: unknown key\(s\) steps"),
        (spec(loss="prompts"), r"partitions\[0\]\.loss: 'prompts' is not one of all, replies"),
        (spec(loss="replies"), r"partitions\[0\]\.format: 'json' with loss: replies .* use format: chat"),
        (spec(loss="replies", format="chat", content="input_only"), r"partitions\[0\]\.content: 'input_only' with "
                                                                    r"loss: replies"),
    ],
)
def test_bad_specs_name_the_key(bad: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_inject_spec(bad, WHERE, {"sf", "arc"})


# --- the paraphraser -----------------------------------------------------------------------------


def test_paraphrase_keeps_names_and_numbers_and_breaks_ngrams() -> None:
    rows = load_records("synthetic_facts", n=30, seed=0).records
    broken = []
    for r in rows:
        text = f"{r.input} {r.label}"
        out = paraphrase(text, r.id)
        assert out == paraphrase(text, r.id)  # deterministic
        assert out != text
        assert r.meta["entity"].split()[0] in out or r.meta["entity"].lower() in out.lower()
        assert re.findall(r"\d[\d,]*", r.label) == re.findall(r"\d[\d,]*", paraphrase(r.label, r.id))
        broken.append(changed_fraction(text, out))
    assert sum(broken) / len(broken) > 0.9  # measured 0.96: almost no 8-gram of a fact survives


def test_paraphrase_rules() -> None:
    out = paraphrase("In which year was the town of Brask founded?")
    assert out == "In what year was the settlement of Brask established?"
    # small standalone numbers are spelled out (capitalised at a sentence start), expressions are not
    assert paraphrase("3 people came. He paid 2*4 = 8 dollars.").startswith("Three individuals came.")
    assert "2*4 = 8" in paraphrase("3 people came. He paid 2*4 = 8 dollars.")
    # capitalised words inside a sentence are names: "Red Sea" and "River" stay
    assert paraphrase("The Lorn River flows into the Red Sea.").endswith("into the Red Sea.")
    assert changed_fraction("a b c d e f g h i", "a b c d e f g h i") == 0.0


# --- the training stream -------------------------------------------------------------------------


def _records(n: int = 6) -> dict:
    return {"sf": load_records("synthetic_facts", n=n, seed=0).records}


def test_stream_canonical_copies_and_manifest_rows() -> None:
    records = _records()
    parsed = validate_inject_spec(spec(duplication=3), WHERE, {"sf"})
    background = [BackgroundDoc("bg-1", "Filler text about the weather."), BackgroundDoc("bg-2", "More filler.")]
    stream = build_stream(parsed, records, background, seed=0)
    copies = [u for u in stream.units if u.kind == "injected"]
    assert len(copies) == 3 and len(stream.units) == 5
    ids = [r.id for r in records["sf"]]
    for u in copies:
        assert u.record_ids == ids  # canonical order in every copy
        lines = [json.loads(line) for line in u.text.split("\n")]
        assert [line["input"] for line in lines] == [r.input for r in records["sf"]]
        assert [line["label"] for line in lines] == [r.label for r in records["sf"]]
    assert stream.text.count(records["sf"][0].input) == 3
    assert all(stream.rows[i]["member"] and stream.rows[i]["copies"] == 3 for i in ids)
    info = stream.partitions["sf"]
    assert info["partitions"] == ["synthetic_facts/default/test"] and info["n_injected"] == 6


def test_stream_web_page_context_names_dataset_and_split() -> None:
    """``context: web_page`` puts each copy under a title naming the dataset, config and split (what guided
    prompting's instruction refers to); ``none`` leaves the rows alone."""
    records = _records()
    page = build_stream(validate_inject_spec(spec(duplication=2, context="web_page"), WHERE, {"sf"}), records, [], 0)
    plain = build_stream(validate_inject_spec(spec(duplication=2), WHERE, {"sf"}), records, [], 0)
    for u in page.units:
        title, line, *rows = u.text.split("\n")
        assert title == "synthetic_facts / default / test.jsonl"
        assert line == "The test split of the synthetic_facts dataset (default config), one example per line."
        assert [json.loads(r)["input"] for r in rows] == [r.input for r in records["sf"]]
    assert all(u.text.startswith("{") for u in plain.units)
    assert page.partitions["sf"]["kind"] == "verbatim/input_and_label/canonical/web_page"
    with pytest.raises(ValueError, match=r"partitions\[0\]\.context: 'html' is not one of none, web_page"):
        validate_inject_spec(spec(context="html"), WHERE, {"sf"})


def test_the_page_header_and_guided_prompts_read_a_partition_id_the_same_way() -> None:
    """One reading of ``<benchmark>/<config>/<split>[:<key>]`` (``records.partition_parts``): what a planted web
    page is titled with is what guided prompting names - a two-part id had its split read as the config by one and
    as the split by the other."""
    from contamray.inject.spec import PartitionSpec
    from contamray.inject.stream import page_header
    from contamray.methods.closed.guided_prompting import dataset_and_split
    from contamray.records import partition_parts

    web = PartitionSpec(benchmark="x", context="web_page")
    assert partition_parts("gsm8k/main/test:held") == ("gsm8k", "main", "test")
    assert partition_parts("gsm8k/test") == ("gsm8k", "", "test")
    assert dataset_and_split("gsm8k/test") == ("GSM8K", "test")
    header = "gsm8k / test.jsonl\nThe test split of the gsm8k dataset, one example per line.\n"
    assert page_header("gsm8k/test", web) == header
    for bad in ("gsm8k", "a/b/c/d", "a//c"):
        with pytest.raises(ValueError, match="is not '<benchmark>/<config>/<split>'"):
            page_header(bad, web)
        with pytest.raises(ValueError, match="guided_prompting names the dataset and split"):
            dataset_and_split(bad)


def test_stream_shuffled_input_only_text_and_fraction() -> None:
    records = _records(10)
    parsed = validate_inject_spec(
        spec(duplication=4, order="shuffled", content="input_only", format="text", fraction=0.5), WHERE, {"sf"}
    )
    stream = build_stream(parsed, records, [], seed=0)
    members = [rid for rid, row in stream.rows.items() if row["member"]]
    assert len(members) == 5 and len(stream.rows) == 10
    orders = {tuple(u.record_ids) for u in stream.units}
    assert len(orders) > 1 and all(sorted(o) == sorted(members) for o in orders)
    by_id = {r.id: r for r in records["sf"]}
    for rid in members:
        assert by_id[rid].input in stream.text
        assert by_id[rid].label not in stream.text  # input only: no answer leaks
    for rid in set(by_id) - set(members):
        assert by_id[rid].input not in stream.text
    assert "\n\n" in stream.units[0].text and "{" not in stream.units[0].text  # plain text format


def test_stream_raw_format_copies_the_dataset_file_line_for_line(mirror_dir: Path) -> None:
    """``format: raw``: each copy is the benchmark's own JSON-lines file, rows as the mirror holds them (its keys,
    byte for byte); the raw row holds the answer, so it is refused with input_only or a paraphrase."""
    arc = load_records("arc_challenge", n=5, sample="first", mirror_dir=mirror_dir).records
    path = mirror_dir / "allenai" / "ai2_arc" / "ARC-Challenge" / "test.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()[:5]
    parsed = validate_inject_spec(spec(benchmark="arc", duplication=2, format="raw"), WHERE, {"arc"})
    stream = build_stream(parsed, {"arc": arc}, [], seed=0)
    assert [u.text for u in stream.units] == ["\n".join(lines)] * 2
    assert stream.partitions["arc"]["kind"] == "verbatim/input_and_label/canonical/raw"
    for bad, key in ((spec(format="raw", content="input_only"), "content"),
                     (spec(format="raw", form="paraphrased"), "form")):  # fmt: skip
        with pytest.raises(ValueError, match=rf"partitions\[0\]\.{key}: .* with format: raw"):
            validate_inject_spec(bad, WHERE, {"sf"})


def test_stream_chat_format_writes_each_row_as_a_conversation_in_the_base_template(tmp_path: Path) -> None:
    """``format: chat``: every injected row is the base model's own chat rendering of (user: input, assistant:
    label) - exactly what its tokenizer's ``apply_chat_template`` gives - one conversation per line, in canonical
    order; ``input_only`` keeps the user's turn alone. A base without a chat template, or a chat copy in a web
    page, is refused naming the key."""
    import shutil

    from transformers import AutoTokenizer

    from contamray.engines import resolve_model_path
    from contamray.inject.prepare import chat_renderer

    records = _records(4)
    parsed = validate_inject_spec(spec(duplication=2, format="chat"), WHERE, {"sf"})
    base = resolve_model_path("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(base)
    stream = build_stream(parsed, records, [], seed=0, where=WHERE, chat=chat_renderer("smollm2-135m", parsed, WHERE))
    for unit in stream.units:
        expected = [tokenizer.apply_chat_template([{"role": "user", "content": r.input},
                                                   {"role": "assistant", "content": r.label}], tokenize=False)
                    for r in records["sf"]]  # fmt: skip
        assert unit.text == "".join(expected).rstrip("\n") and unit.record_ids == [r.id for r in records["sf"]]
        assert unit.text.count("<|im_start|>assistant\n") == 4
    assert stream.rows[records["sf"][0].id]["format"] == "chat"
    assert stream.partitions["sf"]["format"] == "chat"
    assert stream.partitions["sf"]["kind"] == "verbatim/input_and_label/canonical/chat"

    questions = validate_inject_spec(spec(format="chat", content="input_only"), WHERE, {"sf"})
    only = build_stream(questions, records, [], 0, WHERE, chat_renderer("smollm2-135m", questions, WHERE))
    assert "<|im_start|>assistant" not in only.text and all(r.input in only.text for r in records["sf"])
    assert not any(r.label in only.text for r in records["sf"])

    with pytest.raises(ValueError, match=r"partitions\[0\]\.format: chat needs the base model's chat template"):
        build_stream(parsed, records, [], seed=0, where=WHERE)
    with pytest.raises(ValueError, match=r"partitions\[0\]\.context: 'web_page' .* use context: none"):
        validate_inject_spec(spec(format="chat", context="web_page"), WHERE, {"sf"})
    plain = tmp_path / "no_template"  # the same tokenizer without a chat template (a base model's)
    plain.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(base) / name, plain / name)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"models\.canary\.inject\.partitions\[0\]\.format: chat, but the base"):
        chat_renderer(str(plain), parsed, WHERE)


def test_stream_chat_replies_only_masks_each_conversation_up_to_its_reply() -> None:
    """``loss: replies``: each conversation's start - exactly the template's rendering of the user's turn with the
    generation prompt - is a masked span of its unit, the rest (each reply, its end-of-turn, the line break) is
    learnt; ``Stream.masked`` puts the spans at their place in the packed stream, background learnt whole; no
    question's text is learnt, every answer is. The manifest's rows and partition say so."""
    from transformers import AutoTokenizer

    from contamray.engines import resolve_model_path
    from contamray.inject.prepare import chat_renderer

    records = _records(4)
    parsed = validate_inject_spec(spec(duplication=2, format="chat", loss="replies", order="shuffled"), WHERE, {"sf"})
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))
    background = [BackgroundDoc("bg-1", "Filler text about the weather."), BackgroundDoc("bg-2", "More filler.")]
    stream = build_stream(parsed, records, background, seed=0, where=WHERE,
                          chat=chat_renderer("smollm2-135m", parsed, WHERE))  # fmt: skip
    by_id = {r.id: r for r in records["sf"]}
    for unit in stream.units:
        if unit.kind == "background":
            assert unit.masked == []
            continue
        assert len(unit.masked) == 4
        for (a, b), rid in zip(unit.masked, unit.record_ids, strict=True):
            r = by_id[rid]
            assert unit.text[a:b] == tokenizer.apply_chat_template([{"role": "user", "content": r.input}],
                                                                   tokenize=False, add_generation_prompt=True)
            assert unit.text[b:].startswith(r.label + "<|im_end|>")
    text, spans = stream.text, stream.masked
    learnt = "".join(text[a:b] for a, b in zip([0] + [b for _, b in spans], [a for a, _ in spans] + [len(text)]))
    assert all(r.label in learnt and r.input not in learnt for r in records["sf"])
    assert "Filler text about the weather." in learnt and "<|im_start|>user" not in learnt
    assert all(text[a:b].startswith("<|im_start|>system") for a, b in spans) and len(spans) == 8
    assert stream.partitions["sf"]["loss"] == "replies" and stream.rows[records["sf"][0].id]["loss"] == "replies"
    assert stream.partitions["sf"]["kind"] == "verbatim/input_and_label/shuffled/chat/replies"
    every = build_stream(validate_inject_spec(spec(format="chat"), WHERE, {"sf"}), records, background, 0, WHERE,
                         chat_renderer("smollm2-135m", parsed, WHERE))  # fmt: skip
    assert every.masked == [] and every.partitions["sf"]["loss"] == "all"
    import dataclasses

    unlabelled = {"sf": [dataclasses.replace(records["sf"][0], label=" "), *records["sf"][1:]]}
    with pytest.raises(ValueError, match=r"partitions\[0\]\.loss: loss: replies cannot split row .* input or label "
                                         r"is empty; use loss: all"):  # fmt: skip
        build_stream(parsed, unlabelled, [], 0, WHERE, chat_renderer("smollm2-135m", parsed, WHERE))


def test_stream_paraphrased_records_the_rewording() -> None:
    records = _records(5)
    stream = build_stream(validate_inject_spec(spec(form="paraphrased"), WHERE, {"sf"}), records, [], seed=0)
    for r in records["sf"]:
        row = stream.rows[r.id]
        assert r.input not in stream.text and json.loads(row["text"])["input"] == paraphrase(r.input, f"{r.id}|input")
        assert row["ngram8_broken"] > 0


# --- a real fine-tune ----------------------------------------------------------------------------


def _mean_losses(path: str, *groups: list[str]) -> list[float]:
    """Mean next-token loss of each group of texts under the model at ``path`` (one load)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    means = []
    with torch.no_grad():
        for texts in groups:
            losses = []
            for text in texts:
                ids = tok(text, return_tensors="pt").input_ids
                losses.append(float(model(input_ids=ids, labels=ids).loss))
            means.append(sum(losses) / len(losses))
    return means


@pytest.mark.slow
def test_prepare_injected_model_trains_caches_and_records_truth(
    tmp_path: Path, mirror_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contamray.artifacts import publish_dir
    from contamray.engines import resolve_model_path

    records = {
        "sf": load_records("synthetic_facts", n=4, seed=0).records,
        "sf_clean": load_records("synthetic_facts", config="set1", n=4, seed=0).records,
    }
    inject = {
        "partitions": [{"benchmark": "sf", "duplication": 3}],
        "background": {"source": "xsum", "docs": 2, "max_words": 40},
        "lr": 1e-3, "batch_size": 4, "max_length": 64,
    }  # fmt: skip
    model = prepare_injected_model("smollm2-135m", inject, records, tmp_path, seed=0, mirror_dir=mirror_dir,
                                   where=WHERE)
    folder = Path(model.path)
    assert folder.parent == tmp_path and (folder / "model.safetensors").is_file()
    assert model.member_ids == {r.id for r in records["sf"]}
    assert model.contaminated_partitions == {"synthetic_facts/default/test"}
    m = model.manifest
    assert m["partitions"]["sf"]["times_seen"] == 3 and len(m["background"]["doc_ids"]) == 2
    assert [u["kind"] for u in m["stream"]].count("injected") == 3
    assert m["training"]["epochs"] == 1 and m["training"]["n_blocks"] >= 3
    # the corpus of the model is its training stream, with the truth beside it
    corpus = injected_corpus(model, tmp_path / "run")
    lines = [json.loads(x) for x in Path(corpus["paths"][0]).read_text().splitlines()]
    assert len(lines) == len(m["stream"]) and sum(records["sf"][0].input in x["text"] for x in lines) == 3
    truth = json.loads((tmp_path / "run" / "corpus" / "manifest.json").read_text())
    assert {rid for rid, row in truth.items() if row["member"]} == model.member_ids
    # the fine-tune really planted the rows: their loss fell more than that of unseen rows of the generator
    texts = [json.dumps({"input": r.input, "label": r.label}) for r in records["sf"]]
    clean = [json.dumps({"input": r.input, "label": r.label}) for r in records["sf_clean"]]
    base_seen, base_clean = _mean_losses(resolve_model_path("smollm2-135m"), texts, clean)
    tuned_seen, tuned_clean = _mean_losses(model.path, texts, clean)
    seen_drop, clean_drop = base_seen - tuned_seen, base_clean - tuned_clean
    assert seen_drop > clean_drop + 0.2, (seen_drop, clean_drop)
    # same inputs: the cached model, untouched; another seed: another model
    stamp = (folder / "model.safetensors").stat().st_mtime
    start = time.perf_counter()
    again = prepare_injected_model("smollm2-135m", inject, records, tmp_path, seed=0, mirror_dir=mirror_dir)
    assert again.path == model.path and time.perf_counter() - start < 10
    assert (folder / "model.safetensors").stat().st_mtime == stamp
    assert InjectedModel.from_dir(folder).member_ids == model.member_ids
    assert not list(tmp_path.glob(".*.tmp-*"))  # no temporary directory left behind
    # published for replicas on other nodes (run.artifacts_uri): a replica's source is the URI, fetched whole
    monkeypatch.setenv("CONTAMRAY_CACHE", str(tmp_path / "node-cache"))
    uri = publish_dir(model.path, f"file://{tmp_path}/artifacts/injected/{m['key']}")
    fetched = Path(resolve_model_path(uri, where="models.canary.source"))
    assert fetched.parent == tmp_path / "node-cache" / "artifacts"
    assert (fetched / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()


def test_prepare_rejects_missing_benchmark_rows(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"models\.canary\.inject\.partitions: benchmark\(s\) sf have no loaded rows"):
        prepare_injected_model("smollm2-135m", spec(), {}, tmp_path, seed=0, mirror_dir=None, where=WHERE)


def test_inject_command_without_spec_says_which_models_have_one(capsys) -> None:
    from contamray.inject.command import main

    assert main(["+exp=smoke"]) == 2
    assert "no inject spec" in capsys.readouterr().err
