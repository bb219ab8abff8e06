"""Membership scores (Min-K%, Min-K%++, perplexity, zlib, lowercase, reference-model ratio) and their test.

Known answers used here:
- hand-computed Min-K% means and Min-K%++ z-scores;
- on the real model, each score equals the formula evaluated on a naive full-softmax computation;
- on a model fine-tuned on one ARC-Challenge slice (``contaminated_model``), Min-K%++ separates that slice
  from an unseen slice with AUC >= 0.9, and the reference-model ratio against the base model does too.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pandas as pd
import pytest
import torch

from contamray.engines import resolve_model_path
from contamray.engines.hf import HFEngine
from contamray.methods.base import Output, get_method, method_names
from contamray.methods.closed.membership_scores import k_count, min_k_mean, min_k_plus_plus_tokens
from contamray.records import Record
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


def test_long_text_is_windowed_and_every_token_scored(base_engine: HFEngine):
    text = " ".join(f"item{i}" for i in range(60))
    method = get_method("perplexity")
    config = method.make_config({"fields": ["input"], "context_len": 48, "stride": 24})
    rows, outputs, stages = run_stages(method, [rec(0, text)], config, {"target": base_engine})
    assert stages == 2 and "r0|text@target|tokens" in outputs
    row = rows[0]
    assert row["error"] == "" and row["n_windows"] > 3 and "sliding windows" in row["note"]
    assert row["n_tokens"] == len(base_engine.encode([text])[0]) - 1


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


# ----------------------------------------------------------------------------- reduce


def table(own: list[float], ref: list[float] | None, member: bool = False) -> pd.DataFrame:
    rows = [
        {"record_id": f"a{i}", "partition": "p/c/test", "score": s, "error": "", "is_reference": False}
        | ({"member": i % 2 == 0} if member else {})
        for i, s in enumerate(own)
    ]
    rows += [
        {"record_id": f"b{i}", "partition": "q/c/test", "score": s, "error": "", "is_reference": True}
        for i, s in enumerate(ref or [])
    ]
    return pd.DataFrame(rows)


def test_reduce_mann_whitney_against_the_reference_partition():
    method = get_method("perplexity")
    config = method.make_config({"reference": "unseen_bench"})
    v = method.reduce(table([-1.0, -1.1, -0.9, -1.2, -0.8], [-3.0, -2.5, -2.8, -3.1, -2.9]), config)
    assert v.contaminated and v.p_value == pytest.approx(1 / 252)  # exact: the 5 highest of 10, 1 / C(10, 5)
    assert v.statistic == 1.0 and v.partition == "p/c/test" and v.n_examples == 5
    v = method.reduce(table([-3.0, -2.5, -2.8], [-1.0, -1.1, -0.9]), config)
    assert not v.contaminated and v.p_value > 0.9


def test_reduce_without_reference_reports_the_distribution_and_why():
    method = get_method("min_k")
    v = method.reduce(table([-1.0, -2.0, -3.0], None), method.make_config({}))
    assert v.p_value is None and not v.contaminated
    assert v.statistic == pytest.approx(-2.0) and v.details["partition"]["n"] == 3
    assert "methods.<label>.reference" in v.details["note"]


def test_reduce_reports_member_auc_when_labels_exist():
    method = get_method("perplexity")
    # members (even positions) score -1, non-members -2; reference rows count as non-members
    v = method.reduce(table([-1.0, -2.0, -1.0, -2.0], [-2.5, -3.0], member=True), method.make_config({}))
    assert v.details["auc_member"] == 1.0 and v.details["n_members"] == 2 and v.details["n_non_members"] == 4
    assert v.details["tpr_at_5pct_fpr"] == 1.0


def test_reduce_per_k_columns():
    method = get_method("min_k")
    rows = table([-1.0, -1.5], [-2.0, -2.5])
    rows["min_k_5"] = rows["score"] * 2
    rows["min_k_10"] = -rows["score"]  # reversed ranking for this k
    v = method.reduce(rows, method.make_config({"ks": [0.05, 0.1, 0.2]}))
    assert v.details["by_column"]["min_k_5"]["auc_vs_reference"] == 1.0
    assert v.details["by_column"]["min_k_10"]["auc_vs_reference"] == 0.0


# ----------------------------------------------------------------------------- the detection test


def membership_table(method, config, seen, unseen, engines) -> pd.DataFrame:
    own, _, _ = run_stages(method, seen, config, engines)
    ref, _, _ = run_stages(method, unseen, config, engines)
    rows = [dict(r, is_reference=False, member=True) for r in own]
    rows += [dict(r, is_reference=True, member=False) for r in ref]
    return pd.DataFrame(rows)


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
    assert v.statistic >= 0.9 and v.contaminated and v.p_value < 1e-3


def test_reference_ratio_with_the_base_model_as_reference(contaminated_model):
    """The fine-tuned model over the base model: the seen slice gains far more likelihood."""
    target = HFEngine(contaminated_model.path, dtype="auto", batch_size=16)
    reference = HFEngine(resolve_model_path("smollm2-135m"), dtype="auto", batch_size=16)
    method = get_method("reference_ratio")
    config = method.make_config({"fields": list(contaminated_model.fields), "format": contaminated_model.format})
    seen = contaminated_model.seen[:20]
    unseen = contaminated_model.unseen[:20]
    tab = membership_table(method, config, seen, unseen, {"target": target, "reference": reference})
    v = method.reduce(tab, config)
    assert v.details["auc_member"] >= 0.9 and v.contaminated, v.details
