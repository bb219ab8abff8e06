"""TS-Guessing (Deng et al. 2024), both variants: masking, the paper's filters, parsing and scoring, the partition
test against a held-out partition, the catalog; and (slow) the seen vs unseen partitions of a fine-tuned model."""

from __future__ import annotations

import pandas as pd
import pytest

from contamray.methods.base import BenchmarkFacts, Output, get_method
from contamray.methods.closed.ts_guessing import (
    MASK,
    QUESTION_PROMPT,
    Filtered,
    TSGuessingMCConfig,
    exact_match,
    first_word,
    mc_probe,
    near_duplicate_options,
    normalise,
    option_answer,
    question_probe,
)
from contamray.methods.closed.ts_words import candidates, is_content_word, mask_word
from contamray.records import Record

ARC = "arc_challenge/ARC-Challenge/test"


def question(i: int, text: str, partition: str = ARC) -> Record:
    return Record(id=f"q{i}", partition=partition, input=text, label="", reference=text, task="question_answering",
                  order=i)  # fmt: skip


def mc(i: int, options: tuple[str, ...], gold: str = "C", q: str = "Which layer of the Earth is liquid?") -> Record:
    labels = ["A", "B", "C", "D", "E"][: len(options)]
    return Record(id=f"m{i}", partition=ARC, input=q, label=options[labels.index(gold)], reference=q,
                  task="multiple_choice", choices=options, answer=gold, order=i,
                  meta={"choice_labels": labels})  # fmt: skip


def replies(method, records: list[Record], cfg, texts: dict[str, str]) -> list[dict]:
    """Score ``records`` with the given reply per record id (the engine's place taken by a dict)."""
    reqs = method.requests(records, cfg, 0, {})
    outputs = {r.key: Output(key=r.key, text=texts[r.record_ids[0]]) for r in reqs}
    return method.score(records, outputs, cfg)


# ----------------------------------------------------------------------------- masking


def test_masking_picks_a_content_word_never_a_function_word() -> None:
    m = mask_word("Which of the following statements best explains why plants need sunlight?", "r1")
    assert m.word == "statements"  # the longest content word ("following" is a stop word here)
    assert m.text == "Which of the following [MASK] best explains why plants need sunlight?"
    # a word seen twice would give itself away; function words and -ly adverbs are never candidates
    pool = [w for w, _, _ in candidates("The cat quickly saw the other cat near a river")]
    assert pool == ["saw", "river"]
    assert not is_content_word("through") and not is_content_word("quickly") and is_content_word("family")
    # random (LLMSanitize's uniform pick) is seeded per record: the same word every run, always a candidate
    text = "Some students measured the temperature of boiling water in a sealed container"
    picks = {mask_word(text, "r2", "random", seed).word for seed in range(20)}
    assert picks <= {w for w, _, _ in candidates(text)} and len(picks) > 1
    assert mask_word(text, "r2", "random", 3) == mask_word(text, "r2", "random", 3)


def test_question_filters_short_questions_and_questions_without_content_words() -> None:
    cfg = get_method("ts_guessing").make_config({})
    with pytest.raises(Filtered, match="min_words"):
        question_probe(question(0, "Is it cold?"), cfg)
    with pytest.raises(Filtered, match="nothing informative"):
        question_probe(question(1, "Which of these is not one of them?"), cfg)
    probe = question_probe(question(2, "What process do green plants use to make food from sunlight?"), cfg)
    assert probe.target == "sunlight" and probe.prompt == QUESTION_PROMPT.format(
        question="What process do green plants use to make food from [MASK]?"
    )
    assert probe.prompt.startswith("Complete the sentence in one word:\n\n") and probe.prompt.endswith(
        "\nReply the answer only."
    )


def test_mc_masks_a_wrong_option_and_shows_the_others() -> None:
    cfg = TSGuessingMCConfig()
    options = ("inner core", "crust", "outer core", "mantle")
    masked = set()
    for i in range(30):
        probe = mc_probe(mc(i, options), cfg)
        letter = probe.columns["masked_letter"]
        assert probe.target != "outer core" and probe.target == options["ABCD".index(letter)]  # never the gold C
        assert f"{letter}: {MASK}" in probe.prompt and "C: [outer core]" in probe.prompt
        assert probe.prompt.startswith(f"Please fill in the [] in option {letter} based on your benchmark knowledge.")
        assert probe.prompt.endswith("\n\nReply with answer only.") and "Question: Which layer" in probe.prompt
        masked.add(probe.target)
    assert masked == {"inner core", "crust", "mantle"}  # a seeded draw over the wrong options


def test_near_duplicate_and_binary_options_are_filtered() -> None:
    cfg = TSGuessingMCConfig()
    dup = ("the red car", "the red truck", "a blue boat", "green grass")  # ROUGE-L F1 of A, B: 2/3
    assert near_duplicate_options(dup, 0.65) == (0, 1)
    assert near_duplicate_options(("inner core", "crust", "outer layer", "mantle"), 0.65) is None
    with pytest.raises(Filtered, match="options A and B have ROUGE-L F1 >= max_option_similarity=0.65"):
        mc_probe(mc(0, dup), cfg)
    with pytest.raises(Filtered, match="yes/no"):
        mc_probe(mc(1, ("Yes", "No"), gold="A"), cfg)
    assert mc_probe(mc(2, dup), TSGuessingMCConfig(max_option_similarity=0.7)).target  # the threshold decides
    no_gold = Record(id="m3", partition=ARC, input="Which one?", label="zz", reference="", task="multiple_choice",
                     choices=("a", "b", "c"), answer="Z", meta={"choice_labels": ["A", "B", "C"]})  # fmt: skip
    with pytest.raises(ValueError, match="gold answer"):
        mc_probe(no_gold, cfg)


# ----------------------------------------------------------------------------- parsing and scoring


def test_normalisation_and_answer_parsing() -> None:
    assert normalise("  The  [Photo-synthesis]! ") == "the photo synthesis"
    assert exact_match("Paris.", "paris") and not exact_match("", "") and not exact_match("Lyon", "Paris")
    assert first_word("Answer: the mitochondria.") == "mitochondria"
    assert first_word("Sunlight") == "Sunlight" and first_word("...") == ""
    assert option_answer("B: [a layer of rock]\nC: [x]", "B") == "a layer of rock"
    assert option_answer("[the mantle]", "D") == "the mantle"
    assert option_answer("Answer: B. crust", "B") == "crust"


def test_mc_scores_against_the_masked_wrong_option_not_the_correct_answer() -> None:
    """LLMSanitize's reference implementation compares the reply with the correct option; the paper (and this)
    with the masked wrong one: reproducing the hidden option scores 1, repeating the visible answer 0."""
    method = get_method("ts_guessing_mc")
    cfg = method.make_config({})
    record = mc(0, ("inner core", "crust", "outer core", "mantle"))
    target = mc_probe(record, cfg).target
    right = replies(method, [record], cfg, {record.id: f"{target}"})[0]
    assert right["exact_match"] == 1.0 and right["rouge_l"] == 1.0 and right["masked"] == target
    gold = replies(method, [record], cfg, {record.id: "outer core"})[0]
    assert gold["exact_match"] == 0.0 and gold["correct_option"] == "outer core" and gold["masked"] != "outer core"
    close = replies(method, [record], cfg, {record.id: f"the {target} layer"})[0]
    assert close["exact_match"] == 0.0 and 0.0 < close["rouge_l"] < 1.0 and close["in_reply"] == 1.0
    assert gold["in_reply"] == 0.0


def test_rows_requests_chat_and_filtered_items() -> None:
    method = get_method("ts_guessing")
    cfg = method.make_config({"chat": True})
    records = [question(0, "What process do green plants use to make food from sunlight?"), question(1, "Why?")]
    reqs = method.requests(records, cfg, 0, {})
    assert [r.key for r in reqs] == ["q0|ts_guessing"] and reqs[0].chat and reqs[0].sampling.temperature == 0.0
    assert method.requests(records, cfg, 1, {}) == []
    rows = replies(method, records[:1], cfg, {"q0": "Sunlight."}) + method.score(records[1:], {}, cfg)
    assert rows[0]["exact_match"] == 1.0 and rows[0]["answer"] == "Sunlight" and rows[0]["masked"] == "sunlight"
    assert rows[1]["exact_match"] is None and "min_words" in rows[1]["filtered"] and rows[1]["error"] == ""
    # a restated question holds the word but is no one-word answer: in_reply, not exact match
    restated = replies(method, records[:1], cfg, {"q0": "Green plants use sunlight to make food."})[0]
    assert restated["exact_match"] == 0.0 and restated["answer"] == "Green" and restated["in_reply"] == 1.0
    assert replies(method, records[:1], cfg, {"q0": "sunlights"})[0]["in_reply"] == 0.0  # whole words only
    failed = method.score(records[:1], {"q0|ts_guessing": Output(key="q0|ts_guessing", error="boom")}, cfg)[0]
    assert "boom" in failed["error"] and failed["exact_match"] is None


# ----------------------------------------------------------------------------- the partition test


def _rows(hits: int, n: int, partition: str, is_reference: bool) -> list[dict]:
    return [{"record_id": f"{partition}{i}", "partition": partition, "order": i, "unit_key": "",
             "independent_rows": False, "exact_match": float(i < hits), "in_reply": float(i < hits), "filtered": "",
             "error": "",
             "is_reference": is_reference} for i in range(n)]  # fmt: skip


def test_reduce_compares_exact_matches_with_the_heldout_partition() -> None:
    method = get_method("ts_guessing")
    cfg = method.make_config({"reference": {"arc": "arc_heldout"}, "units": "rows"})
    seen, heldout = f"{ARC}:rows0-19", f"{ARC}:rows20-39"
    v = method.settle(method.reduce(pd.DataFrame(_rows(12, 20, seen, False) + _rows(1, 20, heldout, True)), cfg), cfg)
    assert v.decision == "contaminated" and v.rate == pytest.approx(0.6) and v.p_value < 0.001
    assert "in_reply" in v.details["by_column"]  # tested beside, never deciding
    assert v.details["reference_rate"] == pytest.approx(0.05) and "exact match 60% of 20 vs 5% of 20" in (
        v.details["summary"]
    )
    same = method.reduce(pd.DataFrame(_rows(3, 20, seen, False) + _rows(3, 20, heldout, True)), cfg)
    assert same.decision == "clean" and same.rate == pytest.approx(0.15)
    # 4 hits among 40 rows: even all 4 on the partition's side give p = C(36, 16) / C(40, 20) = 0.053 > alpha
    few_hits = method.reduce(pd.DataFrame(_rows(2, 20, seen, False) + _rows(2, 20, heldout, True)), cfg)
    assert few_hits.decision == "inconclusive" and "0.053 > alpha 0.05" in few_hits.reason
    none = method.reduce(pd.DataFrame(_rows(0, 20, seen, False) + _rows(0, 20, heldout, True)), cfg)
    assert none.decision == "inconclusive" and "1 distinct score value(s)" in none.reason
    assert "no masked word guessed on either side" in none.reason
    alone = method.reduce(pd.DataFrame(_rows(12, 20, seen, False)), method.make_config({}))
    assert alone.decision == "inconclusive" and "reference" in alone.reason and alone.rate == pytest.approx(0.6)
    few = method.reduce(pd.DataFrame(_rows(5, 5, seen, False) + _rows(0, 5, heldout, True)), cfg)
    assert few.decision == "inconclusive" and ">= 10 a side" in few.reason


def test_tied_exact_matches_are_tested_by_their_permutation_distribution_not_the_normal_approximation() -> None:
    """0/1 scores tie: the held-out test's p is the permutation p given the pooled hits (for 0/1, exactly Fisher's
    test), not scipy's normal approximation, which undercuts it - 5 of 20 against 1 of 20 read p = 0.042 and
    "contaminated", where the exact p is 0.091; 1 of 10 against 1 of 100 read 0.023, exact 0.174."""
    from scipy.stats import fisher_exact

    method = get_method("ts_guessing")
    cfg = method.make_config({"reference": {"arc": "arc_heldout"}, "units": "rows"})
    seen, heldout = f"{ARC}:rows0-19", f"{ARC}:rows20-39"
    for (hits, n), (ref_hits, ref_n) in (((5, 20), (1, 20)), ((1, 10), (1, 100))):
        v = method.reduce(pd.DataFrame(_rows(hits, n, seen, False) + _rows(ref_hits, ref_n, heldout, True)), cfg)
        exact = fisher_exact([[hits, n - hits], [ref_hits, ref_n - ref_hits]], alternative="greater")[1]
        assert v.p_value == pytest.approx(exact), (v.p_value, exact)
        assert v.decision == "clean", (hits, ref_hits, v.p_value)
    strong = method.reduce(pd.DataFrame(_rows(8, 20, seen, False) + _rows(1, 20, heldout, True)), cfg)
    assert strong.decision == "contaminated" and strong.p_value < 0.05


def test_a_reference_whose_rows_mostly_failed_is_not_a_yardstick() -> None:
    """``settle`` counts the partition's failed rows; the reference's count too: with 28 of 40 held-out rows
    failed, the 12 left (no hit) need not represent the held-out, and 6 of 20 hits against them read p = 0.043,
    "contaminated". Now inconclusive, naming the failures; 20 of 40 failed (not more than half) still decides."""
    method = get_method("ts_guessing")
    cfg = method.make_config({"reference": {"arc": "arc_heldout"}, "units": "rows"})
    seen, heldout = f"{ARC}:rows0-19", f"{ARC}:rows20-59"

    def reference(n_failed: int) -> list[dict]:
        rows = _rows(0, 40, heldout, True)
        for r in rows[:n_failed]:
            r.update(error="engine timed out", exact_match=None)
        return rows

    broken = method.settle(method.reduce(pd.DataFrame(_rows(6, 20, seen, False) + reference(28)), cfg), cfg)
    assert broken.decision == "inconclusive" and "28 of 40 reference rows failed (70% > 50%)" in broken.reason
    half = method.settle(method.reduce(pd.DataFrame(_rows(6, 20, seen, False) + reference(20)), cfg), cfg)
    assert half.decision == "contaminated", half.reason


def test_a_contiguous_block_stays_a_block_when_filtered_rows_leave_gaps() -> None:
    """Whether a side is a contiguous block of its split (then cut into blocks of rows: its rows are a cluster
    sample) is read from all its rows: filtered or failed rows leave gaps in the scored ones, and read from those
    alone a 60-row block with 40 % of its rows kept looked like a random sample - its rows became units again."""
    import numpy as np

    method = get_method("ts_guessing")
    cfg = method.make_config({"reference": {"arc": "arc_heldout"}})
    rng = np.random.default_rng(0)
    own, ref = _rows(8, 60, f"{ARC}:rows0-59", False), _rows(2, 60, f"{ARC}:rows60-119", True)
    for i, r in enumerate(ref):
        r["order"] = 60 + i
    for r in own + ref:
        if rng.random() > 0.4:
            r.update(filtered="no content word to mask", exact_match=None)
    v = method.reduce(pd.DataFrame(own + ref), cfg)
    units = v.details["units"]
    assert units["partition"]["how"].startswith("blocks") and units["reference"]["how"].startswith("blocks"), units
    assert units["partition"]["n_units"] < sum(r["filtered"] == "" for r in own)


def test_applies_and_config_errors_name_the_key() -> None:
    facts = dict(adapter="x", config=None, split=None, limit=20, sample="first")
    qa = BenchmarkFacts(name="gsm8k", task="question_answering", has_choices=False, **facts)
    arc = BenchmarkFacts(name="arc", task="multiple_choice", has_choices=True, **facts)
    mc_method, q_method = get_method("ts_guessing_mc"), get_method("ts_guessing")
    assert "options" in mc_method.not_applicable(mc_method.make_config({}), qa)
    assert mc_method.not_applicable(mc_method.make_config({}), arc) is None
    assert q_method.not_applicable(q_method.make_config({}), qa) is None
    with pytest.raises(ValueError, match="methods.ts_guessing_mc.max_option_similarity"):
        mc_method.make_config({"max_option_similarity": 0})
    with pytest.raises(ValueError, match="methods.ts_guessing.choose"):
        q_method.make_config({"choose": "rarest"})
    with pytest.raises(ValueError, match="known parameters"):
        q_method.make_config({"mask_rate": 1})


def test_catalog_and_cli_list_both_variants_with_citation_and_parameters(capsys) -> None:
    from contamray.cli import _methods
    from contamray.serve.catalog import method_entry

    q, m = method_entry("ts_guessing"), method_entry("ts_guessing_mc")
    assert "Deng et al" in q["citation"] and "question-based" in q["citation"]
    assert "Deng et al" in m["citation"] and "wrong" in m["citation"]
    assert m["parameters"]["max_option_similarity"] == 0.65 and m["applies"]["needs_choices"]
    assert q["parameters"]["choose"] == "longest" and q["parameters"]["min_words"] == 5 and q["uses_reference"]
    assert q["score"] == m["score"] == m["membership"] == "exact_match"
    _methods()
    out = capsys.readouterr().out
    for name in ("ts_guessing", "ts_guessing_mc"):
        lines = out.split(f"\n{name} [closed]", 1)[1].splitlines()
        block = "\n".join([lines[0]] + [line for line in lines[1:5] if line.startswith("    ")])
        assert "Deng et al" in block and "max_tokens=" in block and "reference=" in block


def test_plan_runs_both_variants_with_a_heldout_reference_and_skips_mc_without_options() -> None:
    from tests.test_config import plan_of

    heldout = "+benchmarks.arc_heldout={adapter:arc_challenge,split:validation,limit:20}"
    plan = plan_of("method=[ts_guessing,ts_guessing_mc]", "benchmark=[arc_challenge,gsm8k]", heldout,
                   "++methods.ts_guessing_mc.reference={arc_challenge:arc_heldout}",
                   "++methods.ts_guessing.reference={arc_challenge:arc_heldout}")  # fmt: skip
    cells = {(c.method, c.benchmark) for c in plan.cells}
    assert {("ts_guessing", "gsm8k"), ("ts_guessing_mc", "arc_challenge"), ("ts_guessing", "arc_challenge")} <= cells
    skipped = {(c.method, c.benchmark): why for c, why in plan.skipped}
    assert "options" in skipped[("ts_guessing_mc", "gsm8k")]
    cell = next(c for c in plan.cells if c.method == "ts_guessing_mc" and c.benchmark == "arc_challenge")
    assert [d.benchmark for d in plan.dependencies(cell)] == ["arc_heldout"]
    assert plan.methods["ts_guessing_mc"].params["max_option_similarity"] == 0.65


# ----------------------------------------------------------------------------- on a fine-tuned model


@pytest.fixture(scope="module")
def tuned(contaminated_model):
    from contamray.engines.hf import HFEngine
    from contamray.validate.calibrate import SharedEngines

    return SharedEngines({"target": HFEngine(contaminated_model.path, dtype="float32", batch_size=16)})


@pytest.mark.slow
def test_question_based_on_the_fine_tuned_model_reproduces_seen_questions_not_unseen(contaminated_model, tuned):
    """The embedded SmolLM2-135M fine-tuned on 40 ARC-Challenge questions (``contaminated_model``: the question
    stems only, 12 epochs), probed on those 40 (seen) and the next 40 of the split (unseen, the held-out).

    Measured (2026-11-24, greedy, the paper's prompt through the chat template): exact match 0 of 40 on both
    sides - the 135M model does not answer "in one word", it restates the question ("The smallest unit of copper
    that still maintains the characteristics of copper is ..." for a masked "characteristics") - so the paper's
    measure decides ``clean`` (p = 1): a false negative of the protocol on a model this small, not a property
    of the partitions. The masked word is in the reply (``in_reply``) for 7 of 40 seen questions and 0 of 40
    unseen (one-sided Mann-Whitney over 6 vs 6 blocks of consecutive rows p = 0.0045, AUC 0.92): the seen
    partition is clearly above the unseen one on what the model reproduces.
    """
    method = get_method("ts_guessing")
    cfg = method.make_config({"reference": {"arc_challenge": "unseen"}})
    seen = tuned.run(method, contaminated_model.seen, cfg)
    unseen = tuned.run(method, contaminated_model.unseen, cfg)
    assert not [r["error"] for r in seen + unseen if r["error"]]
    from contamray.validate.calibrate import decide

    v = decide(method, cfg, seen, unseen)
    by = v.details["by_column"]["in_reply"]
    assert v.details["in_reply_rate"] >= 0.1 and v.details["reference_in_reply_rate"] <= 0.05, v.details
    assert by["p_value"] <= 0.05 and by["auc_vs_reference"] >= 0.75, by
    assert v.rate is not None and v.rate <= 0.1 and v.decision != "contaminated", v.details["summary"]


@pytest.mark.slow
def test_mc_on_a_model_that_never_saw_the_options_finds_nothing(contaminated_model, tuned):
    """The same model saw the question stems but never the options (the fine-tune text is the ``input`` field):
    masked wrong options of seen items are no more reproducible than of unseen ones, so TS-Guessing's
    multiple-choice variant must not call the seen partition contaminated (20 rows a side, to stay cheap).

    Measured (2026-11-24): the near-duplicate filter (ROUGE-L >= 0.65) drops 5 seen and 3 unseen items; exact
    match 0 of 15 seen vs 0 of 17 unseen, ROUGE-L against the masked option 0.038 vs 0.020, ``in_reply`` 0 vs 0;
    ``clean`` (p = 1 over 3 vs 3 blocks). Instead of an option the model often recites a *seen question*
    verbatim (another item's stem): memorised, but not what this variant asks for."""
    method = get_method("ts_guessing_mc")
    cfg = method.make_config({"reference": {"arc_challenge": "unseen"}})
    seen = tuned.run(method, contaminated_model.seen[:20], cfg)
    unseen = tuned.run(method, contaminated_model.unseen[:20], cfg)
    assert not [r["error"] for r in seen + unseen if r["error"]]
    from contamray.validate.calibrate import decide

    v = decide(method, cfg, seen, unseen)
    assert v.details["n_scored"] >= 15 and v.decision != "contaminated", v.details["summary"]
