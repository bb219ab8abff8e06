"""The held-out accuracy gap (``heldout_accuracy``): per-example margins from option scores, and the partition test.

Known answers: hand-built option scores (a right and a wrong answer, their margins; a partition answered surer than
its held-out is flagged, one answered alike is not), and a real model - the embedded SmolLM2-135M fine-tuned on 16
ARC-Challenge questions with their answers - whose seen rows are flagged against a held-out block of the split,
while two blocks it never saw are not.
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


def _record(i: int, partition: str, gold: int = 1) -> Record:
    choices = ("red", "green", "blue")
    return Record(id=f"q{i}", partition=partition, input=f"question {i}?", label=choices[gold], reference="",
                  task="multiple_choice", choices=choices, answer="ABC"[gold], order=i, meta={})  # fmt: skip


def _outputs(record: Record, option_logprobs: list[float]) -> dict[str, Output]:
    """The prompt scored as 3 tokens, each option as one more token of the given log-probability."""
    prompt = [-1.0, -1.0, -1.0]
    outs = {f"{record.id}|prompt": Output(key=f"{record.id}|prompt", token_logprobs=prompt)}
    for k, lp in enumerate(option_logprobs):
        outs[f"{record.id}|{k}"] = Output(key=f"{record.id}|{k}", token_logprobs=[*prompt, lp])
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
    """A chat model's format written into the template: the options listed with letters, each answer 'B. green'
    right after the assistant header (no separator)."""
    record = _record(0, "b/test")
    chat = "<|im_start|>user\n{input}\n{choices}<|im_end|>\n<|im_start|>assistant\n"
    cfg = METHOD.make_config({"template": chat, "answer": "letter_option", "separator": ""})
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

    guessing = [(-1) ** i * 0.05 * (i % 7) for i in range(30)]
    seen = side("b/test:rows", [1.3 + 0.01 * i for i in range(30)], 0)
    reference = side("b/test:ref", guessing, 1)
    verdict = METHOD.settle(decide_rows(seen, reference, cfg), cfg)
    assert verdict.decision == "contaminated" and verdict.p_value < 1e-6, verdict.details.get("summary")
    assert verdict.rate == 1.0 and verdict.details["reference_rate"] < 0.7
    alike = side("b/test:rows", guessing[::-1], 0)
    assert METHOD.settle(decide_rows(alike, reference, cfg), cfg).decision == "clean"
    alone = METHOD.settle(decide_rows(seen, [], cfg), cfg)
    assert alone.decision == "inconclusive" and "reference" in alone.reason


def decide_rows(own: list[dict], reference: list[dict], cfg):
    import pandas as pd

    rows = [dict(r, is_reference=False) for r in own] + [dict(r, is_reference=True) for r in reference]
    return METHOD.reduce(pd.DataFrame(rows), cfg)


@pytest.mark.slow
def test_a_model_fine_tuned_on_questions_with_answers_is_flagged_on_them_and_not_on_unseen_blocks(
    mirror_dir: Path, tmp_path: Path
) -> None:
    """ARC-Challenge test rows 0-15 written as "Question: ...\\nAnswer: <gold option>" (the method's own prompt),
    5 epochs of the embedded model; rows 16-31 (never trained on) are the held-out. Rows 32-47 against 48-63: both
    unseen, not flagged. Measured (2026-11-28): seen accuracy 1.00 vs 0.44, p = 9e-7; unseen 0.31 vs 0.25,
    p = 0.19. One slice each, not a rate: the rate on public benchmarks under the base model is
    ``contamray calibrate``'s (README)."""
    from contamray.benchmarks import load_records
    from contamray.engines import resolve_model_path
    from contamray.engines.hf import HFEngine
    from contamray.inject import finetune_causal_lm
    from contamray.validate.calibrate import SharedEngines

    rows = load_records("arc_challenge", n=64, sample="first", mirror_dir=mirror_dir).records

    def block(a: int, b: int) -> list[Record]:
        return [dataclasses.replace(r, partition=f"{r.partition}:rows{a}-{b - 1}") for r in rows[a:b]]

    seen, held, clean, clean_ref = block(0, 16), block(16, 32), block(32, 48), block(48, 64)
    texts = [f"Question: {r.input}\nAnswer: {r.label}" for r in seen]
    path = finetune_causal_lm(resolve_model_path("smollm2-135m"), texts, tmp_path / "model", epochs=5, lr=3e-4,
                              batch_size=4, seed=0, max_length=256)  # fmt: skip
    engines = SharedEngines({"target": HFEngine(path, dtype="float32", batch_size=16)})
    cfg = METHOD.make_config({"reference": "heldout", "units": "rows"})  # ARC's order carries no structure

    def verdict(part: list[Record], ref: list[Record]):
        return decide(METHOD, cfg, engines.run(METHOD, part, cfg), engines.run(METHOD, ref, cfg))

    flagged = verdict(seen, held)
    assert flagged.decision == "contaminated", (flagged.p_value, flagged.details.get("summary"))
    assert flagged.rate > flagged.details["reference_rate"]
    unseen = verdict(clean, clean_ref)
    assert unseen.decision != "contaminated", (unseen.p_value, unseen.details.get("summary"))
