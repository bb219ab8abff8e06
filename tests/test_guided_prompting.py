"""Guided prompting (Golchin & Surdeanu 2023) on real benchmark rows with hand-built engine outputs.

Records are built here from the mirrored hub rows (AG News, RTE, XSum) so the test does not depend on
the benchmark adapters. The "models" are Outputs whose behaviour is known: one that reproduces the
reference's second piece only when told the dataset (contaminated), one that answers the same either
way (clean), and judges answering in the paper's format.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from contamray.methods.base import _REGISTRY, Output
from contamray.methods.closed.guided_prompting import Config, GuidedPrompting, judge_sample, prepare, split_reference
from contamray.methods.closed.guided_prompts import build_prompts, clean_completion, parse_judge
from contamray.metrics.rouge import rouge_l_f1, rouge_l_f1_many
from contamray.records import Record

AG_NEWS_LABELS = ("World", "Sports", "Business", "Sci/Tech")
RTE_LABELS = ("entailment", "not_entailment")


def _rows(mirror_dir: Path, relative: str, n: int) -> list[dict]:
    with open(mirror_dir / relative, encoding="utf-8") as f:
        return [json.loads(line) for _, line in zip(range(n), f)]


def ag_news(mirror_dir: Path, n: int = 10) -> list[Record]:
    part = "ag_news/default/test"
    return [
        Record(
            id=f"{part}#{i}",
            partition=part,
            input=row["text"],
            label=AG_NEWS_LABELS[row["label"]],
            reference=row["text"],
            task="classification",
        )
        for i, row in enumerate(_rows(mirror_dir, "fancyzhx/ag_news/default/test.jsonl", n))
    ]


def rte(mirror_dir: Path, n: int = 10) -> list[Record]:
    part = "rte/rte/validation"
    return [
        Record(
            id=f"{part}#{row['idx']}",
            partition=part,
            input=f"{row['sentence1']}\n{row['sentence2']}",
            label=RTE_LABELS[row["label"]],
            reference=row["sentence2"],
            prefix=row["sentence1"],
            task="nli",
        )
        for row in _rows(mirror_dir, "nyu-mll/glue/rte/validation.jsonl", n)
    ]


def xsum(mirror_dir: Path, n: int = 10) -> list[Record]:
    part = "xsum/default/test"
    return [
        Record(
            id=row["id"],
            partition=part,
            input=row["document"],
            label=row["summary"],
            reference=row["summary"],
            task="one_sentence_summary",
        )
        for row in _rows(mirror_dir, "EdinburghNLP/xsum/default/test.jsonl", n)
    ]


def outputs_for(
    records: list[Record], cfg: Config, guided: dict[str, str], general: dict[str, str]
) -> dict[str, Output]:
    out = {}
    for r in records:
        out[f"{r.id}|guided"] = Output(key=f"{r.id}|guided", text=guided[r.id])
        out[f"{r.id}|general"] = Output(key=f"{r.id}|general", text=general[r.id])
    return out


def contaminated_model(records: list[Record], cfg: Config) -> dict[str, Output]:
    """Guided: the true second piece (with an echoed field name, as chat models do); general: the
    second piece of the next record, a fluent but wrong continuation."""
    seconds = [prepare(r, cfg).second for r in records]
    guided = {r.id: f"SECOND PIECE: {s}" for r, s in zip(records, seconds)}
    general = {r.id: seconds[(i + 1) % len(records)] for i, r in enumerate(records)}
    return outputs_for(records, cfg, guided, general)


# ----------------------------------------------------------------------------- registry and config


def test_registered_with_roles_and_config_errors() -> None:
    method = GuidedPrompting()
    assert _REGISTRY["guided_prompting"] is GuidedPrompting
    assert method.family == "closed"
    assert method.engine_roles_for(Config()) == ("target",)
    assert method.engine_roles_for(Config(judge=True)) == ("target", "judge")
    cfg = method.make_config({"stop": ["\n\n"], "judge": True})
    assert cfg.stop == ("\n\n",) and cfg.resolved_decision == "alg2"
    assert Config().resolved_decision == "alg1"
    with pytest.raises(ValueError, match="unknown parameter.*n_samples"):
        method.make_config({"n_samples": 3})
    with pytest.raises(ValueError, match="decision='either' needs the judge"):
        Config(decision="either")
    with pytest.raises(ValueError, match="min_frac"):
        Config(min_frac=0.8, max_frac=0.5)
    cfg = method.make_config({"judge": True, "self_judge": True, "judge_instances": 10, "chat": False})
    assert cfg.self_judge and not cfg.chat
    assert not Config().self_judge and Config().chat and Config().algorithm1_test == "sign_flip"
    with pytest.raises(ValueError, match="algorithm1_test.*sign_flip, bootstrap"):
        Config(algorithm1_test="t_test")
    with pytest.raises(ValueError, match="judge_instances must be >= 1"):
        Config(judge_instances=0)
    with pytest.raises(ValueError, match="min_near_exact must be in \\[1, judge_instances=3\\]"):
        Config(judge_instances=3, min_near_exact=4)
    assert method.outputs.score == method.outputs.membership == "rougeL_diff"
    assert method.applies.min_rows == 5


def test_plan_warnings_name_the_rows_each_algorithm_needs() -> None:
    from contamray.methods.base import BenchmarkFacts

    def facts(limit: int | None) -> BenchmarkFacts:
        return BenchmarkFacts("arc_challenge", "arc", "ARC-Challenge", "test", "multiple_choice", True, limit, "first")

    method = GuidedPrompting()
    assert method.plan_warnings(Config(), facts(20)) == method.plan_warnings(Config(), facts(None)) == []
    (alg1,) = method.plan_warnings(Config(), facts(4))
    assert "needs >= 5 pairs" in alg1 and "limit (or run.limit) to >= 5" in alg1
    assert len(method.plan_warnings(Config(alpha=0.01), facts(6))) == 1  # 7 at alpha 0.01
    (alg2,) = method.plan_warnings(Config(judge=True), facts(8))
    assert "judge_instances=10" in alg2 and "to >= 10" in alg2


# ----------------------------------------------------------------------------- prompts and requests


def _instruction(prompt: str, pieces_first: str) -> str:
    return prompt.replace(pieces_first, "")


def test_guided_prompts_name_dataset_and_split_general_ones_do_not(mirror_dir: Path) -> None:
    cfg = Config()
    method = GuidedPrompting()
    cases = [
        (ag_news(mirror_dir, 3), "from the test split of the AG News dataset", "FIRST PIECE", "LABEL: "),
        (rte(mirror_dir, 3), "from the validation split of the RTE dataset", "SENTENCE 1", "LABEL: "),
        (xsum(mirror_dir, 3), "one-sentence summary from the test split of the XSum dataset", "FIRST", ""),
    ]
    for records, naming, field, label_line in cases:
        requests = method.requests(records, cfg, 0, {})
        assert [q.key for q in requests] == [f"{r.id}|{k}" for r in records for k in ("guided", "general")]
        for record, guided, general in zip(records, requests[::2], requests[1::2]):
            pieces = prepare(record, cfg)
            assert naming in guided.text
            assert pieces.first in guided.text and pieces.first in general.text
            assert pieces.second not in guided.text and pieces.second not in general.text
            bare = _instruction(general.text, pieces.first)
            assert pieces.dataset not in bare and "split" not in bare and pieces.split not in bare
            assert field in guided.text and field in general.text
            if label_line:
                assert f"{label_line}{record.label}" in guided.text
                assert f"{label_line}{record.label}" in general.text
            else:
                assert "LABEL" not in guided.text + general.text
            for q in (guided, general):
                assert q.kind == "generate" and q.engine == "target" and q.stage == 0 and q.chat
                assert q.record_ids == (record.id,)
                assert q.sampling.temperature == 0.0 and q.sampling.max_tokens >= 16


def test_paper_wording_of_classification_and_nli(mirror_dir: Path) -> None:
    guided, general = build_prompts("classification", "AG News", "test", "Fears for T N pension", "Business")
    assert guided == (
        "INSTRUCTION:\n"
        "You are provided with the FIRST PIECE of an instance from the test split of the AG News dataset.\n"
        "Finish the SECOND PIECE of the instance as EXACTLY appeared in the dataset.\n"
        "ONLY rely on the original form of the instance in the dataset to finish the SECOND PIECE.\n\n"
        "LABEL: Business\n\nFIRST PIECE:\nFears for T N pension\n\nSECOND PIECE:\n"
    )
    assert general.startswith(
        "INSTRUCTION:\nFinish the SECOND PIECE based on the FIRST PIECE, such that these two pieces "
        "become a single instance with the following LABEL.\n\nLABEL: Business\n\n"
    )
    record = rte(mirror_dir, 1)[0]
    guided, general = GuidedPrompting().requests([record], Config(), 0, {})
    assert "Finish SENTENCE 2 as appeared in the dataset.\nSENTENCE 2 MUST EXACTLY match" in guided.text
    assert general.text.startswith(
        "INSTRUCTION:\nFinish SENTENCE 2 based on SENTENCE 1, such that the following LABEL shows the "
        "logical relationship between SENTENCE 1 and SENTENCE 2."
    )
    assert guided.text.endswith(f"SENTENCE 1:\n{record.prefix}\n\nLABEL: {record.label}\n\nSENTENCE 2:\n")


def test_qa_and_multiple_choice_prompts_and_answer_leak_guard() -> None:
    gsm = Record(
        id="gsm8k/main/test#0",
        partition="gsm8k/main/test",
        input="Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning.",
        label="Janet sells 16 - 3 = 13 eggs. #### 13",
        reference="Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning.",
        task="question_answering",
    )
    guided, general = GuidedPrompting().requests([gsm], Config(), 0, {})
    assert "the FIRST PIECE of a question from the test split of the GSM8K dataset" in guided.text
    assert "ANSWER: Janet sells 16 - 3 = 13 eggs. #### 13" in guided.text
    assert "become a single question with the following ANSWER." in general.text
    # HellaSwag-like paired record: the gold ending is both the label and the text to reproduce
    ending = "then rinses the bucket and puts it away."
    mc = Record(
        id="hellaswag/default/validation#3",
        partition="hellaswag/default/validation",
        input="A man is washing a car. He",
        label=ending,
        reference=ending,
        prefix="A man is washing a car. He",
        task="multiple_choice",
        choices=(ending, "flies away."),
    )
    guided, general = GuidedPrompting().requests([mc], Config(), 0, {})
    assert "multiple-choice question from the validation split of the HellaSwag dataset" in guided.text
    assert "ANSWER" not in guided.text and "ANSWER" not in general.text
    assert "FIRST PIECE:\nA man is washing a car. He\n" in guided.text


def test_unlabelled_classification_drops_the_label_line() -> None:
    record = Record(
        id="imdb/plain_text/unsupervised#0",
        partition="imdb/plain_text/unsupervised",
        input="This film was a delight from start to finish, with a superb cast.",
        label="",
        reference="This film was a delight from start to finish, with a superb cast.",
        task="classification",
    )
    guided, general = GuidedPrompting().requests([record], Config(), 0, {})
    assert "LABEL" not in guided.text and "LABEL" not in general.text
    assert "such that these two pieces become a single instance.\n" in general.text
    assert "unsupervised split of the IMDB dataset" in guided.text


def test_dataset_names_override(mirror_dir: Path) -> None:
    records = ag_news(mirror_dir, 1)
    cfg = Config(dataset_names={"ag_news": "AG's corpus of news articles"})
    guided = GuidedPrompting().requests(records, cfg, 0, {})[0]
    assert "the test split of the AG's corpus of news articles dataset" in guided.text


def test_max_tokens_derived_from_second_piece_or_fixed(mirror_dir: Path) -> None:
    records = xsum(mirror_dir, 5)
    derived = GuidedPrompting().requests(records, Config(), 0, {})
    for r, q in zip(records, derived[::2]):
        assert q.sampling.max_tokens == max(16, 2 * len(prepare(r, Config()).second.split()))
    fixed = GuidedPrompting().requests(records, Config(max_tokens=64), 0, {})
    assert {q.sampling.max_tokens for q in fixed} == {64}


def test_chat_flag_reaches_every_generation_request(mirror_dir: Path) -> None:
    records = rte(mirror_dir, 3)
    for chat in (True, False):
        cfg = Config(judge=True, self_judge=True, chat=chat)
        method = GuidedPrompting()
        stage0 = method.requests(records, cfg, 0, {})
        stage1 = method.requests(records, cfg, 1, contaminated_model(records, cfg))
        assert len(stage0) == 6 and len(stage1) == 3
        assert {q.chat for q in stage0 + stage1} == {chat}


# ----------------------------------------------------------------------------- splitting


def test_split_is_reproducible_never_empty_and_within_fractions(mirror_dir: Path) -> None:
    records = ag_news(mirror_dir, 150) + xsum(mirror_dir, 150)
    cfg = Config(seed=7)
    cuts = {}
    for r in records:
        first, second = split_reference(r.reference, r.id, cfg)
        assert first.strip() and second.strip()
        assert first.split() + second.split() == r.reference.split()
        n, k = len(r.reference.split()), len(first.split())
        floor = min(cfg.min_piece_words, n // 2)
        assert floor <= k <= n - floor
        assert (first, second) == split_reference(r.reference, r.id, Config(seed=7))
        cuts[r.id] = k
    # single-sentence XSum summaries are cut at words: 40-70 % of them (rounded), unless clamped
    for r in records[150:]:
        n = len(r.reference.split())
        if sum(w[-1] in ".!?" for w in r.reference.split()[:-1]) == 0 and n >= 10:
            assert int(0.4 * n) <= cuts[r.id] <= round(0.7 * n) + 1
    other_seed = [len(split_reference(r.reference, r.id, Config(seed=8))[0].split()) for r in records]
    assert sum(a != b for a, b in zip(cuts.values(), other_seed)) > len(records) // 4
    # the cut depends on the record id, not only on the text
    text = records[0].reference
    by_id = {len(split_reference(text, f"id-{i}", cfg)[0].split()) for i in range(40)}
    assert len(by_id) > 1


def test_split_of_short_texts() -> None:
    cfg = Config(min_piece_words=3)
    assert split_reference("Hello world", "a", cfg) == ("Hello", "world")
    first, second = split_reference("one two three four five", "b", cfg)
    assert len(first.split()) >= 2 and len(second.split()) >= 2
    with pytest.raises(ValueError, match="1 word"):
        split_reference("  lonely  ", "c", cfg)


def test_multi_sentence_text_is_cut_at_a_sentence_end() -> None:
    text = (
        "The first sentence is here. The second one follows it. A third sentence comes next. "
        "Then a fourth arrives. And the fifth closes the text."
    )
    for i in range(20):
        first, _ = split_reference(text, f"r{i}", Config())
        assert first.endswith(".")
    words = Config(split_unit="word")
    assert any(not split_reference(text, f"r{i}", words)[0].endswith(".") for i in range(20))


# ----------------------------------------------------------------------------- Algorithm 1


def test_contaminated_model_is_detected(mirror_dir: Path) -> None:
    method = GuidedPrompting()
    for records in (ag_news(mirror_dir), rte(mirror_dir), xsum(mirror_dir)):
        cfg = Config()
        rows = method.score(records, contaminated_model(records, cfg), cfg)
        assert [r["record_id"] for r in rows] == [r.id for r in records]
        assert all(r["error"] == "" for r in rows)
        assert all(r["rougeL_guided"] == 1.0 for r in rows)
        assert all(r["guided_completion"] == r["second_piece"] for r in rows)
        assert all(r["bleurt_guided"] is None and r["judge_verdict"] is None for r in rows)
        assert all(r["rougeL_diff"] == pytest.approx(1.0 - r["rougeL_general"]) for r in rows)
        verdict = method.reduce(rows, cfg)
        # all 10 differences positive: only the observed signs reach the observed sum, p = 2^-10 exactly
        assert verdict.decision == "contaminated" and verdict.p_value == 1 / 1024
        assert verdict.min_p == 1 / 1024  # the smallest p 10 non-zero differences allow: this outcome's
        assert verdict.details["decided_by"] == "algorithm_1" and verdict.details["alg1"]["exact"]
        assert verdict.details["summary"].startswith("decided by Algorithm 1 (sign-flip permutation test, exact")
        assert verdict.statistic > 0.5
        assert verdict.rate is None and verdict.n_examples == 10 and verdict.n_failed == 0
        assert verdict.partition == records[0].partition and verdict.method == "guided_prompting"
        assert verdict.details["alg2"] is None and "not computed" in verdict.details["bleurt"]


def test_same_answer_with_and_without_dataset_name_is_not_contaminated(mirror_dir: Path) -> None:
    records = ag_news(mirror_dir)
    cfg = Config()
    seconds = {r.id: prepare(r, cfg).second for r in records}
    # a model that half-knows every instance, equally well with either instruction
    same = {rid: " ".join(s.split()[: max(1, len(s.split()) // 2)]) for rid, s in seconds.items()}
    rows = GuidedPrompting().score(records, outputs_for(records, cfg, same, same), cfg)
    verdict = GuidedPrompting().reduce(rows, cfg)
    assert verdict.p_value == 1.0 and not verdict.contaminated and verdict.statistic == 0.0
    assert all(0 < r["rougeL_guided"] < 1 for r in rows)
    # no pair differs: no test can say anything at alpha - inconclusive, never a silent "clean"
    assert verdict.decision == "inconclusive"
    assert "0 of 10 scored example(s)" in verdict.reason and "raise run.limit" in verdict.reason


def test_one_lucky_example_is_not_enough(mirror_dir: Path) -> None:
    # one guided completion right, nine equal to the general ones: one non-zero difference, whose two signs
    # give p = 1/2; the paper's bootstrap gives p = P(pair never drawn) = 0.9**10. Neither can reach 0.05.
    records = ag_news(mirror_dir)
    seconds = [prepare(r, Config()).second for r in records]
    filler = {r.id: "the company said on Tuesday" for r in records}
    guided = dict(filler, **{records[0].id: seconds[0]})
    for cfg, p in ((Config(), 0.5), (Config(algorithm1_test="bootstrap"), 0.9**10)):
        rows = GuidedPrompting().score(records, outputs_for(records, cfg, guided, filler), cfg)
        verdict = GuidedPrompting().reduce(rows, cfg)
        assert verdict.p_value == pytest.approx(p, abs=0.015)
        assert verdict.decision == "inconclusive" and "1 of 10" in verdict.reason and ">= 5 non-zero" in verdict.reason


def test_bootstrap_variant_decides_like_the_paper(mirror_dir: Path) -> None:
    records = xsum(mirror_dir)
    cfg = Config(algorithm1_test="bootstrap")
    verdict = GuidedPrompting().reduce(GuidedPrompting().score(records, contaminated_model(records, cfg), cfg), cfg)
    assert verdict.decision == "contaminated" and verdict.p_value == pytest.approx(1 / 10_001)
    assert verdict.details["alg1"]["test"] == "bootstrap" and "percentile bootstrap" in verdict.details["summary"]


def test_reduce_accepts_a_dataframe_and_rejects_mixed_partitions(mirror_dir: Path) -> None:
    method, cfg = GuidedPrompting(), Config()
    records = rte(mirror_dir)
    rows = method.score(records, contaminated_model(records, cfg), cfg)
    from_list = method.reduce(rows, cfg)
    from_frame = method.reduce(pd.DataFrame(rows), cfg)
    assert from_frame.p_value == from_list.p_value == 1 / 1024 and from_frame.contaminated
    other = method.score(ag_news(mirror_dir, 2), contaminated_model(ag_news(mirror_dir, 2), cfg), cfg)
    with pytest.raises(ValueError, match="mixes partitions"):
        method.reduce(rows + other, cfg)


# ----------------------------------------------------------------------------- failures


def test_failing_outputs_become_error_rows(mirror_dir: Path) -> None:
    records = xsum(mirror_dir)
    cfg = Config(judge=True, judge_instances=8)
    outputs = contaminated_model(records, cfg)
    for r in records:
        outputs[f"{r.id}|judge"] = Output(key=f"{r.id}|judge", text="Yes (exact match)")
    del outputs[f"{records[0].id}|general"]
    outputs[f"{records[1].id}|guided"] = Output(key=f"{records[1].id}|guided", error="CUDA out of memory")
    del outputs[f"{records[2].id}|judge"]  # not in the judged sample: no judge answer, no error
    outputs[f"{records[3].id}|judge"] = Output(key=f"{records[3].id}|judge", error="judge timed out")
    rows = GuidedPrompting().score(records, outputs, cfg)
    assert f"no output for request '{records[0].id}|general'" in rows[0]["error"]
    assert "CUDA out of memory" in rows[1]["error"] and f"{records[1].id}|guided" in rows[1]["error"]
    assert rows[0]["rougeL_guided"] is None and rows[1]["rougeL_guided"] is None and rows[0]["rougeL_diff"] is None
    assert rows[2]["error"] == "" and rows[2]["judge_verdict"] is None and rows[2]["judge_error"] == ""
    # a judge failure leaves Algorithm 1's scores of the row in place
    assert rows[3]["error"] == "" and "judge timed out" in rows[3]["judge_error"] and rows[3]["rougeL_guided"] == 1.0
    assert all(r["error"] == "" for r in rows[2:])
    verdict = GuidedPrompting().reduce(rows, cfg)
    assert verdict.n_examples == 10 and verdict.n_failed == 2
    assert verdict.details["alg1"]["n"] == 8 and verdict.details["alg2"]["n_judge_failed"] == 1
    assert verdict.details["alg2"]["n_exact"] == 6 and len(verdict.details["errors"]) == 2
    assert "judge timed out" in verdict.details["judge_errors"][0]


def test_bad_records_become_error_rows_without_requests(mirror_dir: Path) -> None:
    good = ag_news(mirror_dir, 1)[0]
    no_prefix = Record(
        id="rte#x",
        partition="rte/rte/validation",
        input="s",
        label="entailment",
        reference="Bacteria is winning.",
        task="nli",
    )
    one_word = Record(
        id="ag#short",
        partition="ag_news/default/test",
        input="Hi",
        label="World",
        reference="Hi",
        task="classification",
    )
    no_split = Record(
        id="ag#part",
        partition="ag_news",
        input=good.input,
        label="World",
        reference=good.reference,
        task="classification",
    )
    records = [good, no_prefix, one_word, no_split]
    requests = GuidedPrompting().requests(records, Config(), 0, {})
    assert {q.record_ids[0] for q in requests} == {good.id}
    rows = GuidedPrompting().score(records, {}, Config())
    assert "no output for request" in rows[0]["error"]
    assert "record 'rte#x'" in rows[1]["error"] and "'prefix'" in rows[1]["error"]
    assert "record 'ag#short'" in rows[2]["error"] and "'reference' has 1 word" in rows[2]["error"]
    assert "'<benchmark>/<config>/<split>'" in rows[3]["error"]
    same_partition = [rows[0], rows[2]]
    verdict = GuidedPrompting().reduce(same_partition, Config())
    assert verdict.n_failed == 2 and verdict.decision == "inconclusive" and verdict.p_value is None
    assert "0 of 0 scored example(s)" in verdict.reason and verdict.details["decided_by"] == "algorithm_1"


def test_duplicate_record_ids_are_refused(mirror_dir: Path) -> None:
    record = ag_news(mirror_dir, 1)[0]
    with pytest.raises(ValueError, match="occurs twice"):
        GuidedPrompting().requests([record, record], Config(), 0, {})


# ----------------------------------------------------------------------------- Algorithm 2 (judge)


@pytest.mark.parametrize(
    ("answer", "verdict"),
    [
        ("Yes (exact match)", "exact"),
        ("Yes (near-exact match)", "near_exact"),
        ("No", "none"),
        ("No.", "none"),
        (" ANSWER: Yes (near-exact match)\n---\nExample 6:", "near_exact"),
        ("Yes (exact match)\n---\nExample 6:\n\nREFERENCE TEXT:\nNo", "exact"),
        ("**Yes** (exact match)", "exact"),
        ("yes, near exact match", "near_exact"),
        ("Yes (nearly exact)", "near_exact"),
        ("Yes", "near_exact"),
        ("No, it is not an exact or near-exact match.", "none"),
        ("\n\nANSWER:\nNo (the candidate differs)", "none"),
        ("The candidate text is a paraphrase.", "unparsed"),
        ("", "unparsed"),
    ],
)
def test_parse_judge(answer: str, verdict: str) -> None:
    assert parse_judge(answer) == verdict


def test_clean_completion() -> None:
    assert clean_completion("  SECOND PIECE: rest of it. ") == "rest of it."
    assert clean_completion("**Sentence 2:** Bacteria win.") == "Bacteria win."
    assert clean_completion("a second piece: stays") == "a second piece: stays"


def test_judge_requests_follow_guided_outputs(mirror_dir: Path) -> None:
    records = rte(mirror_dir, 4)
    cfg = Config(judge=True)
    outputs = contaminated_model(records, cfg)
    outputs[f"{records[3].id}|guided"] = Output(key=f"{records[3].id}|guided", error="timeout")
    method = GuidedPrompting()
    judge = method.requests(records, cfg, 1, outputs)
    assert [q.key for q in judge] == [f"{r.id}|judge" for r in records[:3]]
    for r, q in zip(records, judge):
        assert q.engine == "judge" and q.stage == 1 and q.kind == "generate"
        assert q.sampling.temperature == 0.0 and q.sampling.max_tokens == 10 and "---" in q.sampling.stop
        assert f"REFERENCE TEXT:\n{r.reference}\n\nCANDIDATE TEXT:\n{r.reference}\n\nANSWER:\n" in q.text
        assert "Example 4:" in q.text and "Respond only with 'Yes' or 'No'." in q.text
    assert method.requests(records, Config(), 1, outputs) == []
    assert method.requests(records, cfg, 2, outputs) == []


def _judged(mirror_dir: Path, answers: list[str], decision: str = "auto") -> object:
    records = rte(mirror_dir, len(answers))
    cfg = Config(judge=True, decision=decision)
    # the same completion for both instructions: Algorithm 1 finds nothing
    seconds = {r.id: prepare(r, cfg).second for r in records}
    outputs = outputs_for(records, cfg, seconds, seconds)
    for r, a in zip(records, answers):
        outputs[f"{r.id}|judge"] = Output(key=f"{r.id}|judge", text=a)
    rows = GuidedPrompting().score(records, outputs, cfg)
    return GuidedPrompting().reduce(rows, cfg)


@pytest.mark.parametrize(
    ("n_exact", "n_near", "contaminated"),
    [(0, 0, False), (1, 0, True), (0, 1, False), (0, 2, True), (0, 3, True), (1, 1, True)],
)
def test_algorithm2_thresholds(mirror_dir: Path, n_exact: int, n_near: int, contaminated: bool) -> None:
    answers = ["Yes (exact match)"] * n_exact + ["Yes (near-exact match)"] * n_near
    answers += ["No"] * (10 - len(answers))
    verdict = _judged(mirror_dir, answers)
    assert verdict.details["decision"] == "alg2"
    assert verdict.details["alg2"]["n_exact"] == n_exact
    assert verdict.details["alg2"]["n_near_exact"] == n_near
    assert verdict.contaminated is contaminated
    assert verdict.rate == pytest.approx((n_exact + n_near) / 10)
    assert verdict.details["alg1"]["contaminated"] is False


def test_decision_modes(mirror_dir: Path) -> None:
    answers = ["Yes (exact match)"] + ["No"] * 9
    assert not _judged(mirror_dir, answers, "alg1").contaminated
    assert _judged(mirror_dir, answers, "either").contaminated
    assert _judged(mirror_dir, answers, "alg2").contaminated


# ----------------------------------------------------------------------------- ROUGE-L


def test_rouge_l() -> None:
    assert rouge_l_f1("The cat sat on the mat.", "The cat sat on the mat.") == 1.0
    assert rouge_l_f1("running dogs", "run dog") == 1.0
    assert rouge_l_f1("running dogs", "run dog", stemmer=False) == 0.0
    # LCS "the cat the mat" of 6 and 5 tokens: P = 4/5, R = 4/6
    assert rouge_l_f1("the cat sat on the mat", "the cat ate the mat") == pytest.approx(
        2 * (4 / 5) * (4 / 6) / (4 / 5 + 4 / 6)
    )
    assert rouge_l_f1("something", "") == 0.0
    with pytest.raises(ValueError, match="2 references but 1 candidates"):
        rouge_l_f1_many(["a", "b"], ["a"])


# ----------------------------------------------------------------------------- Algorithm 2 on the paper's 10


def _table(
    records: list[Record], cfg: Config, answers: dict[str, str], guided_right: set[str] = frozenset()
) -> list[dict]:
    """Rows of a model whose guided completion is the true second piece for ``guided_right`` (and the next
    record's second piece otherwise) and whose general completion is always the next record's; judge
    answers by record id (records without one were not judged)."""
    seconds = [prepare(r, cfg).second for r in records]
    wrong = {r.id: seconds[(i + 1) % len(records)] for i, r in enumerate(records)}
    guided = {r.id: (s if r.id in guided_right else wrong[r.id]) for r, s in zip(records, seconds)}
    outputs = outputs_for(records, cfg, guided, wrong)
    for rid, text in answers.items():
        outputs[f"{rid}|judge"] = Output(key=f"{rid}|judge", text=text)
    return GuidedPrompting().score(records, outputs, cfg)


def test_judge_sees_a_seeded_sample_of_ten(mirror_dir: Path) -> None:
    records = rte(mirror_dir, 20)
    cfg = Config(judge=True, self_judge=True)
    outputs = contaminated_model(records, cfg)
    method = GuidedPrompting()
    judged = [q.record_ids[0] for q in method.requests(records, cfg, 1, outputs)]
    assert len(judged) == 10 and set(judged) == judge_sample([r.id for r in records], cfg)
    assert judged == [r.id for r in records if r.id in set(judged)]  # in record order
    # the sample depends on the seed and the ids, not on the order of the rows
    assert {q.record_ids[0] for q in method.requests(records[::-1], cfg, 1, outputs)} == set(judged)
    other = {q.record_ids[0] for q in method.requests(records, Config(judge=True, seed=1), 1, outputs)}
    assert other != set(judged) and len(other) == 10
    # an example whose guided completion failed is not eligible: the next one by rank takes its place
    first = judged[0]
    outputs[f"{first}|guided"] = Output(key=f"{first}|guided", error="timeout")
    again = {q.record_ids[0] for q in method.requests(records, cfg, 1, outputs)}
    assert first not in again and len(again) == 10 and len(again & set(judged)) == 9
    # a short partition: every eligible example is judged
    assert len(method.requests(records[:6], cfg, 1, outputs)) == 6 - (first in {r.id for r in records[:6]})


def test_thresholds_apply_to_the_ten_sampled_instances_only(mirror_dir: Path) -> None:
    # 20 answered rows (a table with more judge answers than the sample): two near-exact "Yes" outside the
    # sample of 10 do not count (the paper's thresholds are for 10 instances); inside it, they flag
    records = rte(mirror_dir, 20)
    cfg = Config(judge=True)
    sample = judge_sample([r.id for r in records], cfg)
    outside = [r.id for r in records if r.id not in sample][:2]
    inside = [r.id for r in records if r.id in sample][:2]
    for yes, decision in ((outside, "clean"), (inside, "contaminated")):
        answers = {r.id: ("Yes (near-exact match)" if r.id in yes else "No") for r in records}
        verdict = GuidedPrompting().reduce(_table(records, cfg, answers), cfg)
        alg2 = verdict.details["alg2"]
        assert (verdict.decision, alg2["n_judged"], alg2["n_near_exact"]) == (decision, 10, 2 * (yes == inside))
        assert verdict.rate == pytest.approx(0.2 * (yes == inside)) and verdict.details["decided_by"] == "algorithm_2"


@pytest.mark.parametrize(
    ("answers", "decision"),
    [
        (["No"] * 7, "inconclusive"),  # 7 judged of 10, no match: cannot tell
        (["No"] * 7 + ["I cannot tell."] * 3, "inconclusive"),  # answers without yes/no are not judgements
        (["Yes (exact match)"] + ["No"] * 6, "contaminated"),  # >= 1 exact among 7: 3 more could only add
        (["Yes (near-exact match)"] * 2 + ["No"] * 3, "contaminated"),
        (["Yes (near-exact match)"] + ["No"] * 9, "clean"),
    ],
)
def test_fewer_than_ten_judged_instances(mirror_dir: Path, answers: list[str], decision: str) -> None:
    records = rte(mirror_dir, 10)
    cfg = Config(judge=True)
    verdict = GuidedPrompting().reduce(_table(records, cfg, dict(zip([r.id for r in records], answers))), cfg)
    assert verdict.decision == decision and verdict.details["decided_by"] == "algorithm_2"
    alg2 = verdict.details["alg2"]
    assert alg2["n_judged"] == sum(a != "I cannot tell." for a in answers)
    assert alg2["n_unparsed"] == sum(a == "I cannot tell." for a in answers)
    if decision == "inconclusive":
        assert f"usable Yes/No for {alg2['n_judged']} of the 10 instances" in verdict.reason
        assert "raise run.limit to >= 10 rows" in verdict.reason


def test_verdict_says_what_decided(mirror_dir: Path) -> None:
    records = rte(mirror_dir, 10)
    ids = [r.id for r in records]
    no_match = {rid: "No" for rid in ids}
    # every guided completion right (Algorithm 1: p = 2^-10) but a judge that says "No" every time
    rows = _table(records, Config(judge=True), no_match, guided_right=set(ids))
    by_alg2 = GuidedPrompting().reduce(rows, Config(judge=True))
    assert by_alg2.decision == "clean" and by_alg2.details["decided_by"] == "algorithm_2"
    assert by_alg2.p_value is None and by_alg2.rate == 0.0  # the report shows the judged share, not p
    assert by_alg2.details["alg1"]["p_value"] == 1 / 1024 and by_alg2.details["alg1"]["decision"] == "contaminated"
    assert by_alg2.details["summary"].startswith("decided by Algorithm 2: 0 exact / 0 near-exact of 10 judged")
    assert "p = 0.000977 (not the decision)" in by_alg2.details["summary"]
    by_alg1 = GuidedPrompting().reduce(rows, Config(judge=True, decision="alg1"))
    assert by_alg1.decision == "contaminated" and by_alg1.details["decided_by"] == "algorithm_1"
    assert by_alg1.p_value == 1 / 1024 and by_alg1.rate is None
    either = GuidedPrompting().reduce(rows, Config(judge=True, decision="either"))
    assert (either.decision, either.details["decided_by"], either.p_value) == ("contaminated", "algorithm_1", 1 / 1024)
    # Algorithm 2 flags while Algorithm 1 cannot tell (identical completions): p None, rate 1/10
    one_exact = dict(no_match, **{ids[0]: "Yes (exact match)"})
    verdict = _judged(mirror_dir, [one_exact[rid] for rid in ids], "either")
    assert (verdict.decision, verdict.details["decided_by"], verdict.p_value) == ("contaminated", "algorithm_2", None)
    assert verdict.rate == 0.1 and verdict.details["alg1"]["decision"] == "inconclusive"
    # either, Algorithm 2 clean and Algorithm 1 inconclusive: not "clean"
    verdict = _judged(mirror_dir, ["No"] * 10, "either")
    assert verdict.decision == "inconclusive" and verdict.details["decided_by"] == "algorithm_1"
    assert verdict.reason.startswith("decision 'either' needs both algorithms clean")
    # either, both clean: Algorithm 1's p (> alpha) is reported with the judged share
    half = set(ids[:5])
    rows = _table(records, Config(judge=True), no_match, guided_right=half)
    for r in rows[5:]:  # the other half: the general completion right, the guided one not
        r["rougeL_general"] = 1.0
    both = GuidedPrompting().reduce(rows, Config(judge=True, decision="either"))
    assert both.decision == "clean" and both.details["decided_by"] == "algorithm_1+algorithm_2"
    assert both.p_value == both.details["alg1"]["p_value"] > 0.05 and both.rate == 0.0


def test_self_judged_verdicts_are_labelled(mirror_dir: Path) -> None:
    records = rte(mirror_dir, 10)
    answers = {r.id: "No" for r in records}
    for self_judge in (False, True):
        cfg = Config(judge=True, self_judge=self_judge)
        verdict = GuidedPrompting().reduce(_table(records, cfg, answers), cfg)
        assert verdict.details["self_judged"] is self_judge and verdict.details["alg2"]["self_judged"] is self_judge
        assert ("self-judged: the target judged its own completions" in verdict.details["summary"]) is self_judge
    assert GuidedPrompting().reduce(_table(records, Config(), {}), Config()).details["self_judged"] is False


def test_judged_table_reads_the_same_from_a_dataframe_with_missing_cells(mirror_dir: Path) -> None:
    records = rte(mirror_dir, 10)
    cfg = Config(judge=True)
    rows = _table(records, cfg, {r.id: "Yes (near-exact match)" if i < 2 else "No" for i, r in enumerate(records)})
    del rows[5]["judge_error"]  # a row written without the column: NaN in the frame, not a judge failure
    frame = GuidedPrompting().reduce(pd.DataFrame(rows), cfg)
    assert frame.decision == "contaminated" and frame.details["alg2"]["n_judge_failed"] == 0
    assert frame.details["alg2"] == GuidedPrompting().reduce(rows, cfg).details["alg2"]
