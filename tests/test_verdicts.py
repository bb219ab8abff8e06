"""Three-valued verdicts and what the plan decides before any work (issue #13).

Known answers only: the decision a verdict carries, the cells a plan skips and why, the configs it
refuses (self-judging, a window longer than the model's context) and the power warnings it gives.
"""

from __future__ import annotations

import pytest

from contamray.methods.base import Verdict, get_method
from contamray.pipeline.plan import ConfigError
from tests.test_checkpoint_files import write_weights
from tests.test_config import plan_of


def test_a_verdict_is_contaminated_clean_or_inconclusive() -> None:
    assert Verdict("m", "p", 0.0, True).decision == "contaminated"
    assert Verdict("m", "p", 0.0, False).decision == "clean"
    undecided = Verdict("m", "p", 0.0, decision="inconclusive", reason="3 rows")
    assert not undecided.contaminated and undecided.reason == "3 rows"
    with pytest.raises(ValueError, match="needs a reason"):
        Verdict("m", "p", 0.0, decision="inconclusive")
    with pytest.raises(ValueError, match="not one of"):
        Verdict("m", "p", 0.0, decision="maybe")
    flagged = Verdict("m", "p", 0.0, True, p_value=0.01).make_inconclusive("null not credible")
    assert (flagged.decision, flagged.contaminated, flagged.p_value) == ("inconclusive", False, 0.01)


def test_failed_rows_make_a_decision_inconclusive() -> None:
    method = get_method("exact_match")
    cfg = method.make_config({})
    settle = method.settle
    assert settle(Verdict("m", "p", 0.0, True, n_examples=10, n_failed=5), cfg).decision == "contaminated"
    most = settle(Verdict("m", "p", 0.0, False, n_examples=10, n_failed=6), cfg)
    assert most.decision == "inconclusive" and "6 of 10 rows failed" in most.reason
    every = settle(Verdict("m", "p", 0.0, False, n_examples=4, n_failed=4), cfg)
    assert every.decision == "inconclusive" and "every row failed" in every.reason
    assert settle(Verdict("m", "p", 0.0, False, n_examples=0), cfg).decision == "inconclusive"


def test_the_plan_skips_pairs_a_method_does_not_apply_to_with_the_reason() -> None:
    plan = plan_of(
        "benchmark=[synthetic_facts,arc_challenge]", "method=[clean_dirty_eval,ngram13]",
        "methods.clean_dirty_eval.contamination_from=ngram13",
    )  # fmt: skip
    skipped = {(c.benchmark, c.method): why for c, why in plan.skipped}
    assert list(skipped) == [("synthetic_facts", "clean_dirty_eval")]
    assert "multiple-choice" in skipped[("synthetic_facts", "clean_dirty_eval")]
    assert {(c.benchmark, c.method) for c in plan.cells} == {
        ("synthetic_facts", "ngram13"), ("arc_challenge", "ngram13"), ("arc_challenge", "clean_dirty_eval"),
    }  # fmt: skip


def test_a_window_longer_than_the_models_context_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"methods.min_k.context_len: 4096 .* models.smollm2_135m.max_model_len"):
        plan_of("method=[min_k]", "methods.min_k.context_len=4096", "models.smollm2_135m.max_model_len=2048")
    plan_of("method=[min_k]", "methods.min_k.context_len=1024", "methods.min_k.stride=512")


def test_a_window_longer_than_the_context_a_checkpoint_declares_is_refused(tmp_path) -> None:
    """The plan reads the context from the checkpoint's config.json (GPT-2's key here) and checks against it when
    it is smaller than ``max_model_len`` (2048 in the model's config): min_k's default 2048-token windows cannot be
    scored by a 1024-token model, so the plan says so before the run instead of every row failing in it."""
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "n_positions": 1024}')
    (tmp_path / "tokenizer.json").write_text("{}")  # a checkpoint with its tokenizer (tests/test_tokenizer.py)
    write_weights(tmp_path)  # and its weights (tests/test_checkpoint_files.py)
    model = f"models.smollm2_135m.source={tmp_path}"
    with pytest.raises(ConfigError, match=r"methods.min_k.context_len: 2048 .* context of 1024 tokens .* <= 1024"):
        plan_of("method=[min_k]", model)
    plan_of("method=[min_k]", model, "methods.min_k.context_len=1024", "methods.min_k.stride=512")


def test_a_target_judging_itself_is_refused_unless_asked() -> None:
    with pytest.raises(ConfigError, match="needs a judge other than the target"):
        plan_of("method=[guided_prompting]", "methods.guided_prompting.judge=true")
    with pytest.raises(ConfigError, match="is the target model"):
        plan_of("method=[guided_prompting]", "methods.guided_prompting.judge=true", "+judge.source=smollm2-135m")
    plan_of(
        "method=[guided_prompting]", "methods.guided_prompting.judge=true", "++methods.guided_prompting.self_judge=true"
    )


def test_reduce_input_merges_the_scans_error_so_a_failed_scan_is_not_read_as_clean(tmp_path) -> None:
    """``runner.reduce_input`` hands clean-vs-dirty evaluation the open-data scan's label of each row and, as
    ``contamination_error``, the scan's error on it (the scan reports a row it failed on as not contaminated);
    the cell's own ``error`` column is its own."""
    import pandas as pd

    from contamray.pipeline.runner import reduce_input
    from contamray.pipeline.store import ResultStore

    plan = plan_of("benchmark=[arc_challenge]", "method=[clean_dirty_eval,ngram13]",
                   "methods.clean_dirty_eval.contamination_from=ngram13")  # fmt: skip
    cell = next(c for c in plan.cells if c.method == "clean_dirty_eval")
    (scan,) = plan.dependencies(cell)
    store = ResultStore(tmp_path)
    own = pd.DataFrame({"record_id": ["a", "b"], "partition": ["p", "p"], "correct": [True, False],
                        "error": ["", "no options"]})  # fmt: skip
    labels = pd.DataFrame({"record_id": ["a", "b"], "contaminated": [False, True],
                           "contamination_type": ["clean", "input_only"], "error": ["corpus shard unreadable", ""]})
    store.put_examples(cell, plan.cell_hash(cell), own)
    store.put_examples(scan, plan.cell_hash(scan), labels)
    table = reduce_input(plan, cell, store).set_index("record_id")
    assert table.loc["a", "contamination_error"] == "corpus shard unreadable"
    assert table.loc["b", "error"] == "no options"
    assert table.loc["a", "error"] == "" and table.loc["b", "contamination_type"] == "input_only"
    verdict = get_method("clean_dirty_eval").reduce(table.reset_index(), plan.methods[cell.method].config())
    assert verdict.details["n_scan_failed"] == 1 and verdict.details["n_clean"] == 0 and verdict.n_failed == 2
