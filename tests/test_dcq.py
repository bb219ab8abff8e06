"""Data Contamination Quiz (Golchin & Surdeanu): quizzes, answers, the paper's range by hand, the offline synonym
perturbation, requests and rows with a scripted model, the held-out decision; and (slow) the seen vs unseen
partitions of a fine-tuned model."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from contamray.methods.base import Output, get_method
from contamray.methods.closed.dcq import (
    OPTIONS_PROMPT,
    POSITIONS,
    DCQConfig,
    Filtered,
    check_options,
    contamination_range,
    dataset_and_split,
    letter_counts,
    non_preferred,
    parse_answer,
    parse_options,
    quiz_options,
    quiz_prompt,
    swappable_words,
    synonym_perturbations,
)
from contamray.records import Record

ARC = "arc_challenge/ARC-Challenge/test"
QUESTIONS = [
    "A group of engineers wanted to know how different building designs would respond during an earthquake.",
    "Students placed a small plant near a window and observed that it grew toward the light after 3 days.",
    "A scientist measured the temperature of water in a large container every 10 minutes for 2 hours.",
    "Which process helps farmers protect their crops from harmful insects without using chemical sprays?",
    "An astronomer observes that a planet rotates faster after a meteorite impact. Which is the most likely effect?",
]


def record(i: int, text: str, partition: str = ARC, task: str = "multiple_choice", label: str = "") -> Record:
    return Record(id=f"r{i}", partition=partition, input=text, label=label, reference=text, task=task, order=i)


def scripted(method, records: list[Record], cfg: DCQConfig, pick) -> tuple[list[dict], list]:
    """Run the method's stages with ``pick(request) -> reply`` as the model; (rows, every request)."""
    outputs: dict[str, Output] = {}
    asked = []
    for stage in range(5):
        reqs = method.requests(records, cfg, stage, outputs)
        if not reqs:
            break
        asked += reqs
        outputs.update({r.key: Output(key=r.key, text=pick(r)) for r in reqs})
    return method.score(records, outputs, cfg), asked


def options_of(prompt: str) -> list[str]:
    """The options A-D shown in a quiz prompt."""
    body = prompt.split("---\n", 1)[1].split("\n\nE)\n", 1)[0]
    return [o.strip() for o in re.split(r"(?:^|\n\n)[A-D]\)\n", body)[1:]]


# ----------------------------------------------------------------------------- quizzes and answers


def test_quizzes_hide_the_original_in_the_given_position_only() -> None:
    perturbed = ["p1", "p2", "p3", "p4"]
    assert quiz_options(perturbed, "orig", None) == perturbed  # the bias detector quiz: no original
    for k, position in enumerate(POSITIONS):
        options = quiz_options(perturbed, "orig", position)
        others = [o for j, o in enumerate(options) if j != k]
        assert options[k] == "orig" and others == perturbed[:k] + perturbed[k + 1 :]
    prompt = quiz_prompt(quiz_options(perturbed, "orig", "C"), "ARC-Challenge", "test")
    assert "the test split of the ARC-Challenge dataset" in prompt and "EXACT WORDING" in prompt
    assert options_of(prompt) == ["p1", "p2", "orig", "p4"]
    assert "E)\nNone of the provided options." in prompt and prompt.endswith("ANSWER:")
    bare = quiz_prompt(quiz_options(perturbed, "orig", "C"), "ARC-Challenge", None)  # name_split: false
    assert "an instance from the ARC-Challenge dataset." in bare and "split" not in bare.split("---")[0]
    assert dataset_and_split(f"{ARC}:rows0-39") == ("ARC-Challenge", "test")  # a slice's suffix is no split
    assert dataset_and_split("gsm8k/main/test", {"gsm8k": "GSM-8K"}) == ("GSM-8K", "test")


def test_answer_parsing_takes_the_first_option_letter() -> None:
    for reply, letter in [("C", "C"), (" c", "C"), ("(b)", "B"), ("Answer: D", "D"), ("The answer is A.", "A"),
                          ("Option E", "E"), ("E) None of the provided options.", "E"), ("B)\nThe group", "B"),
                          ("I think it is option c", "C"), ("a cat sat", ""), ("A scientist maps", ""),
                          ("C is the one", "C"), ("A\n", "A"), ("", ""), ("None", "")]:  # fmt: skip
        assert parse_answer(reply) == letter, reply
    assert letter_counts(["A", "A", "", "E"]) == {"A": 2, "B": 0, "C": 0, "D": 0, "E": 1}


def test_non_preferred_positions_are_below_chance_among_five() -> None:
    assert non_preferred({"A": 10, "B": 2, "C": 6, "D": 0, "E": 2}, 20) == ["B", "D"]  # ceil(20 / 5) = 4
    assert non_preferred({"A": 4, "B": 4, "C": 5, "D": 4, "E": 3}, 20) == list("ABCD")  # none below: all four
    assert non_preferred({"A": 3, "B": 4, "C": 4, "D": 4, "E": 6}, 21) == list("ABCD")  # ceil(21 / 5) = 5


def test_contamination_range_by_hand() -> None:
    bdq = {"A": 10, "B": 2, "C": 6, "D": 0, "E": 2}
    # B first (12 originals): upper 12/20; kappa (12 - 2) / (20 - 2) = 0.556 > second best 9/20
    r = contamination_range({"B": 12, "D": 9}, bdq, 20)
    assert r["best_position"] == "B" and r["upper"] == pytest.approx(0.6)
    assert r["kappa"] == pytest.approx(10 / 18) and r["lower"] == pytest.approx(10 / 18)
    # a tie goes to the position with less BDQ bias (D: 0): kappa 9/20, second best 9/20
    r = contamination_range({"B": 9, "D": 9}, bdq, 20)
    assert r["best_position"] == "D" and r["upper"] == r["lower"] == pytest.approx(0.45)
    # the second best can be the lower bound: kappa (14 - 10) / (20 - 10) = 0.4 < 11/20
    r = contamination_range({"A": 14, "B": 11}, bdq, 20)
    assert r["kappa"] == pytest.approx(0.4) and r["lower"] == pytest.approx(0.55) and r["upper"] == pytest.approx(0.7)
    # one non-preferred position (the authors' code crashes): lower = kappa, clipped at 0
    one = {"A": 4, "B": 4, "C": 6, "D": 3, "E": 3}
    assert non_preferred(one, 20) == ["D"]
    r = contamination_range({"D": 8}, one, 20)
    assert r["upper"] == pytest.approx(0.4) and r["lower"] == pytest.approx(5 / 17)
    r = contamination_range({"D": 2}, one, 20)
    assert r["kappa"] == pytest.approx(-1 / 17) and r["lower"] == 0.0 and r["upper"] == pytest.approx(0.1)
    assert contamination_range({}, one, 20)["upper"] is None and contamination_range({"D": 1}, one, 0)["lower"] is None


# ----------------------------------------------------------------------------- perturbations


def test_synonym_perturbations_differ_keep_numbers_names_and_are_deterministic() -> None:
    text = "In 2004, Thomas Edison placed 3 small plants near a large window and observed them for 20 days."
    options = synonym_perturbations(text, "r1", seed=0)
    assert len(options) == 4 and len(set(options)) == 4 and text not in options
    for option in options:
        assert re.findall(r"\d+", option) == ["2004", "3", "20"]  # numbers kept, in place
        assert option.startswith("In 2004, Thomas Edison ") and option.endswith(" days.")  # names kept
        assert len(option.split()) >= len(text.split())  # words swapped, none dropped
    assert synonym_perturbations(text, "r1", seed=0) == options  # deterministic in (seed, record id)
    assert synonym_perturbations(text, "r1", seed=1) != options
    # "a"/"an" stay right: after "an", only the vowel-initial synonyms of "important" are kept
    assert [syn for _, _, syn in swappable_words("It was an important day.")] == [("essential",)]
    capital = synonym_perturbations("Students observed a small rock and a large rock.", "r2")
    assert all(o[0].isupper() for o in capital)
    with pytest.raises(Filtered, match="only 2 distinct word-level perturbation"):
        synonym_perturbations("Where do penguins live?", "r3")  # one swappable word, two synonyms


def test_judge_options_are_parsed_and_checked() -> None:
    reply = "A)\nThe first one.\n\nB)\nThe second one.\n\nC)\nThe third one.\n\nD)\nThe fourth one.\n---"
    assert parse_options(reply) == ["The first one.", "The second one.", "The third one.", "The fourth one."]
    check_options(parse_options(reply), "The original one.")
    with pytest.raises(ValueError, match=r"option\(s\) D missing"):
        check_options(parse_options("A)\nx\n\nB)\ny\n\nC)\nz"), "orig")
    with pytest.raises(ValueError, match="option B repeats the instance"):
        check_options(["x", "The  original one.", "y", "z"], "The original one.")
    with pytest.raises(ValueError, match="identical"):
        check_options(["x", "y", "y", "z"], "orig")
    assert "{text}" in OPTIONS_PROMPT and "DISTINCT" in OPTIONS_PROMPT and "WORD-LEVEL" in OPTIONS_PROMPT


# ----------------------------------------------------------------------------- requests and rows


def test_a_model_that_knows_the_originals_scores_one_a_letter_bias_scores_a_quarter() -> None:
    method = get_method("dcq")
    cfg = method.make_config({})
    records = [record(i, q) for i, q in enumerate(QUESTIONS)]
    originals = {r.id: r.input for r in records}

    def knows(req) -> str:  # picks the original when shown, else E
        shown = options_of(req.text)
        hit = [POSITIONS[k] for k, o in enumerate(shown) if o == originals[req.record_ids[0]]]
        return hit[0] if hit else "E"

    rows, asked = scripted(method, records, cfg, knows)
    assert len(asked) == 5 * len(records) and {r.stage for r in asked} == {0} and all(r.chat for r in asked)
    assert {r.key.split("|")[-1] for r in asked} == {"bdq", "bcq_A", "bcq_B", "bcq_C", "bcq_D"}
    assert all(r["score"] == 1.0 and r["n_bcq"] == 4 and r["bdq_answer"] == "E" and not r["error"] for r in rows)
    assert all(r["perturbed_by"] == "synonyms" and r["perturbation_1"] != r["instance"] for r in rows)
    rows, _ = scripted(method, records, cfg, lambda req: "A")  # always A: the original only when it is at A
    assert [r["score"] for r in rows] == [0.25] * len(records) and all(r["bcq_A"] == "A" for r in rows)
    # a failed quiz fails its row with the reason; a text the table cannot perturb is filtered, not failed
    short = record(9, "Where do penguins live?")
    reqs = method.requests(records[:1] + [short], cfg, 0, {})
    outs = {q.key: Output(key=q.key, text="B") for q in reqs}
    outs["r0|dcq|bcq_C"] = Output(key="r0|dcq|bcq_C", error="engine died")
    outs["r0|dcq|bcq_D"] = Output(key="r0|dcq|bcq_D", text="D", truncated=12)
    row, skipped = method.score(records[:1] + [short], outs, cfg)
    assert "engine died" in row["error"] and "12 tokens cut" in row["error"] and row["score"] is None
    assert skipped["filtered"].startswith("only 2 distinct") and not skipped["error"] and skipped["score"] is None


def test_non_preferred_mode_asks_the_bcq_after_the_bdq_and_classification_keeps_its_label() -> None:
    method = get_method("dcq")
    cfg = method.make_config({"positions": "non_preferred"})
    records = [record(i, q) for i, q in enumerate(QUESTIONS)]
    rows, asked = scripted(method, records, cfg, lambda req: "A")  # the BDQ always says A: B, C, D non-preferred
    assert [r.key for r in asked if r.stage == 0] == [f"r{i}|dcq|bdq" for i in range(5)]
    assert sorted({r.key.split("|")[-1] for r in asked if r.stage == 1}) == ["bcq_B", "bcq_C", "bcq_D"]
    assert all(r["bcq_A"] is None and r["n_bcq"] == 3 and r["score"] == 0.0 for r in rows)
    news = record(0, "Stocks rose quickly after the company reported large profits.", "ag_news/default/test",
                  "classification", "Business")  # fmt: skip
    rows, asked = scripted(method, [news], cfg, lambda req: "E")
    assert rows[0]["instance"].endswith("\nLabel: Business")
    assert all(rows[0][f"perturbation_{k}"].endswith("\nLabel: Business") for k in range(1, 5))
    assert "the test split of the AG News dataset" in asked[0].text


def test_the_judge_writes_the_options_in_stage_zero() -> None:
    method = get_method("dcq")
    cfg = method.make_config({"judge": True})
    assert method.engine_roles_for(cfg) == ("target", "judge")
    records = [record(0, QUESTIONS[0]), record(1, QUESTIONS[1])]
    good = "A)\nOne.\n\nB)\nTwo.\n\nC)\nThree.\n\nD)\nFour.\n"

    def model(req) -> str:
        if req.engine == "judge":
            assert req.stage == 0 and req.text.startswith("Turn the INPUT TEXT")
            assert f"INPUT TEXT:\n{QUESTIONS[int(req.record_ids[0][1:])]}\n---" in req.text
            return good if req.record_ids[0] == "r0" else "I cannot help with that."
        return "C"

    rows, asked = scripted(method, records, cfg, model)
    assert [r.engine for r in asked[:2]] == ["judge", "judge"] and {r.stage for r in asked[2:]} == {1}
    assert rows[0]["perturbed_by"] == "judge" and rows[0]["perturbation_3"] == "Three." and rows[0]["score"] == 0.25
    assert "the judge's options are unusable: option(s) A, B, C, D missing" in rows[1]["error"]


# ----------------------------------------------------------------------------- the partition


def _rows(originals: list[int], partition: str, is_reference: bool, bdq: str = "E") -> list[dict]:
    """One row per example choosing the original in ``originals[i]`` of its 4 BCQ (positions A.. first)."""
    rows = []
    for i, k in enumerate(originals):
        bcq = {f"bcq_{p}": (p if j < k else "E") for j, p in enumerate(POSITIONS)}
        rows.append({"record_id": f"{partition}{i}", "partition": partition, "order": i, "unit_key": "",
                     "independent_rows": False, "bdq_answer": bdq, **bcq, "n_bcq": 4, "n_original": k,
                     "score": k / 4, "perturbed_by": "synonyms", "filtered": "", "error": "",
                     "is_reference": is_reference})  # fmt: skip
    return rows


def test_reduce_tests_against_the_heldout_and_reports_the_papers_range() -> None:
    method = get_method("dcq")
    cfg = method.make_config({"reference": {"arc": "arc_heldout"}, "units": "rows"})
    seen, heldout = f"{ARC}:rows0-19", f"{ARC}:rows20-39"
    own = _rows([4] * 12 + [1] * 8, seen, False)  # 12 of 20 always choose the original
    ref = _rows([1] * 20, heldout, True, bdq="A")  # a model biased to A: the original chosen at A only
    v = method.settle(method.reduce(pd.DataFrame(own + ref), cfg), cfg)
    assert v.decision == "contaminated" and v.p_value < 0.001
    d = v.details["dcq"]
    # BDQ all E: every position non-preferred; A chosen 20 times, B-D 12: upper 20/20, kappa 20/20
    assert d["non_preferred"] == list("ABCD") and d["original_counts"] == {"A": 20, "B": 12, "C": 12, "D": 12}
    assert d["upper"] == 1.0 and d["lower"] == 1.0 and v.rate == 1.0 and d["bdq_counts"]["E"] == 20
    assert d["original_choice_rate"] == pytest.approx((12 + 8 * 0.25) / 20)
    # the held-out's BDQ chose A every time: B-D non-preferred, where the original was never chosen
    assert v.details["reference_dcq"]["non_preferred"] == list("BCD") and v.details["reference_dcq"]["upper"] == 0.0
    assert "paper's range [100%, 100%] of 20" in v.details["summary"]
    # the same original choices on both sides: clean, though the paper's range says 100 % (BDQ said E)
    mixed = [4] * 6 + [1] * 14
    same = method.reduce(pd.DataFrame(_rows(mixed, seen, False) + _rows(mixed, heldout, True, bdq="A")), cfg)
    assert same.decision == "clean" and same.rate == 1.0
    # one share on every row of both sides: no assignment of them could be significant
    tied = method.reduce(pd.DataFrame(_rows([1] * 20, seen, False) + ref), cfg)
    assert tied.decision == "inconclusive" and "the original never chosen on either side" in tied.reason
    alone = method.reduce(pd.DataFrame(own), method.make_config({}))
    assert alone.decision == "inconclusive" and "reference" in alone.reason
    assert alone.details["dcq"]["upper"] == 1.0 and alone.details["reference_dcq"] is None


def test_config_catalog_cli_and_plan(capsys) -> None:
    from contamray.cli import _methods
    from contamray.serve.catalog import method_entry
    from tests.test_config import plan_of

    method = get_method("dcq")
    with pytest.raises(ValueError, match="methods.dcq.positions"):
        method.make_config({"positions": "some"})
    with pytest.raises(ValueError, match="methods.dcq.swap_share"):
        method.make_config({"swap_share": 0})
    entry = method_entry("dcq")
    assert "Golchin & Surdeanu" in entry["citation"] and "2311.06233" in entry["citation"]
    assert entry["score"] == entry["membership"] == "score" and entry["uses_reference"]
    assert entry["parameters"]["positions"] == "all" and entry["parameters"]["judge"] is False
    _methods()
    block = capsys.readouterr().out.split("\ndcq [closed]", 1)[1].split("\n")[:4]
    assert "Golchin & Surdeanu" in block[0] and "positions='all'" in block[1] and "2311.06233" in block[2]
    from contamray.pipeline.plan import ConfigError

    # the quiz names the split: a held-out of another split would be asked another question (not exchangeable)
    other_split = "+benchmarks.arc_heldout={adapter:arc_challenge,split:validation,limit:20}"
    refer = "++methods.dcq.reference={arc_challenge:arc_heldout}"
    with pytest.raises(ConfigError, match="the test split of ARC-Challenge.*the validation split of ARC-Challenge"
                                          ".*offset.*name_split: false"):  # fmt: skip
        plan_of("method=[dcq]", "benchmark=[arc_challenge,gsm8k]", other_split, refer)
    assert plan_of("method=[dcq]", "benchmark=[arc_challenge]", other_split, refer, "++methods.dcq.name_split=false")
    same_split = "+benchmarks.arc_heldout={adapter:arc_challenge,split:test,offset:20,limit:20,sample:first}"
    plan = plan_of("method=[dcq]", "benchmark=[arc_challenge,gsm8k]", same_split, refer, "run.sample=first",
                   "run.limit=20")  # fmt: skip
    cells = {(c.method, c.benchmark) for c in plan.cells}
    assert {("dcq", "arc_challenge"), ("dcq", "gsm8k"), ("dcq", "arc_heldout")} <= cells
    cell = next(c for c in plan.cells if c.benchmark == "arc_challenge")
    assert [d.benchmark for d in plan.dependencies(cell)] == ["arc_heldout"]

    with pytest.raises(ConfigError, match="needs a judge other than the target"):
        plan_of("method=[dcq]", "benchmark=[arc_challenge]", "methods.dcq.judge=true")


# ----------------------------------------------------------------------------- on a fine-tuned model


SIDE = 12  # questions a side: the held-out test's 10 rows and a few to filter


@pytest.fixture(scope="module")
def tuned(contaminated_model):
    from contamray.engines.hf import HFEngine
    from contamray.validate.calibrate import SharedEngines

    return SharedEngines({"target": HFEngine(contaminated_model.path, dtype="float32", batch_size=16)})


@pytest.fixture(scope="module")
def quizzed(contaminated_model, tuned):
    """DCQ's rows on the first 12 seen and 12 unseen questions (offline synonym perturbations, 5 quizzes each)."""
    method = get_method("dcq")
    cfg = method.make_config({"reference": {"arc_challenge": "unseen"}})
    return method, cfg, tuned.run(method, contaminated_model.seen[:SIDE], cfg), tuned.run(
        method, contaminated_model.unseen[:SIDE], cfg
    )


@pytest.mark.slow
def test_on_the_fine_tuned_model_every_row_is_scored_or_says_why(quizzed):
    """The embedded SmolLM2-135M fine-tuned on 40 ARC-Challenge questions (``contaminated_model``: the question
    stems, 12 epochs) takes DCQ on the first 12 seen and 12 unseen questions (offline synonym perturbations, the
    5 quizzes of ``positions: all``, the quiz through the chat template, greedy): the pipeline runs, every row is
    scored, filtered (too few table words) or failed with a reason, the verdict is three-valued and carries the
    paper's range for both sides.

    Measured (2026-11-24, 40 seen vs 40 unseen, same settings): 1 seen and 3 unseen questions filtered; the
    fine-tuned model never answers a quiz with a letter - 0 of 76 BDQ and 0 of 304 BCQ replies hold one; it
    recites the opening of a *seen* question instead ("The end result in the", "A scientist maps a long") - so the
    original is chosen in 0 % of quizzes on both sides, the paper's range is [0 %, 0 %] on both, and the held-out
    test says ``clean`` (p = 1 over 6 vs 6 blocks): a false negative of the quiz on a model this small. This test
    takes 12 + 12, for time (20 + 20 measured 19 vs 19 scored, 0 % vs 0 %, ``clean``, p = 1 over 3 vs 3 blocks;
    12 rows a side make fewer blocks, so the verdict may be ``inconclusive``, with its reason). The base
    SmolLM2-135M (not fine-tuned) does answer with letters, nearly always "A)" (BDQ: A 15 of 19 rows; BCQ: A 59,
    B 8 of 76): the positional bias the BCQ compensate; original chosen in 20 % vs 22 % of quizzes, the paper's
    range [0 %, 10 %] vs [0 %, 11 %] (the first 10 seen vs 10 unseen, 1 filtered).
    """
    from contamray.methods.base import DECISIONS
    from contamray.validate.calibrate import decide

    method, cfg, seen, unseen = quizzed
    for row in seen + unseen:
        assert (row["score"] is not None) != bool(row["filtered"] or row["error"]), row
        if row["score"] is not None:
            assert row["n_bcq"] == 4 and row["bdq_answer"] in ("", *"ABCDE") and 0.0 <= row["score"] <= 1.0
    assert not [r["error"] for r in seen + unseen if r["error"]]
    assert sum(r["score"] is not None for r in seen) >= 10 and sum(r["score"] is not None for r in unseen) >= 10
    v = decide(method, cfg, seen, unseen)
    assert v.decision in DECISIONS and (v.decision != "inconclusive" or v.reason)
    for side in ("dcq", "reference_dcq"):
        d = v.details[side]
        assert 0.0 <= d["lower"] <= d["upper"] <= 1.0 and sum(d["bdq_counts"].values()) + d["n_unparsed"] >= d["n"]
    print("dcq seen vs unseen:", v.details["summary"])


@pytest.mark.slow
@pytest.mark.skip(
    reason="measured 2026-11-24: the fine-tuned SmolLM2-135M never answers a quiz with a letter (0 of 76 BDQ and 0 of "
    "304 BCQ replies on 40 seen + 40 unseen ARC questions; it recites the opening of a seen question): the original "
    "is chosen in 0 % of quizzes seen vs 0 % unseen, held-out test p = 1 (clean)"
)
def test_seen_questions_have_their_original_chosen_more_often_than_unseen(quizzed):
    """What DCQ should show on a model that saw the questions; not true of the 135M model (skip reason)."""
    from contamray.validate.calibrate import decide

    method, cfg, seen, unseen = quizzed
    v = decide(method, cfg, seen, unseen)
    assert v.details["dcq"]["original_choice_rate"] > v.details["reference_dcq"]["original_choice_rate"] + 0.2
    assert v.decision == "contaminated", v.details["summary"]
