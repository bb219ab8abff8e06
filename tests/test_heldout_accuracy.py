"""The held-out accuracy gap (``heldout_accuracy``): per-example margins from option scores, and the partition test.

Known answers: hand-built option scores (a right and a wrong answer, their margins; a partition answered surer than
its held-out is flagged, one answered alike is not), and a real model - the embedded SmolLM2-135M fine-tuned on 16
ARC-Challenge questions with their answers - whose seen rows are flagged against a held-out block of the split,
while two blocks it never saw are not; and the same as a chat model (the rows as conversations in its chat template),
missed by the raw prompt and found by ``chat: both`` through its chat form.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from contamray.methods.base import Output, get_method
from contamray.methods.closed.heldout_accuracy import gold_margin
from contamray.records import Record
from contamray.validate.calibrate import decide

METHOD = get_method("heldout_accuracy")
EPOCHS = 3  # of the fine-tunes below (5 until 2026-11-28: the same verdicts, both tests measured at 3)


def _record(i: int, partition: str, gold: int = 1) -> Record:
    choices = ("red", "green", "blue")
    return Record(id=f"q{i}", partition=partition, input=f"question {i}?", label=choices[gold], reference="",
                  task="multiple_choice", choices=choices, answer="ABC"[gold], order=i, meta={})  # fmt: skip


def _outputs(record: Record, option_logprobs: list[float], tag: str = "") -> dict[str, Output]:
    """The prompt scored as 3 tokens, each option as one more token of the given log-probability (``tag``: the
    keys of a second prompt form, ``chat: both``, whose answers say where the reply starts instead of a request for
    the prompt alone: its 4 tokens, the first without a log-probability)."""
    prompt = [-1.0, -1.0, -1.0]
    part = f"{tag}/" if tag else ""
    outs = {} if tag == "chat" else {f"{record.id}|prompt": Output(key=f"{record.id}|prompt", token_logprobs=prompt)}
    for k, lp in enumerate(option_logprobs):
        key = f"{record.id}|{part}{k}"
        outs[key] = Output(key=key, token_logprobs=[*prompt, lp], prompt_tokens=4 if tag == "chat" else 0)
    return outs


def test_the_margin_is_the_gold_options_log_probability_over_the_best_other_and_its_sign_is_correctness() -> None:
    cfg = METHOD.make_config({})
    record = _record(0, "b/test")
    requests = METHOD.requests([record], cfg, 0, {})
    assert [r.text for r in requests] == ["Question: question 0?\nAnswer:"] + [
        f"Question: question 0?\nAnswer: {c}" for c in record.choices
    ]
    right = METHOD.score([record], _outputs(record, [-3.0, -0.5, -2.0]), cfg)[0]
    assert right["correct"] == 1.0 and right["gold_margin"] == pytest.approx(2.5 - 1.0)  # -0.5 - (-2.0)
    wrong = METHOD.score([record], _outputs(record, [-0.2, -0.5, -2.0]), cfg)[0]
    assert wrong["correct"] == 0.0 and wrong["gold_margin"] == pytest.approx(-0.3)
    assert gold_margin([math.exp(1.0), math.exp(2.0)], 0) == pytest.approx(1.0)  # perplexities e^1, e^2
    failed = METHOD.score([record], {}, cfg)[0]
    assert "prompt score missing" in failed["error"] and failed["gold_margin"] is None


def test_other_formats_list_the_options_and_answer_by_letter_and_a_bad_format_names_the_key() -> None:
    """An instruct model's format (``chat``): the question with its options lettered is the user turn (the engine
    renders it in the model's chat template), each answer 'B. green' the assistant's reply, no separator; the
    same markup may instead be written into the template (the engines read special tokens in text)."""
    record = _record(0, "b/test")
    cfg = METHOD.make_config({"template": "{input}\n{choices}", "answer": "letter_option", "chat": True})
    requests = METHOD.requests([record], cfg, 0, {})
    assert all(r.kind == "score" and r.chat for r in requests)
    assert {r.text for r in requests} == {"question 0?\nA. red\nB. green\nC. blue"}
    assert [r.reply for r in requests] == ["A. red", "B. green", "C. blue"]  # each answer says where its reply starts
    markup = "<|im_start|>user\n{input}\n{choices}<|im_end|>\n<|im_start|>assistant\n"
    cfg = METHOD.make_config({"template": markup, "answer": "letter_option", "separator": ""})
    prompt, *answers = [r.text for r in METHOD.requests([record], cfg, 0, {})]
    assert prompt == "<|im_start|>user\nquestion 0?\nA. red\nB. green\nC. blue<|im_end|>\n<|im_start|>assistant\n"
    assert answers == [prompt + "A. red", prompt + "B. green", prompt + "C. blue"]
    letter = METHOD.make_config({"template": "{input}\n{choices}\nAnswer:", "answer": "letter"})
    assert [r.text[-3:] for r in METHOD.requests([record], letter, 0, {})][1:] == [": A", ": B", ": C"]
    with pytest.raises(ValueError, match=r"methods.heldout_accuracy.answer: 'number' is not one of option, letter"):
        METHOD.make_config({"answer": "number"})


def test_a_partition_answered_surer_than_its_heldout_is_flagged_and_one_answered_alike_is_not() -> None:
    """30 rows a side, rows independent (random draws of the split: ``order`` far apart). Seen: the gold option
    at -0.2 against -1.5 for the others (margin 1.3); held-out: margins spread around 0, as a model that guesses."""
    cfg = METHOD.make_config({"reference": {"b": "b_ref"}})

    def side(partition: str, margins: list[float], start: int) -> list[dict]:
        rows = []
        for i, m in enumerate(margins):
            record = _record(start + 10 * i, partition)
            (row,) = METHOD.score([record], _outputs(record, [-1.5, -1.5 + m, -1.6]), cfg)
            rows.append(row)
        return rows

    guessing = [(-1) ** i * 0.05 * (i % 7) + 1e-4 * i for i in range(30)]  # margins: distinct, as real ones are
    seen = side("b/test:rows", [1.3 + 0.01 * i for i in range(30)], 0)
    reference = side("b/test:ref", guessing, 1)
    verdict = METHOD.settle(decide_rows(seen, reference, cfg), cfg)
    assert verdict.decision == "contaminated" and verdict.p_value < 1e-6, verdict.details.get("summary")
    assert verdict.rate == 1.0 and verdict.details["reference_rate"] < 0.7
    alike = side("b/test:rows", guessing[::-1], 0)
    assert METHOD.settle(decide_rows(alike, reference, cfg), cfg).decision == "clean"
    alone = METHOD.settle(decide_rows(seen, [], cfg), cfg)
    assert alone.decision == "inconclusive" and "reference" in alone.reason


def test_both_prompt_forms_decide_by_one_joint_test() -> None:
    """``chat: both``: every example asked raw and as a chat turn. A model that learned the answers as chat replies
    (sure of them in the chat form only) is flagged by the joint test of the two forms, at most twice the chat form's
    p; one that answers alike in both forms is clean; the raw form keeps ``chat: false``'s columns, the chat form's
    get ``_chat``."""
    cfg = METHOD.make_config({"reference": {"b": "b_ref"}, "chat": "both"})
    requests = METHOD.requests([_record(0, "b/test")], cfg, 0, {})
    assert [r.key for r in requests] == ["q0|prompt", "q0|0", "q0|1", "q0|2",
                                         "q0|chat/0", "q0|chat/1", "q0|chat/2"]  # fmt: skip
    assert [r.chat for r in requests] == [False] * 4 + [True] * 3
    assert [r.reply for r in requests[4:]] == ["red", "green", "blue"]  # no separator before a reply

    guessing = [(-1) ** i * 0.05 * (i % 7) + 1e-4 * i for i in range(30)]  # margins: distinct, as real ones are

    def side(partition: str, raw: list[float], chat: list[float], start: int) -> list[dict]:
        rows = []
        for i, (m_raw, m_chat) in enumerate(zip(raw, chat, strict=True)):
            record = _record(start + 10 * i, partition)
            got = _outputs(record, [-1.5, -1.5 + m_raw, -1.6]) | _outputs(record, [-1.5, -1.5 + m_chat, -1.6], "chat")
            (row,) = METHOD.score([record], got, cfg)
            rows.append(row)
        return rows

    reference = side("b/test:ref", [g + 5e-5 for g in guessing], guessing[::-1], 1)
    learned = side("b/test:rows", guessing[::-1], [1.3 + 0.01 * i for i in range(30)], 0)
    assert learned[0]["gold_margin_chat"] > 1.2 and learned[0]["correct_chat"] == 1.0 and "gold_chat" not in learned[0]
    verdict = METHOD.settle(decide_rows(learned, reference, cfg), cfg)
    chat_p = verdict.details["by_column"]["gold_margin_chat"]["p_value"]
    assert verdict.decision == "contaminated" and chat_p * (1 - 1e-6) <= verdict.p_value <= 2 * chat_p * (1 + 1e-6)
    assert "joint test of the 2 prompt forms over the same 30 + 30 units" in verdict.details["summary"]
    alike = side("b/test:rows", guessing[::-1], guessing, 0)
    assert METHOD.settle(decide_rows(alike, reference, cfg), cfg).decision == "clean"
    with pytest.raises(ValueError, match=r"methods.heldout_accuracy.chat must be false .* or both"):
        METHOD.make_config({"chat": "sometimes"})


def decide_rows(own: list[dict], reference: list[dict], cfg):
    import pandas as pd

    rows = [dict(r, is_reference=False) for r in own] + [dict(r, is_reference=True) for r in reference]
    return METHOD.reduce(pd.DataFrame(rows), cfg)


def _arc_blocks(mirror_dir: Path) -> tuple[list[Record], ...]:
    """ARC-Challenge test rows 0-15 (to be seen), 16-31 (their held-out), 32-47 and 48-63 (an unseen pair)."""
    from contamray.benchmarks import load_records

    rows = load_records("arc_challenge", n=64, sample="first", mirror_dir=mirror_dir).records

    def block(a: int, b: int) -> list[Record]:
        return [dataclasses.replace(r, partition=f"{r.partition}:rows{a}-{b - 1}") for r in rows[a:b]]

    return block(0, 16), block(16, 32), block(32, 48), block(48, 64)


def _verdicts(texts: list[str], out_dir: Path, cfg, pairs: list[tuple[list[Record], list[Record]]]) -> list:
    """The embedded model fine-tuned on ``texts`` (``EPOCHS``), and the method's verdict on each (partition,
    held-out) pair."""
    from contamray.engines import resolve_model_path
    from contamray.engines.hf import HFEngine
    from contamray.inject import finetune_causal_lm
    from contamray.validate.calibrate import SharedEngines

    path = finetune_causal_lm(resolve_model_path("smollm2-135m"), texts, out_dir, epochs=EPOCHS, lr=3e-4,
                              batch_size=4, seed=0, max_length=256)  # fmt: skip
    engines = SharedEngines({"target": HFEngine(path, dtype="float32", batch_size=16)})
    return [decide(METHOD, cfg, engines.run(METHOD, part, cfg), engines.run(METHOD, ref, cfg)) for part, ref in pairs]


@pytest.mark.slow
def test_a_model_fine_tuned_on_questions_with_answers_is_flagged_on_them_and_not_on_unseen_blocks(
    mirror_dir: Path, tmp_path: Path
) -> None:
    """ARC-Challenge test rows 0-15 written as "Question: ...\nAnswer: <gold option>" (the method's own prompt),
    3 epochs of the embedded model; rows 16-31 (never trained on) are the held-out. Rows 32-47 against 48-63: both
    unseen, not flagged. Measured (2026-11-28): seen AUC 0.98, p = 2.0e-6; unseen AUC 0.60, p = 0.18 (after 5
    epochs: seen accuracy 1.00 vs 0.44, p = 9e-7; unseen 0.31 vs 0.25, p = 0.19). One slice each, not a rate: the
    rate on public benchmarks under the base model is ``contamray calibrate``'s (README)."""
    seen, held, clean, clean_ref = _arc_blocks(mirror_dir)
    texts = [f"Question: {r.input}\nAnswer: {r.label}" for r in seen]
    cfg = METHOD.make_config({"reference": "heldout", "units": "rows"})  # ARC's order carries no structure
    flagged, unseen = _verdicts(texts, tmp_path / "model", cfg, [(seen, held), (clean, clean_ref)])
    print("raw:", flagged.details.get("summary"), "| unseen:", unseen.details.get("summary"))
    assert flagged.decision == "contaminated", (flagged.p_value, flagged.details.get("summary"))
    assert flagged.rate > flagged.details["reference_rate"]
    assert unseen.decision != "contaminated", (unseen.p_value, unseen.details.get("summary"))


@pytest.mark.slow
def test_a_chat_model_fine_tuned_on_conversations_is_flagged_in_its_chat_form(mirror_dir: Path, tmp_path: Path) -> None:
    """Supervised fine-tuning's form: each of rows 0-15 one conversation in the model's chat template (the user's
    question with its lettered options, the assistant's "C. <option>"), 3 epochs; ``chat: both`` with that prompt
    (``template: "{input}\\n{choices}"``, ``answer: letter_option``) flags the rows against 16-31 - by the chat form,
    whose own test is the surer of the two - and leaves the unseen pair clean. Measured (2026-11-28): raw prompt AUC
    0.55, p = 0.33 (missed alone); chat template AUC 0.94, p = 1.3e-5; Bonferroni p = 2.6e-5 (the
    joint test since 2026-11-30: between the two). Unseen pair: raw AUC
    0.53, chat 0.44, p = 0.81 (after 5 epochs: raw 0.60, p = 0.17; chat 0.93, p = 2.2e-5; unseen p = 0.49)."""
    from transformers import AutoTokenizer

    from contamray.engines import resolve_model_path
    from contamray.methods.closed.clean_dirty_eval import gold_index
    from contamray.methods.closed.heldout_accuracy import prompt_and_answers

    seen, held, clean, clean_ref = _arc_blocks(mirror_dir)
    cfg = METHOD.make_config({"reference": "heldout", "units": "rows", "chat": "both", "template": "{input}\n{choices}",
                              "answer": "letter_option"})  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))
    texts = []
    for r in seen:
        prompt, answers = prompt_and_answers(r, cfg, chat=True)
        turns = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answers[gold_index(r)]}]
        texts.append(tokenizer.apply_chat_template(turns, tokenize=False))
    flagged, unseen = _verdicts(texts, tmp_path / "model", cfg, [(seen, held), (clean, clean_ref)])
    assert flagged.decision == "contaminated", (flagged.p_value, flagged.details.get("summary"))
    by_column = flagged.details["by_column"]
    print("chat SFT:", flagged.details.get("summary"), "| unseen:", unseen.details.get("summary"))
    chat_p = by_column["gold_margin_chat"]["p_value"]
    assert chat_p * (1 - 1e-6) <= flagged.p_value <= 2 * chat_p * (1 + 1e-6)  # chat decided, jointly
    assert unseen.decision != "contaminated", (unseen.p_value, unseen.details.get("summary"))
