"""Clean-vs-dirty evaluation: per-option perplexity on a real model, and the subset accuracies + tests."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from contamray.benchmarks import load_records
from contamray.methods.base import Output, get_method
from contamray.methods.closed import clean_dirty_eval as cde


@pytest.fixture(scope="module")
def arc(mirror_dir: Path):
    return load_records("arc_challenge", mirror_dir=mirror_dir, n=None).records[:6]


def test_requests_score_the_prompt_and_each_option(arc):
    method = get_method("clean_dirty_eval")
    cfg = method.make_config({"contamination_from": "meteor_recall"})
    requests = method.requests(arc, cfg, 0, {})
    assert len(requests) == sum(1 + len(r.choices) for r in arc)
    first = [q for q in requests if q.record_ids == (arc[0].id,)]
    assert first[0].text == f"Question: {arc[0].input}\nAnswer:" and first[0].kind == "score"
    assert [q.text for q in first[1:]] == [f"{first[0].text} {c}" for c in arc[0].choices]
    assert method.requests(arc, cfg, 1, {}) == []
    assert method.family == "closed" and method.contamination_source(cfg) == "meteor_recall"
    # chat: true - the prompt is a user turn of the model's chat template, each option the assistant's reply
    chat = method.requests(arc, method.make_config({"contamination_from": "meteor_recall", "chat": True}), 0, {})
    first_chat = [q for q in chat if q.record_ids == (arc[0].id,)]
    # no request for the prompt alone: each answer says where its reply starts (Output.prompt_tokens)
    assert [q.key for q in first_chat] == [q.key for q in first[1:]] and all(q.chat for q in first_chat)
    assert {q.text for q in first_chat} == {first[0].text}
    assert [q.reply for q in first_chat] == list(arc[0].choices)  # no space: the reply follows the header
    assert not any(q.chat or q.reply for q in requests)


def test_lowest_perplexity_option_on_a_real_model(arc):
    """SmolLM2-135M scores the options; the continuation log-probs are those of the option's tokens."""
    from contamray.engines import EngineSpec, build_engine
    from contamray.pipeline.actors import answer_requests

    engine = build_engine(EngineSpec(source="smollm2-135m", backend="hf", dtype="float32"))
    method = get_method("clean_dirty_eval")
    cfg = method.make_config({"contamination_from": "meteor_recall"})
    requests = method.requests(arc, cfg, 0, {})
    outputs = {o.key: o for o in answer_requests(engine, requests)}
    rows = method.score(arc, outputs, cfg)
    assert all(not r["error"] for r in rows)
    for record, row in zip(arc, rows, strict=True):
        assert row["gold"] == cde.gold_index(record) and record.choices[row["gold"]] == record.label
        assert row["prediction"] == min(range(len(record.choices)), key=lambda k: row["perplexities"][k])
        assert row["correct"] == (row["prediction"] == row["gold"])
        # independent check: the prompt's tokens are a prefix of prompt + option's tokens, and the
        # option's perplexity is exp(-mean) of the log-probs of exactly the tokens after that prefix
        prompt = cde.prompt(record, cfg)
        n_prompt = len(engine.encode([prompt])[0])
        for k, choice in enumerate(record.choices):
            full_ids = engine.encode([f"{prompt} {choice}"])[0]
            assert full_ids[:n_prompt] == engine.encode([prompt])[0]
            scores = engine.score([f"{prompt} {choice}"])[0]
            tail = scores.token_logprobs[n_prompt - 1 :]
            assert len(tail) == len(full_ids) - n_prompt
            assert row["perplexities"][k] == pytest.approx(math.exp(-sum(tail) / len(tail)), rel=1e-4)


def _fisher_greater(a: int, n_a: int, b: int, n_b: int) -> float:
    """P(X >= a) for X ~ Hypergeometric(total n_a + n_b, successes a + b, draws n_a): by hand."""
    total, k = n_a + n_b, a + b
    denom = math.comb(total, n_a)
    return sum(math.comb(k, x) * math.comb(total - k, n_a - x) for x in range(a, min(k, n_a) + 1)) / denom


def _table(counts: dict[str, tuple[int, int]]) -> list[dict]:
    rows = []
    for kind, (correct, n) in counts.items():
        for i in range(n):
            rows.append(
                {
                    "record_id": f"{kind}-{i}", "partition": "p", "error": "", "correct": i < correct,
                    "contaminated": kind != "clean", "contamination_type": kind,
                }
            )  # fmt: skip
    return rows


def test_subset_accuracies_and_fisher_test():
    method = get_method("clean_dirty_eval")
    cfg = method.make_config({"contamination_from": "meteor_recall"})
    rows = _table({"clean": (40, 80), "input_only": (3, 5), "input_and_label": (13, 15)})
    rows.append({"record_id": "bad", "partition": "p", "error": "no options", "contamination_type": "clean"})
    v = method.reduce(rows, cfg)
    d = v.details
    assert (d["n_clean"], d["n_input_only"], d["n_input_and_label"], d["n_dirty"]) == (80, 5, 15, 20)
    assert (d["accuracy_clean"], d["accuracy_input_and_label"], d["accuracy_dirty"]) == (0.5, 13 / 15, 0.8)
    assert v.statistic == pytest.approx(0.3) and v.rate == pytest.approx(20 / 100)
    assert v.p_value == pytest.approx(_fisher_greater(16, 20, 40, 80))
    assert d["p_input_and_label_vs_clean"] == pytest.approx(_fisher_greater(13, 15, 40, 80))
    assert v.p_value < 0.05 and v.contaminated and (v.n_examples, v.n_failed) == (101, 1)
    assert v.min_p == pytest.approx(math.comb(56, 20) / math.comb(100, 20))  # 56 right of 100: all 20 dirty right
    same = method.reduce(_table({"clean": (40, 80), "input_and_label": (10, 20)}), cfg)
    assert same.statistic == 0.0 and same.p_value > 0.5 and not same.contaminated


def test_rows_the_open_data_scan_failed_on_are_failed_not_clean():
    """The open-data methods report a row they failed on as not contaminated ("clean"); the runner merges the
    scan's error (``contamination_error``), and such a row is a failed row here - in neither subset, counted in
    ``n_failed`` so that ``settle``'s failure share applies - never a clean one. And p = alpha decides, as every
    test's decision does (``decision_at``)."""
    method = get_method("clean_dirty_eval")
    cfg = method.make_config({"contamination_from": "llm_decontaminator"})
    rows = _table({"clean": (40, 80), "input_and_label": (13, 15)})
    for r in rows[:30]:
        r["contamination_error"] = "" if r is not rows[0] else None
    for i in range(70):  # the judge failed on these: the scan calls them clean
        rows.append({"record_id": f"judge-{i}", "partition": "p", "error": "", "correct": False,
                     "contaminated": False, "contamination_type": "clean",
                     "contamination_error": "judge request failed: HTTP 500"})  # fmt: skip
    v = method.reduce(rows, cfg)
    d = v.details
    assert (d["n_clean"], d["n_dirty"], d["n_scan_failed"]) == (80, 15, 70) and v.n_failed == 70
    assert any("the open-data scan (llm_decontaminator) failed: judge request failed" in e for e in d["errors"])
    assert v.p_value == pytest.approx(_fisher_greater(13, 15, 40, 80))  # as without the failed rows
    assert method.settle(v, cfg).decision == "contaminated"  # 70 of 165 failed: at most half
    more = rows + [dict(rows[-1], record_id=f"judge-more-{i}") for i in range(30)]
    settled = method.settle(method.reduce(more, cfg), cfg)
    assert settled.decision == "inconclusive" and "100 of 195 rows failed" in settled.reason, settled.reason


def test_set_apart_types_are_in_neither_subset():
    """template_only and frequent_only examples (ngram_overlap's) are counted apart, not as clean or dirty."""
    method = get_method("clean_dirty_eval")
    cfg = method.make_config({"contamination_from": "gpt3_13gram"})
    rows = _table({"clean": (40, 80), "input_and_label": (13, 15), "template_only": (7, 7), "frequent_only": (0, 2)})
    d = method.reduce(rows, cfg).details
    assert (d["n_clean"], d["n_dirty"], d["n_unsplit"]) == (80, 15, 9)
    assert (d["n_unsplit_template_only"], d["n_unsplit_frequent_only"]) == (7, 2)
    assert d["accuracy_all"] == pytest.approx(53 / 95)  # the 9 set apart are in no accuracy


def test_missing_split_and_bad_config_are_named(arc):
    method = get_method("clean_dirty_eval")
    cfg = method.make_config({"contamination_from": "exact_match"})
    with pytest.raises(ValueError, match=r"no contamination_type column.*methods.exact_match"):
        method.reduce([{"record_id": "a", "partition": "p", "error": "", "correct": True}], cfg)
    with pytest.raises(ValueError, match="contamination_from is empty"):
        method.make_config({})
    with pytest.raises(ValueError, match="no \\{input\\} placeholder"):
        method.make_config({"contamination_from": "x", "template": "Q:"})
    # a failed option score makes its example an error row, not a crash
    outputs = {f"{arc[0].id}|prompt": Output(key=f"{arc[0].id}|prompt", error="CUDA OOM")}
    row = method.score(arc[:1], outputs, cfg)[0]
    assert "prompt score missing or failed (CUDA OOM)" in row["error"]
    # so do log-probabilities that are no score (an overflow: -inf, NaN, or so low that exp() would overflow)
    from contamray.methods.closed.clean_dirty_eval import _key, answered

    record = arc[0]
    for bad in (float("-inf"), float("nan"), -800.0):
        outputs = {_key(record.id, "prompt"): Output(key="p", token_logprobs=[-1.0, -1.0], num_tokens=2)}
        for k in range(len(record.choices)):
            outputs[_key(record.id, str(k))] = Output(key=str(k), token_logprobs=[-1.0, -1.0, bad if k == 0 else -2.0],
                                                      num_tokens=3)  # fmt: skip
        assert "option 0's mean token log-probability" in answered(record, outputs, "clean_dirty_eval")["error"]


def test_no_dirty_subset_or_too_few_rows_is_inconclusive_not_clean():
    method = get_method("clean_dirty_eval")
    cfg = method.make_config({"contamination_from": "meteor_recall"})
    nothing_dirty = method.reduce(_table({"clean": (12, 20)}), cfg)
    assert nothing_dirty.decision == "inconclusive" and not nothing_dirty.contaminated
    assert "no dirty example" in nothing_dirty.reason and "meteor_recall" in nothing_dirty.reason
    # 2 dirty of 6: even both dirty rows correct and every clean one wrong gives p = C(2,2)/C(6,2) = 1/15 > 0.05
    tiny = method.reduce(_table({"clean": (0, 4), "input_and_label": (2, 2)}), cfg)
    assert tiny.decision == "inconclusive" and "run.limit" in tiny.reason
    assert tiny.p_value == pytest.approx(1 / 15)
    enough = method.reduce(_table({"clean": (0, 6), "input_and_label": (4, 4)}), cfg)  # p = 1 / C(10, 4)
    assert enough.decision == "contaminated" and enough.p_value == pytest.approx(1 / 210)
    assert enough.min_p == pytest.approx(1 / 210) and tiny.min_p == pytest.approx(1 / 15)  # the extreme tables'


def _topic_rows(rng, effect: float = 0.0, topics: int = 10, per_topic: int = 10) -> list[dict]:
    """One clean-by-construction partition (``effect`` 0) of ``topics`` x ``per_topic`` rows: topic accuracies
    spread by 0.15 (sd), the easier half of the topics found on the web 5 x as often (a row flagged with
    probability 0.5 v 0.1), correct or not independent of the flag within a topic - unless ``effect`` > 0, the
    dirty rows' gain in accuracy."""
    rows = []
    for t in range(topics):
        accuracy = float(np.clip(0.5 + 0.15 * rng.standard_normal(), 0.05, 0.95))
        flag = 0.5 if accuracy > 0.5 else 0.1
        for i in range(per_topic):
            dirty = bool(rng.random() < flag)
            correct = bool(rng.random() < min(1.0, accuracy + effect * dirty))
            rows.append({"record_id": f"t{t}-{i}", "partition": "p", "error": "", "correct": correct,
                         "stratum": f"subject=topic{t}", "contaminated": dirty,
                         "contamination_type": "input_and_label" if dirty else "clean"})  # fmt: skip
    return rows


def test_dirty_and_clean_rows_are_compared_within_topics():
    """An easy subject found on the web and a hard one not: the pooled table says "dirty rows score higher"
    (Fisher p = 0.033) though within each subject dirty and clean rows score alike - what the web holds, not what
    contamination did. Within topics (the default) it is clean, with the pooled reading still there on request."""
    method = get_method("clean_dirty_eval")
    rows = []
    for topic, (dirty, clean) in {"easy": ((16, 20), (8, 10)), "hard": ((2, 10), (6, 30))}.items():
        part = _table({"input_and_label": dirty, "clean": clean})
        rows += [dict(r, record_id=f"{topic}-{r['record_id']}", stratum=f"subject={topic}") for r in part]
    within = method.reduce(rows, method.make_config({"contamination_from": "meteor_recall"}))
    pooled = method.reduce(rows, method.make_config({"contamination_from": "meteor_recall", "strata": "none"}))
    assert pooled.p_value == pytest.approx(_fisher_greater(18, 30, 14, 40)) and pooled.details["strata"] == "none"
    assert within.decision == "clean" and within.p_value > 0.4, within.p_value
    assert within.details["n_strata"] == 2 and within.details["n_strata_compared"] == 2
    assert within.details["odds_ratio_mh"] == pytest.approx(1.0)  # alike within each topic
    assert "within 2 of 2 topics" in within.details["summary"]
    # one topic: the exact test is Fisher's, by hand
    easy = [r for r in rows if r["stratum"] == "subject=easy"]
    assert method.reduce(easy, method.make_config({"contamination_from": "x"})).p_value == pytest.approx(
        _fisher_greater(16, 20, 8, 10))
    # a topic all dirty or all clean carries no within-topic evidence; none with both: inconclusive, saying why
    apart = [dict(r, stratum=f"subject={r['contamination_type']}") for r in rows]
    verdict = method.reduce(apart, method.make_config({"contamination_from": "meteor_recall"}))
    assert verdict.decision == "inconclusive" and "no topic has both dirty and clean rows" in verdict.reason
    assert "strata=none" in verdict.reason


def test_the_within_topic_test_holds_alpha_where_the_pooled_one_does_not_and_finds_a_real_gain():
    """Clean by construction (see ``_topic_rows``): 600 partitions. Within topics (exact, conditional on each
    topic's margins) at most alpha + 3 sd are flagged (17 of 600 when written); pooled (Fisher's test on one table, the
    old reading) far more (132 of 600). With dirty rows 0.3 more often correct, most are flagged within topics (75 of
    100)."""
    method = get_method("clean_dirty_eval")
    within_cfg = method.make_config({"contamination_from": "meteor_recall"})
    pooled_cfg = method.make_config({"contamination_from": "meteor_recall", "strata": "none"})
    rng = np.random.default_rng(2026)
    draws, within, pooled = 600, 0, 0
    for _ in range(draws):
        rows = _topic_rows(rng)
        within += method.reduce(rows, within_cfg).decision == "contaminated"
        pooled += method.reduce(rows, pooled_cfg).decision == "contaminated"
    bound = 0.05 + 3 * math.sqrt(0.05 * 0.95 / draws)
    assert within / draws <= bound, within
    assert pooled / draws > 0.12, pooled  # the confound the stratification removes
    found = sum(method.reduce(_topic_rows(rng, effect=0.3), within_cfg).decision == "contaminated" for _ in range(100))
    assert found >= 60, found


def test_a_rows_stratum_is_its_declared_topic(arc):
    method = get_method("clean_dirty_eval")
    record = arc[0]
    topical = replace(record, meta={**record.meta, "subject": "astronomy"})
    rows = method.score([record, topical], {}, method.make_config({"contamination_from": "x"}))
    assert [r["stratum"] for r in rows] == ["", "subject=astronomy"]
    pooled = method.score([topical], {}, method.make_config({"contamination_from": "x", "strata": "none"}))
    assert pooled[0]["stratum"] == ""
    with pytest.raises(ValueError, match="strata='subject' is not one of topic, none"):
        method.make_config({"contamination_from": "x", "strata": "subject"})
