"""Membership scores (Min-K%, Min-K%++, perplexity, zlib, lowercase, reference-model ratio) and their test.

Known answers used here:
- hand-computed Min-K% means and Min-K%++ z-scores;
- on the real model, each score equals the formula evaluated on a naive full-softmax computation;
- on a model fine-tuned on one ARC-Challenge slice (``contaminated_model``), Min-K%++ separates that slice
  from an unseen slice with AUC >= 0.9, and the reference-model ratio against the base model does too.
"""

from __future__ import annotations

import dataclasses
import math
import zlib

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import binom

from contamray.engines import resolve_model_path
from contamray.engines.hf import HFEngine
from contamray.methods.base import Output, get_method, method_names
from contamray.methods.closed.heldout_test import min_p_value
from contamray.methods.closed.membership_scores import k_count, min_k_mean, min_k_plus_plus_tokens
from contamray.records import Record
from contamray.stats.tests import joint_mann_whitney_greater
from tests.test_sharded_likelihood import run_stages

NAMES = ("min_k", "min_k_plus_plus", "perplexity", "zlib_ratio", "lowercase_ratio", "reference_ratio")


def rec(i: int, text: str, partition: str = "bench/default/test") -> Record:
    return Record(
        id=f"r{i}", partition=partition, input=text, label="", reference="", task="question_answering", order=i
    )


def test_all_methods_are_registered():
    assert set(NAMES) <= set(method_names())
    assert get_method("reference_ratio").engine_roles_for(get_method("reference_ratio").make_config({})) == (
        "target",
        "reference",
    )
    assert get_method("min_k_plus_plus").score_scope == "example"


# ----------------------------------------------------------------------------- arithmetic


def test_min_k_mean_by_hand():
    values = [-0.1, -5.0, -0.2, -3.0, -0.3, -0.4, -0.5, -0.6, -0.7, -1.0]
    assert min_k_mean(values, 0.2) == pytest.approx((-5.0 - 3.0) / 2)  # 2 lowest of 10
    assert min_k_mean(values, 0.05) == pytest.approx(-5.0)  # int(0.5) = 0 -> at least one token
    assert min_k_mean(values, 1.0) == pytest.approx(np.mean(values))
    assert k_count(3, 0.2) == 1 and k_count(100, 0.2) == 20


def test_min_k_plus_plus_tokens_by_hand():
    z = min_k_plus_plus_tokens([-1.0, -2.0], [-1.5, -1.0], [0.5, 2.0])
    assert z.tolist() == pytest.approx([1.0, -0.5])
    assert np.isfinite(min_k_plus_plus_tokens([-1.0], [-1.0], [0.0])).all()  # sigma floored


def test_a_contiguous_block_of_an_ordered_split_is_warned_about_in_heldout_mode():
    from contamray.methods.base import BenchmarkFacts

    method = get_method("min_k")
    config = method.make_config({"reference": {"mmlu": "mmlu_val"}})

    def facts(sample: str, adapter: str = "mmlu") -> BenchmarkFacts:
        return BenchmarkFacts("mmlu", adapter, "all", "test", "multiple_choice", True, 100, sample)

    (warning,) = [w for w in method.plan_warnings(config, facts("first")) if "sample=first" in w]
    assert "MMLU is sorted by subject" in warning and "benchmarks.mmlu.sample=random" in warning
    assert not [w for w in method.plan_warnings(config, facts("random")) if "sample=first" in w]
    # a generated benchmark's rows are independent draws in any order
    assert not [w for w in method.plan_warnings(config, facts("first", "synthetic_facts")) if "sample=first" in w]


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match=r"methods\.min_k.*fractions"):
        get_method("min_k").make_config({"k": 20})
    with pytest.raises(ValueError, match=r"methods\.perplexity\.fields"):
        get_method("perplexity").make_config({"fields": ["text"]})
    with pytest.raises(ValueError, match="unknown parameter"):
        get_method("zlib_ratio").make_config({"window": 3})


# ----------------------------------------------------------------------------- on the real model


@pytest.fixture(scope="module")
def base_engine() -> HFEngine:
    return HFEngine(resolve_model_path("smollm2-135m"), dtype="float32", batch_size=8)


def naive(engine: HFEngine, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token log-probs, vocabulary mean and std of log p, from the model's full softmax."""
    ids = torch.tensor([engine.encode([text])[0]])
    with torch.inference_mode():
        logp = torch.log_softmax(engine.model(input_ids=ids).logits[0, :-1].double(), dim=-1)
    p = logp.exp()
    mu = (p * logp).sum(-1)
    sd = ((p * (logp - mu[:, None]) ** 2).sum(-1)).sqrt()
    lp = logp.gather(1, ids[0, 1:, None]).squeeze(1)
    return lp.numpy(), mu.numpy(), sd.numpy()


TEXT = "Where did fortune cookies originate? They were first served in California, not in China."


@pytest.mark.slow
def test_scores_equal_their_formulas_on_the_real_model(base_engine: HFEngine):
    records = [rec(0, TEXT)]
    lp, mu, sd = naive(base_engine, TEXT)
    lp_lower, _, _ = naive(base_engine, TEXT.lower())
    cfg_kw = {"fields": ["input"]}
    rows = {}
    for name in NAMES:
        method = get_method(name)
        engines = {"target": base_engine, "reference": base_engine}
        out, _, _ = run_stages(method, records, method.make_config(cfg_kw), engines)
        assert out[0]["error"] == "", out[0]["error"]
        rows[name] = out[0]
    tol = dict(abs=2e-3)
    assert rows["perplexity"]["score"] == pytest.approx(lp.mean(), **tol)
    assert rows["perplexity"]["perplexity"] == pytest.approx(math.exp(-lp.mean()), rel=2e-3)
    assert rows["min_k"]["score"] == pytest.approx(np.sort(lp)[: max(1, int(0.2 * lp.size))].mean(), **tol)
    assert rows["min_k"]["min_k_60"] == pytest.approx(np.sort(lp)[: int(0.6 * lp.size)].mean(), **tol)
    z = (lp - mu) / sd
    assert rows["min_k_plus_plus"]["score"] == pytest.approx(np.sort(z)[: max(1, int(0.2 * z.size))].mean(), abs=1e-2)
    assert rows["zlib_ratio"]["score"] == pytest.approx(lp.mean() / len(zlib.compress(TEXT.encode())), abs=1e-4)
    assert rows["lowercase_ratio"]["score"] == pytest.approx(lp_lower.mean() / lp.mean(), rel=2e-3)
    assert rows["reference_ratio"]["score"] == pytest.approx(0.0, abs=1e-3)  # same model on both roles
    assert rows["min_k"]["n_tokens"] == lp.size and rows["min_k"]["n_windows"] == 1


@pytest.mark.slow
def test_long_text_is_windowed_and_every_token_scored(base_engine: HFEngine):
    text = " ".join(f"item{i}" for i in range(60))
    method = get_method("perplexity")
    config = method.make_config({"fields": ["input"], "context_len": 48, "stride": 24})
    rows, outputs, stages = run_stages(method, [rec(0, text)], config, {"target": base_engine})
    assert stages == 1 and list(outputs) == ["r0|text@target"]  # one request, windowed by the engine
    row = rows[0]
    assert row["error"] == "" and row["n_windows"] > 3 and "rolling windows" in row["note"]
    assert row["n_tokens"] == len(base_engine.encode([text])[0]) - 1


@pytest.mark.slow
def test_empty_and_failed_examples_are_error_rows(base_engine: HFEngine):
    method = get_method("min_k")
    config = method.make_config({"fields": ["input"]})
    records = [rec(0, "   "), rec(1, "A normal sentence about cats.")]
    outputs = {"r1|text@target": Output(key="r1|text@target", error="RuntimeError: out of memory")}
    rows = method.score(records, outputs, config)
    assert "fields ['input'] are all empty" in rows[0]["error"]
    assert "out of memory" in rows[1]["error"] and rows[1]["score"] is None
    assert method.requests(records, config, 0, {})[0].record_ids == ("r1",)  # nothing sent for the empty one


def test_min_k_plus_plus_needs_vocabulary_statistics():
    method = get_method("min_k_plus_plus")
    config = method.make_config({"fields": ["input"]})
    reqs = method.requests([rec(0, "Some text here.")], config, 0, {})
    assert reqs and all(r.vocab_stats for r in reqs)
    out = {"r0|text@target": Output(key="r0|text@target", token_logprobs=[-1.0, -2.0], num_tokens=2)}  # vLLM-like
    assert "vocabulary statistics" in method.score([rec(0, "Some text here.")], out, config)[0]["error"]


def test_non_finite_log_probabilities_fail_the_row_and_are_counted_not_dropped():
    """An engine answer holding NaN or inf (a broken forward pass) makes the row an error row - counted among the
    failed rows the verdict checks - instead of a NaN score the held-out test would silently leave out."""
    method = get_method("min_k_plus_plus")
    config = method.make_config({"fields": ["input"]})
    bad = {"r0|text@target": Output(key="r0|text@target", token_logprobs=[-1.0, float("nan")], token_mean=[-2.0, -2.0],
                                    token_std=[1.0, 1.0], num_tokens=2)}  # fmt: skip
    row = method.score([rec(0, "Some text here.")], bad, config)[0]
    assert row["score"] is None and "non-finite" in row["error"] and "dtype" in row["error"]
    inf_std = {"r0|text@target": Output(key="r0|text@target", token_logprobs=[-1.0, -2.0], token_mean=[-2.0, -2.0],
                                        token_std=[1.0, float("inf")], num_tokens=2)}  # fmt: skip
    assert "non-finite" in method.score([rec(0, "Some text here.")], inf_std, config)[0]["error"]
    plain = get_method("perplexity")  # vocabulary statistics not asked for: not read, not checked
    ok = plain.score([rec(0, "Some text here.")], inf_std, plain.make_config({"fields": ["input"]}))[0]
    assert not ok["error"] and math.isfinite(ok["score"])


# ----------------------------------------------------------------------------- reduce

OWN = "bench/default/test"
HELDOUT = "bench/set1/test"  # the same adapter: a held-out of the same benchmark
OTHER = "other/default/test"  # another benchmark


def table(
    own: list[float], ref: list[float] | None, member: bool = False, ref_partition: str = HELDOUT
) -> pd.DataFrame:
    rows = [
        {"record_id": f"a{i}", "partition": OWN, "score": s, "error": "", "is_reference": False}
        | ({"member": i % 2 == 0} if member else {})
        for i, s in enumerate(own)
    ]
    rows += [
        {"record_id": f"b{i}", "partition": ref_partition, "score": s, "error": "", "is_reference": True}
        for i, s in enumerate(ref or [])
    ]
    return pd.DataFrame(rows)


def test_declarations_and_modes():
    for name in NAMES:
        method = get_method(name)
        assert method.outputs.score == "score" and method.outputs.membership == "score"
        assert "higher = member" in method.outputs.score_label
        assert method.applies.min_rows == 10
        assert method.make_config({}).mode == "heldout"
    cfg = get_method("min_k").make_config({"reference": {"bench": "bench_heldout"}, "mode": "distribution"})
    assert cfg.reference == {"bench": "bench_heldout"}
    assert get_method("min_k").reference_benchmark(cfg, "bench") == "bench_heldout"
    assert get_method("min_k").reference_benchmark(cfg, "other") is None
    with pytest.raises(ValueError, match=r"methods\.perplexity\.mode.*heldout, distribution"):
        get_method("perplexity").make_config({"mode": "paired"})


def test_smallest_p_value_by_hand():
    assert min_p_value(3, 3) == pytest.approx(1 / 20)  # C(6, 3) rankings, one of them all-above
    assert min_p_value(10, 10) == pytest.approx(1 / 184756)
    assert min_p_value(0, 5) == 1.0


def test_reduce_heldout_mann_whitney():
    method = get_method("perplexity")
    config = method.make_config({"reference": "heldout"})
    high = [-1.0 - 0.01 * i for i in range(10)]
    low = [-3.0 - 0.01 * i for i in range(12)]
    v = method.reduce(table(high, low), config)
    assert v.decision == "contaminated" and v.p_value < 1e-3
    assert v.min_p == pytest.approx(1 / math.comb(22, 10))  # distinct scores: every ranking of 10 v 12 rows
    assert v.statistic == 1.0 and v.partition == OWN and v.n_examples == 10
    assert v.details["mode"] == "heldout" and "exchangeable" in v.details["null"]
    assert "12 held-out rows of the same benchmark" in v.details["summary"]
    assert v.details["summary"].endswith("-> contaminated")
    v = method.reduce(table(low, high), config)
    assert v.decision == "clean" and v.p_value > 0.9 and v.reason == ""


def _simulated(n_partitions: int, shift: float, seed: int) -> list[str]:
    """Decisions of ``reduce`` on partitions whose 20 scores are N(shift, 1) against 20 held-out N(0, 1)."""
    method = get_method("min_k")
    config = method.make_config({"reference": {"bench": "bench_heldout"}, "alpha": 0.05})
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_partitions):
        own = rng.normal(shift, 1.0, 20) - 4.0
        ref = rng.normal(0.0, 1.0, 20) - 4.0
        out.append(method.reduce(table(own.tolist(), ref.tolist()), config).decision)
    return out


def test_null_flag_rate_is_alpha_when_partition_and_heldout_are_iid():
    """The null, checked: 400 clean partitions against i.i.d. held-out rows flag at ~alpha = 5 %."""
    n = 400
    decisions = _simulated(n, 0.0, seed=13)
    flagged = decisions.count("contaminated")
    assert set(decisions) <= {"contaminated", "clean"}  # 20 vs 20 rows: never too few to decide
    # two-sided 99.9 % binomial interval around n * alpha = 20
    low, high = binom.ppf(0.0005, n, 0.05), binom.ppf(0.9995, n, 0.05)
    assert low <= flagged <= high, flagged
    shifted = _simulated(100, 1.0, seed=14)  # one standard deviation higher: power ~ 0.9
    assert shifted.count("contaminated") >= 80


def test_no_reference_is_inconclusive_and_says_what_to_set():
    method = get_method("min_k")
    v = method.reduce(table([-1.0 - i for i in range(12)], None), method.make_config({}))
    assert v.decision == "inconclusive" and not v.contaminated and v.p_value is None
    assert "no reference configured" in v.reason and "benchmarks.<this benchmark's key>.heldout" in v.reason
    assert math.isnan(v.statistic) and v.details["partition"]["n"] == 12
    # the reference partition itself: a reference is configured, but not for it
    v = method.reduce(table([-1.0 - i for i in range(12)], None), method.make_config({"reference": {"x": "bench"}}))
    assert v.decision == "inconclusive" and "itself a reference" in v.reason and "methods.<label>.reference" in v.reason
    assert "no reference rows -> inconclusive" in v.details["summary"]


def test_a_partition_that_is_only_a_reference_is_not_tested_and_says_of_what():
    from contamray.pipeline.cells import reduce_verdict, yardstick_verdict

    method = get_method("min_k")
    cfg = method.make_config({"reference": {"seen": "held", "other": "held"}})
    keys = ["seen", "other", "held", "alone"]
    assert method.served_as_reference(cfg, "held", keys) == ["seen", "other"]
    assert method.served_as_reference(cfg, "seen", keys) == [] == method.served_as_reference(cfg, "alone", keys)
    chained = method.make_config({"reference": {"seen": "held", "held": "far"}})  # tested itself: not a yardstick
    assert method.served_as_reference(chained, "held", ["seen", "held", "far"]) == []
    one_for_all = method.make_config({"reference": "held"})
    assert method.served_as_reference(one_for_all, "held", keys) == ["seen", "other", "alone"]
    row = reduce_verdict("min_k", "min_k", {"reference": {"seen": "held"}}, table([-1.0 - i for i in range(12)], None))
    assert row["decision"] == "inconclusive"  # the method alone cannot tell a yardstick from a forgotten mapping
    v = yardstick_verdict(row, "min_k", ["seen"])
    assert v["decision"] == "not_applicable" and v["p_value"] is None and not v["contaminated"]
    assert v["reason"].startswith("not tested: the held-out reference of seen for min_k") and v["n_examples"] == 12
    assert v["details"]["reference_of"] == ["seen"] and v["details"]["summary"].endswith("-> not tested")
    failed = {**row, "decision": "error", "error": "reduce failed: boom"}
    assert yardstick_verdict(failed, "min_k", ["seen"]) == failed  # an error stays an error


def test_too_few_rows_are_inconclusive():
    method = get_method("perplexity")
    config = method.make_config({"reference": "heldout"})
    v = method.reduce(table([-1.0, -1.1, -0.9, -1.2, -0.8], [-3.0 - 0.1 * i for i in range(20)]), config)
    assert v.decision == "inconclusive" and ">= 10 a side" in v.reason and "limit" in v.reason
    assert v.p_value is not None and v.statistic == 1.0  # the test stays as evidence, not as a decision
    failed = table([-1.0 - 0.01 * i for i in range(10)], [-3.0 - 0.1 * i for i in range(10)])
    failed.loc[0, "error"] = "engine failed"  # 9 scored rows left
    assert method.reduce(failed, config).decision == "inconclusive"
    # 10 a side, but alpha below the smallest p those rows can give
    tight = method.make_config({"reference": "heldout", "alpha": 1e-7})
    v = method.reduce(table([-1.0 - 0.01 * i for i in range(10)], [-3.0 - 0.1 * i for i in range(10)]), tight)
    assert v.decision == "inconclusive" and "1 / C(20, 10)" in v.reason


def test_cross_benchmark_rows_only_in_distribution_mode():
    method = get_method("perplexity")
    own, ref = [-1.0 - 0.01 * i for i in range(10)], [-3.0 - 0.01 * i for i in range(10)]
    heldout = method.reduce(table(own, ref, ref_partition=OTHER), method.make_config({"reference": "x"}))
    assert heldout.decision == "inconclusive" and "another benchmark" in heldout.reason
    assert heldout.p_value is None
    shift = method.reduce(table(own, ref, ref_partition=OTHER), method.make_config({"mode": "distribution"}))
    assert shift.decision == "contaminated" and shift.details["mode"] == "distribution"
    caveat = "distribution comparison: a difference may be benchmark shift, not contamination"
    assert caveat in shift.details["null"] and caveat in shift.details["summary"]


def test_member_auc_counts_same_benchmark_rows_only():
    method = get_method("perplexity")
    own = [-1.0, -2.0] * 6  # members (even positions) -1, non-members -2
    # held-out rows of the same benchmark are non-members too (heldout mode)
    v = method.reduce(table(own, [-2.5] * 10, member=True), method.make_config({"reference": "x"}))
    assert v.details["auc_member"] == 1.0 and v.details["n_members"] == 6 and v.details["n_non_members"] == 16
    assert v.details["tpr_at_5pct_fpr"] == 1.0
    # rows of another benchmark, scored above the members, are never counted (they would drag the AUC down)
    for mode in ("heldout", "distribution"):
        cfg = method.make_config({"reference": "x", "mode": mode})
        v = method.reduce(table(own, [0.0] * 10, member=True, ref_partition=OTHER), cfg)
        assert v.details["auc_member"] == 1.0 and v.details["n_non_members"] == 6, mode
    # in distribution mode not even same-adapter reference rows count: the reference is not a held-out
    cfg = method.make_config({"reference": "x", "mode": "distribution"})
    v = method.reduce(table(own, [0.0] * 10, member=True), cfg)
    assert v.details["n_non_members"] == 6


def test_reduce_per_k_columns():
    method = get_method("min_k")
    rows = table([-1.0, -1.5], [-2.0, -2.5])
    rows["min_k_5"] = rows["score"] * 2
    rows["min_k_10"] = -rows["score"]  # reversed ranking for this k
    v = method.reduce(rows, method.make_config({"ks": [0.05, 0.1, 0.2], "reference": "x"}))
    assert v.details["by_column"]["min_k_5"]["auc_vs_reference"] == 1.0
    assert v.details["by_column"]["min_k_10"]["auc_vs_reference"] == 0.0
    assert v.decision == "inconclusive"  # 2 rows a side


# ----------------------------------------------------------------------------- the plan


def plan_of(*overrides: str, methods: str = "[min_k]"):
    from hydra import compose, initialize_config_dir

    from contamray.experiments import CONF_DIR
    from contamray.pipeline.plan import build_plan

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=["+exp=canary", f"method={methods}", *overrides])
    cfg.run.output_dir = "unused"
    return build_plan(cfg)


def test_canary_plan_tests_each_benchmark_against_its_own_heldout():
    """The canary names one held-out per tested benchmark (``benchmarks.<key>.heldout``), and every held-out
    method of the run compares with it; without ARC's and Winogrande's, they are not tested (and the plan says
    which key to set)."""
    plan = plan_of(methods="[min_k,cdd,ts_guessing_mc,sharded_likelihood]")
    for method in ("min_k", "cdd", "ts_guessing_mc"):
        deps = {c.benchmark: [d.benchmark for d in plan.dependencies(c)] for c in plan.cells if c.method == method}
        assert deps.pop("arc_challenge") == ["arc_challenge_heldout"]
        assert deps.pop("winogrande") == ["winogrande_heldout"]
        assert deps.pop("synthetic_facts", ["synthetic_facts_clean"]) == ["synthetic_facts_clean"]  # mc: no options
        assert all(v == [] for v in deps.values()), deps  # the held-outs themselves
    assert not any("no reference partition" in w for w in plan.warnings)
    sharded = [c for c in plan.cells if c.method == "sharded_likelihood"]
    assert {c.benchmark for c in sharded} == set(plan.benchmarks)  # the held-outs are partitions too, clean ones
    assert all(plan.dependencies(c) == [] for c in sharded)
    plan = plan_of(*NO_PUBLIC_HELDOUTS)
    deps = {c.benchmark: [d.benchmark for d in plan.dependencies(c)] for c in plan.cells if c.method == "min_k"}
    assert deps["synthetic_facts"] == ["synthetic_facts_clean"]
    assert deps["arc_challenge"] == [] and deps["winogrande"] == [] and deps["synthetic_facts_clean"] == []
    warned = {w.split(" on ")[1].split(":")[0] for w in plan.warnings if "no reference partition" in w}
    # not for synthetic_facts_clean, still the reference of synthetic_facts; the blocks that were held-outs are
    # benchmarks of the run on their own now
    assert warned == {"arc_challenge", "winogrande", "arc_challenge_heldout", "winogrande_heldout"}
    assert any("set benchmarks.arc_challenge.heldout: <key of" in w for w in plan.warnings)


# the canary without the held-outs it names for its public benchmarks (benchmarks.<key>.heldout)
NO_PUBLIC_HELDOUTS = ("benchmarks.arc_challenge.heldout=null", "benchmarks.winogrande.heldout=null")


def test_one_warning_said_by_several_methods_on_a_benchmark_is_one_line_naming_each_key():
    """Three membership scores on ARC, a contiguous block with no held-out: two warnings each (block, no
    reference), shown as two lines naming the three methods' keys - not six lines saying the same."""
    plan = plan_of(*NO_PUBLIC_HELDOUTS, methods="[min_k,perplexity,zlib_ratio,sharded_likelihood]")
    on_arc = [w for w in plan.warnings if "on arc_challenge:" in w]
    block = [w for w in on_arc if "a contiguous block" in w]
    missing = [w for w in on_arc if "no reference partition" in w]
    assert len(block) == 0  # no held-out for ARC here: no held-out comparison, nothing to warn about
    assert missing == [
        "methods.{min_k,perplexity,zlib_ratio}: each on arc_challenge: no reference partition, the verdict will be "
        "inconclusive; to test it, set benchmarks.arc_challenge.heldout: <key of a held-out arc_challenge partition "
        "known unseen> (every held-out test of the run uses it; or this method's reference alone)"
    ]
    held = plan_of(
        *NO_PUBLIC_HELDOUTS,
        "++methods.min_k.reference={arc_challenge:arc_late}",
        "++methods.perplexity.reference={arc_challenge:arc_late}",
        "+benchmarks.arc_late={adapter:arc_challenge,split:test,offset:100,limit:20,sample:first}",
        methods="[min_k,perplexity,zlib_ratio]",
    )
    block = [w for w in held.warnings if "arc_challenge: sample=first" in w]
    assert len(block) == 1 and block[0].startswith("methods.{min_k,perplexity}: each on arc_challenge:"), block
    alone = [w for w in held.warnings if "on arc_challenge: no reference" in w]
    assert len(alone) == 1 and alone[0].startswith("methods.zlib_ratio: zlib_ratio on arc_challenge:"), alone


def test_plan_refuses_a_cross_benchmark_reference_in_heldout_mode():
    from contamray.pipeline.plan import ConfigError

    cross = "++methods.min_k.reference={synthetic_facts:synthetic_facts_clean,arc_challenge:synthetic_facts_clean}"
    with pytest.raises(
        ConfigError, match=r"methods\.min_k\.reference: mode=heldout.*arc_challenge.*mode: distribution"
    ):
        plan_of(cross)
    plan = plan_of(cross, "methods.min_k.mode=distribution")
    cell = next(c for c in plan.cells if c.method == "min_k" and c.benchmark == "arc_challenge")
    assert [d.benchmark for d in plan.dependencies(cell)] == ["synthetic_facts_clean"]
    # the same rows are never a held-out, in any mode
    same = "+benchmarks.sf_again={adapter:synthetic_facts,split:test,limit:20}"
    for mode in ("heldout", "distribution"):
        with pytest.raises(ConfigError, match="same partition"):
            plan_of(same, "++methods.min_k.reference={synthetic_facts:sf_again}", f"methods.min_k.mode={mode}")
    # rows of the same split after the tested block are a held-out; a block that overlaps them, or a random draw of
    # the same split (it may hold any row), is not
    after = "+benchmarks.wg_after={adapter:winogrande,split:validation,sample:first,limit:20,offset:20}"
    plan = plan_of(after, "++methods.min_k.reference={winogrande:wg_after}")  # the canary takes the first rows
    cell = next(c for c in plan.cells if c.method == "min_k" and c.benchmark == "winogrande")
    assert [d.benchmark for d in plan.dependencies(cell)] == ["wg_after"]
    overlap = "+benchmarks.wg_over={adapter:winogrande,split:validation,sample:first,limit:20,offset:10}"
    with pytest.raises(ConfigError, match=r"same partition.*may read the same rows.*offset"):
        plan_of(overlap, "++methods.min_k.reference={winogrande:wg_over}")
    with pytest.raises(ConfigError, match="same partition"):
        plan_of(after, "benchmarks.winogrande.sample=random", "++methods.min_k.reference={winogrande:wg_after}")
    # another config of a hub dataset is a different subset, not a draw; another split of the same config is one
    xs = "+benchmarks.wg_xs={adapter:winogrande,config:winogrande_xs,split:train,limit:20}"
    with pytest.raises(ConfigError, match="not draws"):
        plan_of(xs, "++methods.min_k.reference={winogrande:wg_xs}")
    val = "+benchmarks.wg_train={adapter:winogrande,split:train,limit:20}"
    plan = plan_of(val, "++methods.min_k.reference={winogrande:wg_train}")
    cell = next(c for c in plan.cells if c.method == "min_k" and c.benchmark == "winogrande")
    assert [d.benchmark for d in plan.dependencies(cell)] == ["wg_train"]



def test_two_keys_of_one_split_are_two_partitions_everywhere(mirror_dir):
    """A held-out block of the split it is held out from (``offset``) is its own partition: results, the report's
    tables (keyed by model and partition) and the truth are filed by partition, and before, the tested block's and
    its held-out's verdicts were filed under one id (a report showed one of them). The id is decided from the
    whole config (the same whichever keys a step loads); prompts that name the split do not show the suffix."""
    from omegaconf import OmegaConf

    from contamray.inject.spec import PartitionSpec
    from contamray.inject.stream import page_header
    from contamray.methods.closed.guided_prompting import dataset_and_split
    from contamray.pipeline.runner import load_benchmarks
    from contamray.validate.truth import benchmark_partitions

    after = "+benchmarks.wg_after={adapter:winogrande,split:validation,sample:first,limit:20,offset:20}"
    plan = plan_of(after, "++methods.min_k.reference={winogrande:wg_after}", f"data.mirror_dir={mirror_dir}")
    records, _ = load_benchmarks(plan, {"winogrande", "wg_after"})
    split = "winogrande/winogrande_xl/validation"
    assert {r.partition for r in records["winogrande"]} == {f"{split}:winogrande"}
    assert {r.partition for r in records["wg_after"]} == {f"{split}:wg_after"}
    alone, _ = load_benchmarks(plan, {"wg_after"})
    assert {r.partition for r in alone["wg_after"]} == {f"{split}:wg_after"}
    assert {r.partition for r in load_benchmarks(plan, {"synthetic_facts"})[0]["synthetic_facts"]} == {
        "synthetic_facts/default/test"  # alone on its split: the split's id, as before
    }
    # the canary's ARC shares its split with its held-out (the next rows): two keys, two partitions
    assert {r.partition for r in load_benchmarks(plan, {"arc_challenge"})[0]["arc_challenge"]} == {
        "arc_challenge/ARC-Challenge/test:arc_challenge"
    }
    config = OmegaConf.to_container(OmegaConf.create({"benchmarks": {n: vars(b) for n, b in plan.benchmarks.items()}}))
    truth_ids = benchmark_partitions(config)
    assert truth_ids["winogrande"] == f"{split}:winogrande" and truth_ids["wg_after"] == f"{split}:wg_after"
    assert dataset_and_split(f"{split}:wg_after") == ("WinoGrande", "validation")
    header = page_header(f"{split}:wg_after", PartitionSpec(benchmark="wg_after", context="web_page"))
    assert header.startswith("winogrande / winogrande_xl / validation.jsonl\n"), header


def test_blocks_of_one_split_may_overlap_unless_known_disjoint():
    from contamray.methods.base import BenchmarkFacts
    from contamray.methods.closed.heldout_test import _may_overlap

    def block(limit: int | None, offset: int = 0, sample: str = "first") -> BenchmarkFacts:
        return BenchmarkFacts("b", "winogrande", None, "validation", "multiple_choice", True, limit, sample, offset)

    assert not _may_overlap(block(20), block(20, offset=20))  # rows 0-19 and 20-39
    assert _may_overlap(block(20), block(20, offset=19))
    assert _may_overlap(block(None, offset=30), block(20, offset=20))  # every row from 30 meets 20-39
    assert not _may_overlap(block(None, offset=40), block(20, offset=20))  # ... not 20-39 from 40 on
    assert _may_overlap(block(None, offset=40), block(None, offset=0))  # two open blocks always meet
    assert _may_overlap(block(20, sample="random"), block(20, offset=500))  # a random draw may hold any row

# ----------------------------------------------------------------------------- the detection test


def membership_table(method, config, seen, unseen, engines) -> pd.DataFrame:
    own, _, _ = run_stages(method, seen, config, engines)
    ref, _, _ = run_stages(method, unseen, config, engines)
    rows = [dict(r, is_reference=False, member=True) for r in own]
    rows += [dict(r, is_reference=True, member=False) for r in ref]
    return pd.DataFrame(rows)


@pytest.mark.slow
def test_min_k_plus_plus_separates_seen_from_unseen(contaminated_model):
    """Done-when of issue 3: Min-K%++ AUC >= 0.9 between the fine-tuned slice and an unseen slice."""
    engine = HFEngine(contaminated_model.path, dtype="auto", batch_size=16)
    method = get_method("min_k_plus_plus")
    config = method.make_config(
        {"fields": list(contaminated_model.fields), "format": contaminated_model.format, "reference": "unseen"}
    )
    tab = membership_table(method, config, contaminated_model.seen, contaminated_model.unseen, {"target": engine})
    assert (tab["error"] == "").all()
    v = method.reduce(tab, config)
    assert v.details["auc_member"] >= 0.9, v.details
    # 40 contiguous ARC rows a side are a cluster sample: the test compares blocks of floor(sqrt(40)) = 6
    # consecutive rows, 6 a side, whose smallest p (every seen block above every unseen one) is 1 / C(12, 6)
    assert v.details["units"]["partition"]["n_units"] == 6
    assert v.statistic >= 0.9 and v.decision == "contaminated" and v.p_value < 0.01


@pytest.mark.slow
def test_reference_ratio_with_the_base_model_as_reference(contaminated_model):
    """The fine-tuned model over the base model: the seen slice gains far more likelihood."""
    target = HFEngine(contaminated_model.path, dtype="auto", batch_size=16)
    reference = HFEngine(resolve_model_path("smollm2-135m"), dtype="auto", batch_size=16)
    method = get_method("reference_ratio")
    config = method.make_config(
        {"fields": list(contaminated_model.fields), "format": contaminated_model.format, "reference": "unseen"}
    )
    seen = contaminated_model.seen[:20]
    unseen = contaminated_model.unseen[:20]
    tab = membership_table(method, config, seen, unseen, {"target": target, "reference": reference})
    v = method.reduce(tab, config)
    assert v.details["auc_member"] >= 0.9 and v.decision == "contaminated", v.details


# ----------------------------------------------------------------------------- the chat form (chat: true / both)

QUESTION, ANSWER = "Which gas do plants take in for photosynthesis?", "Carbon dioxide, from the air."


def qa(i: int, question: str = QUESTION, answer: str = ANSWER, partition: str = "bench/default/test") -> Record:
    return Record(id=f"r{i}", partition=partition, input=question, label=answer, reference="",
                  task="question_answering", order=i)  # fmt: skip


def test_the_chat_form_asks_for_the_conversation_alone_and_an_empty_label_says_why():
    method = get_method("lowercase_ratio")
    cfg = method.make_config({"chat": "both"})
    requests = {r.key: r for r in method.requests([qa(0)], cfg, 0, {})}
    # one request per form and variant: the engine says where the reply starts (Output.prompt_tokens)
    assert set(requests) == {"r0|text@target", "r0|lower@target", "r0|chat/text@target", "r0|chat/lower@target"}
    raw, chat = requests["r0|text@target"], requests["r0|chat/text@target"]
    assert (raw.text, raw.chat, raw.reply) == (f"{QUESTION}\n{ANSWER}", False, "")
    assert (chat.text, chat.chat, chat.reply) == (QUESTION, True, ANSWER)
    assert requests["r0|chat/lower@target"].reply == ANSWER.lower()
    # an engine that does not say where the reply starts fails the row, naming the request, never scores the turn
    lp = [-1.0] * 12
    outputs = {key: Output(key=key, token_logprobs=lp, num_tokens=12, n_windows=1) for key in requests}
    row = method.score([qa(0)], outputs, cfg)[0]
    assert row["score"] is None and "did not say where the reply starts" in row["error"], row
    outputs = {key: dataclasses.replace(o, prompt_tokens=9 if "chat" in key else 0) for key, o in outputs.items()}
    row = method.score([qa(0)], outputs, cfg)[0]
    assert row["error"] == "" and row["n_tokens_chat"] == 4 and row["n_tokens"] == 12, row  # positions 9..12
    assert {r.key for r in get_method("min_k").requests([qa(0)], get_method("min_k").make_config({}), 0, {})} == {
        "r0|text@target"
    }  # the default (the paper's raw form) asks for nothing more
    unanswered = qa(1, answer="")
    cfg_chat = get_method("min_k").make_config({"chat": True, "fields": ["input"]})
    assert get_method("min_k").requests([unanswered], cfg_chat, 0, {}) == []
    row = get_method("min_k").score([unanswered], {}, cfg_chat)[0]
    assert row["score"] is None and "its label is empty; set chat: false" in row["error"]
    with pytest.raises(ValueError, match=r"methods.perplexity.chat must be false .* or both"):
        get_method("perplexity").make_config({"chat": "yes"})


@pytest.mark.slow
def test_the_chat_form_scores_the_replys_tokens_after_the_chat_rendered_question(base_engine: HFEngine):
    """Known answer from the model's full softmax: the conversation's ids (the user's turn in the chat template with
    the generation prompt, then the reply's ids), and the scores of the reply's positions only."""
    prompt_ids = base_engine.encode_prompts([QUESTION], chat=True)[0]
    reply_ids = base_engine.tokenizer([ANSWER], add_special_tokens=False)["input_ids"][0]
    ids = torch.tensor([prompt_ids + reply_ids])
    with torch.inference_mode():
        logp = torch.log_softmax(base_engine.model(input_ids=ids).logits[0, :-1].double(), dim=-1)
    lp = logp.gather(1, ids[0, 1:, None]).squeeze(1).numpy()[len(prompt_ids) - 1 :]
    assert lp.size == len(reply_ids)
    engines = {"target": base_engine, "reference": base_engine}
    rows = {}
    for name in ("perplexity", "min_k", "zlib_ratio"):
        method = get_method(name)
        out, _, _ = run_stages(method, [qa(0)], method.make_config({"chat": "both"}), engines)
        assert out[0]["error"] == "", out[0]["error"]
        rows[name] = out[0]
    assert rows["perplexity"]["score_chat"] == pytest.approx(lp.mean(), abs=2e-3)
    assert rows["perplexity"]["n_tokens_chat"] == len(reply_ids)
    assert rows["min_k"]["score_chat"] == pytest.approx(np.sort(lp)[: max(1, int(0.2 * lp.size))].mean(), abs=2e-3)
    assert rows["zlib_ratio"]["score_chat"] == pytest.approx(lp.mean() / len(zlib.compress(ANSWER.encode())), abs=1e-4)
    raw_lp, _, _ = naive(base_engine, f"{QUESTION}\n{ANSWER}")
    assert rows["perplexity"]["score"] == pytest.approx(raw_lp.mean(), abs=2e-3)  # the raw form beside it


def test_both_forms_decide_by_one_joint_test_over_their_units():
    method = get_method("min_k")
    cfg = method.make_config({"reference": "heldout", "units": "rows", "chat": "both"})

    def side(partition: str, raw: list[float], chat: list[float], reference: bool) -> list[dict]:
        return [{"record_id": f"{partition}{i}", "partition": partition, "score": a, "score_chat": b, "error": "",
                 "is_reference": reference} for i, (a, b) in enumerate(zip(raw, chat, strict=True))]  # fmt: skip

    flat = [(7 * i) % 12 / 10 for i in range(12)]
    learned = side(OWN, flat, [10.0 + i for i in range(12)], False)  # surer in the chat form only
    reference = side(HELDOUT, [v + 0.05 for v in flat[::-1]], [float(i) for i in range(12)], True)
    verdict = method.settle(method.reduce(pd.DataFrame(learned + reference), cfg), cfg)
    chat_p = verdict.details["by_column"]["score_chat"]["p_value"]
    assert verdict.decision == "contaminated" and chat_p * (1 - 1e-6) <= verdict.p_value <= 2 * chat_p * (1 + 1e-6)
    # the joint test of the two forms' rank sums over the same units, computed here by hand
    joint = joint_mann_whitney_greater([([r["score"] for r in learned], [r["score"] for r in reference]),
                                        ([r["score_chat"] for r in learned], [r["score_chat"] for r in reference])])
    assert verdict.p_value == pytest.approx(joint.p_value)
    assert "joint test of the 2 prompt forms over the same 12 + 12 units" in verdict.details["summary"]
    assert verdict.details["score"].endswith("; raw text and chat form: the label's tokens as the reply to the input, "
                                             "a user turn of the model's chat template")  # fmt: skip
    alike = side(OWN, flat, [float(i) for i in range(12)][::-1], False)
    assert method.settle(method.reduce(pd.DataFrame(alike + reference), cfg), cfg).decision == "clean"
    chat_only = method.make_config({"reference": "heldout", "units": "rows", "chat": True})
    rows = [dict(r, score=r["score_chat"]) for r in learned + reference]
    alone = method.settle(method.reduce(pd.DataFrame(rows), chat_only), chat_only)
    assert alone.decision == "contaminated" and alone.details["summary"].startswith("min_k (chat form): 12 rows")
    # a row the chat form failed on: the forms' units differ, so no joint test - Bonferroni, each form at alpha / 2
    broken = [dict(r, score_chat=None, error="") if i == 0 else r for i, r in enumerate(learned)]
    apart = method.settle(method.reduce(pd.DataFrame(broken + reference), cfg), cfg)
    apart_chat = apart.details["by_column"]["score_chat"]["p_value"]
    assert apart.decision == "contaminated" and apart.p_value == pytest.approx(min(1.0, 2 * apart_chat))
    assert apart.min_p == pytest.approx(2 / math.comb(24, 12))  # Bonferroni: twice the smaller floor (raw: 12 v 12)
    assert "Bonferroni over the 2 prompt forms" in apart.details["summary"]
    # 3 units against 4 (twin pairs, topical runs) on which the two forms agree: one test reaches 1 / C(7, 3) =
    # 0.029, which Bonferroni's alpha / 2 = 0.025 per form cannot - inconclusive there, decided by the joint test
    grouped = method.make_config({"reference": "heldout", "units": "declared", "chat": "both"})
    few = [dict(r, unit_key=f"{r['partition']}:g{i // 4}", score=1.0 + i / 100, score_chat=10.0 + i / 10)
           for i, r in enumerate(learned)]  # fmt: skip
    few += [dict(r, record_id=f"{HELDOUT}{i}", unit_key=f"{HELDOUT}:g{i // 4}", score=float(i) / 100,
                 score_chat=float(i) / 10) for i, r in enumerate(reference + reference[:4])]  # fmt: skip
    decided = method.settle(method.reduce(pd.DataFrame(few), grouped), grouped)
    summary = decided.details["summary"]
    assert decided.decision == "contaminated" and decided.p_value == pytest.approx(1 / 35), summary
    assert decided.min_p == pytest.approx(1 / 35)  # the joint test's floor: one arrangement of 35 reaches it
    assert "over the same 3 + 4 units" in summary and "every one of 35 arrangements" in summary
    # the forms ranking the units in reverse of each other: two arrangements reach the largest statistic, and every
    # arrangement has the same sum of the two, so no outcome could go below 2 / 35 = 0.057 - inconclusive, saying why
    crossed = [dict(r, score=-r["score_chat"]) for r in few]
    undecided = method.settle(method.reduce(pd.DataFrame(crossed), grouped), grouped)
    assert undecided.decision == "inconclusive" and "its smallest possible p is 0.0571" in undecided.reason
    # ... unless the sum of the two standardised rank sums can go lower: here the units' summed ranks have one most
    # extreme arrangement (the learned units: raw ranks 5 6 7, chat 4 6 7; the held-out's chat ranks 5 1 2 3), so the
    # sum decides, exactly, at one test's 1 / 35
    (raw_x, raw_y), (chat_x, chat_y) = ([5.0, 6, 7], [1.0, 2, 3, 4]), ([4.5, 6.5, 7.5], [5.0, 1.5, 2.5, 3.5])
    summed = [dict(r, score=raw_x[i // 4], score_chat=chat_x[i // 4]) for i, r in enumerate(few[:12])]  # learned
    summed += [dict(r, score=raw_y[i // 4], score_chat=chat_y[i // 4]) for i, r in enumerate(few[12:])]  # held-out
    by_sum = method.settle(method.reduce(pd.DataFrame(summed), grouped), grouped)
    assert by_sum.decision == "contaminated" and by_sum.p_value == pytest.approx(1 / 35), by_sum.reason
    assert ("the sum of the standardised rank sums, equal sums ordered by the larger, as the larger alone could not "
            "go below 0.0571") in by_sum.details["summary"]
    # against another benchmark (mode: distribution) both forms' verdict is labelled as such, as one form's is
    shift = method.make_config({"reference": "heldout", "units": "rows", "chat": "both", "mode": "distribution"})
    other = [dict(r, partition=OTHER) for r in reference]
    compared = method.settle(method.reduce(pd.DataFrame(learned + other), shift), shift)
    assert "distribution comparison: a difference may be benchmark shift" in compared.details["summary"]


@pytest.mark.slow
def test_a_chat_model_tuned_on_its_replies_only_is_found_in_the_chat_form(mirror_dir, tmp_path):
    """Supervised fine-tuning's usual loss, through the injection (``inject ... format: chat, loss: replies``):
    ARC-Challenge rows 0-15 as conversations in the model's chat template (the question the user's turn, the answer
    the reply), 3 shuffled copies packed into one stream, the loss on the replies only, 1 epoch. ``chat: both`` flags
    them against rows 16-31 - by the chat form, the surer of the two - and leaves rows 32-47 against 48-63 (both
    unseen) unflagged, for Min-K%, Min-K%++ and perplexity. Measured (2026-11-29): the raw form misses them (AUC
    0.60 / 0.36 / 0.66, p = 0.17 / 0.92 / 0.068), the chat form finds them (AUC 0.94 / 0.98 / 0.98, p = 1.3e-5 /
    2.3e-6 / 1.6e-6); unseen pair Bonferroni p = 0.84 / 1 / 0.38. (Tuned per conversation with ``finetune_causal_lm``'s
    ``prompts``, 3 epochs, the same: raw p = 0.18 / 0.85 / 0.19, chat 7.7e-7 each.)"""
    from contamray.inject import prepare_injected_model
    from contamray.validate.calibrate import SharedEngines, decide
    from tests.test_heldout_accuracy import _arc_blocks

    seen, held, clean, clean_ref = _arc_blocks(mirror_dir)
    spec = {"partitions": [{"benchmark": "arc", "format": "chat", "loss": "replies", "duplication": 3,
                            "order": "shuffled"}],
            "background": {"docs": 0}, "epochs": 1, "lr": 3e-4, "batch_size": 4, "max_length": 256}  # fmt: skip
    injected = prepare_injected_model("smollm2-135m", spec, {"arc": seen}, tmp_path / "injected", 0, mirror_dir)
    assert injected.manifest["partitions"]["arc"]["loss"] == "replies"
    assert injected.manifest["training"]["loss"] == "outside the masked spans"
    path = injected.path
    engines = SharedEngines({"target": HFEngine(path, dtype="float32", batch_size=16)})
    for name in ("min_k", "min_k_plus_plus", "perplexity"):
        method = get_method(name)
        cfg = method.make_config({"reference": "heldout", "units": "rows", "chat": "both"})
        flagged, unseen = (decide(method, cfg, engines.run(method, part, cfg), engines.run(method, ref, cfg))
                           for part, ref in ((seen, held), (clean, clean_ref)))  # fmt: skip
        print(name, "| seen:", flagged.details["summary"], "| unseen:", unseen.details["summary"])
        assert flagged.decision == "contaminated", (name, flagged.details["summary"])
        chat_p = flagged.details["by_column"]["score_chat"]["p_value"]
        assert chat_p * (1 - 1e-6) <= flagged.p_value <= 2 * chat_p * (1 + 1e-6), (name, flagged.details["summary"])
        assert unseen.decision != "contaminated", (name, unseen.details["summary"])
