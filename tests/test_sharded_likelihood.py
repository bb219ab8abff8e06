"""Sharded likelihood (Oren et al. 2023): layout, requests, windows, reduce, and the real detection test.

Known answers used here:
- the shard sizes of the authors' code (n // k, the first n % k shards one larger);
- a long text scored in the engine's rolling windows gives, token for token, what the model gives each
  token from the context Oren et al.'s windows give it, computed directly on the token ids one token at
  a time (an independent computation), and every token is scored exactly once;
- a model fine-tuned on an ARC-Challenge slice in canonical order (``contaminated_model`` in conftest)
  must be flagged (p < 0.01), and an unseen slice of the same benchmark must not (p > 0.05).
"""

from __future__ import annotations

import dataclasses
import json
import math

import pandas as pd
import pytest
import torch

from contamray.engines.hf import HFEngine
from contamray.methods.base import Output, get_method
from contamray.methods.closed import sharded_likelihood as sl
from contamray.methods.closed.likelihood_windows import read_scored, score_request
from contamray.pipeline.actors import answer_requests
from contamray.records import Record

METHOD = get_method("sharded_likelihood")


def rec(i: int, text: str = "", label: str = "", partition: str = "bench/default/test", order: int | None = None):
    return Record(
        id=f"r{i}",
        partition=partition,
        input=text or f"Question number {i} asks something different.",
        label=label or f"answer {i}",
        reference="",
        task="question_answering",
        order=i if order is None else order,
    )


def cfg(**kw):
    return METHOD.make_config(kw)


def run_stages(method, records, config, engines):
    """What the runner does for one cell: stages of requests through answer_requests, then score."""
    outputs: dict[str, Output] = {}
    stage = 0
    while True:
        reqs = method.requests(records, config, stage, outputs)
        if not reqs:
            break
        by_engine: dict[str, list] = {}
        for r in reqs:
            by_engine.setdefault(r.engine, []).append(r)
        for role, rs in by_engine.items():
            for out in answer_requests(engines[role], rs):
                outputs[out.key] = out
        stage += 1
    return method.score(records, outputs, config), outputs, stage


# ----------------------------------------------------------------------------- layout and requests


def test_shard_sizes_follow_the_authors_code():
    assert sl.shard_counts(100, 15) == [7] * 10 + [6] * 5  # the survey: 100 points, 15 shards
    assert sl.shard_counts(10, 3) == [4, 3, 3]
    assert sum(sl.shard_counts(5000, 50)) == 5000


def test_canonical_order_and_seeded_shuffles():
    records = [rec(i) for i in range(12)]
    shuffled_input = list(reversed(records))
    a = sl.layout(shuffled_input, cfg(num_shards=3, permutations_per_shard=5))
    b = sl.layout(records, cfg(num_shards=3, permutations_per_shard=5))
    assert [r.id for r in a.shards[0].records] == ["r0", "r1", "r2", "r3"]  # Record.order, not input order
    assert [s.orders for s in a.shards] == [s.orders for s in b.shards]  # same seed -> same shuffles
    c = sl.layout(records, cfg(num_shards=3, permutations_per_shard=5, seed=1))
    assert [s.orders for s in c.shards] != [s.orders for s in b.shards]
    for shard in b.shards:
        assert shard.orders[0] == [0, 1, 2, 3]
        assert len(shard.orders) == 6
        assert all(sorted(o) == [0, 1, 2, 3] for o in shard.orders)


def test_repeated_order_is_an_error_naming_the_records():
    with pytest.raises(ValueError, match="r0.*r1.*share order 0"):
        sl.layout([rec(0), rec(1, order=0)], cfg())


def test_requests_serialise_only_the_configured_fields_and_name_their_records():
    records = [rec(i, label=f"SECRET{i}") for i in range(6)]
    reqs = METHOD.requests(records, cfg(num_shards=2, permutations_per_shard=3, fields=["input"]), 0, {})
    assert len(reqs) == 2 * 4  # shards fit the context: canonical + 3 shuffles each, no probes
    for r in reqs:
        assert "SECRET" not in r.text and '{"input": "Question number' in r.text
        assert r.key.startswith(r.record_ids[0] + "|shard")
        assert r.kind == "score" and r.engine == "target"
    canon = next(r for r in reqs if r.key == "r0|shard0|canon")
    assert canon.record_ids == ("r0", "r1", "r2")
    line = '{{"input": "Question number {} asks something different."}}\n'
    assert canon.text == "".join(line.format(i) for i in range(3))
    assert METHOD.requests(records, cfg(num_shards=2, permutations_per_shard=3), 1, {}) == []
    both = METHOD.requests(records, cfg(num_shards=2, permutations_per_shard=3, format="text"), 0, {})
    assert both[0].text.startswith("Question number 0 asks something different.\nSECRET0\n\nQuestion number 1")


def test_long_shards_go_to_the_engine_with_their_window():
    long_text = " ".join(["word"] * 300)
    records = [rec(i, text=long_text + f" {i}") for i in range(4)]
    config = cfg(num_shards=2, permutations_per_shard=2, context_len=128, stride=64, fields=["input"])
    reqs = METHOD.requests(records, config, 0, {})
    assert sorted(r.key for r in reqs) == sorted(
        f"r{first}|shard{i}|{o}" for i, first in ((0, 0), (1, 2)) for o in ("canon", "perm1")
    )  # one request per order (2 rows: the other order once), no probes: the engine windows the text itself
    assert all((r.context_len, r.stride) == (128, 64) and len(r.text) > 2 * len(long_text) for r in reqs)
    assert METHOD.requests(records, config, 1, {}) == []


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="fields.*'question'"):
        cfg(fields=["question"])
    with pytest.raises(ValueError, match="stride"):
        cfg(context_len=512, stride=512)
    with pytest.raises(ValueError, match="num_shards"):
        cfg(num_shards=0)
    with pytest.raises(ValueError, match="unknown parameter"):
        METHOD.make_config({"shards": 3})


# ----------------------------------------------------------------------------- windows


@pytest.fixture(scope="module")
def base_engine(smollm2_path: str) -> HFEngine:
    return HFEngine(smollm2_path, dtype="float32", batch_size=8)


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from contamray.engines import resolve_model_path

    return resolve_model_path("smollm2-135m")


def test_windowed_scores_equal_token_level_windows(base_engine: HFEngine):
    """A text longer than ``context_len`` is scored in one request: every token once, each with the
    context Oren et al.'s windows give it, computed here directly on token ids (one forward pass per
    token: positions below ``context_len`` see everything before them; a later token sees the
    ``context_len`` ids ending where its stride block ends)."""
    text = (
        "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single "
        "step. To be or not to be, that is the question. All that glitters is not gold; fortune favours "
        "the bold, and the early bird catches the worm while the cat sleeps by the warm fire."
    )
    ids = base_engine.encode([text])[0]
    context, stride = 24, 12
    req = score_request("t", ("t",), text, context, stride)
    scored = read_scored({o.key: o for o in answer_requests(base_engine, [req])}, "t")
    assert len(scored.token_logprobs) == len(ids) - 1  # every token but the first, exactly once
    assert scored.n_windows == 1 + math.ceil((len(ids) - context) / stride) >= 4
    expected: list[float] = []
    with torch.inference_mode():
        for p in range(1, len(ids)):
            block_end = min(context + math.ceil((p + 1 - context) / stride) * stride, len(ids))
            start = 0 if p < context else block_end - context
            logits = base_engine.model(input_ids=torch.tensor([ids[start:p]])).logits[0, -1].float()
            expected.append(float(torch.log_softmax(logits, -1)[ids[p]]))
    assert scored.token_logprobs == pytest.approx(expected, abs=2e-3)
    # a text that fits is one window, the engine's plain score
    short = "Water boils at 100 degrees Celsius at sea level."
    out = answer_requests(base_engine, [score_request("x", ("x",), short, context, stride)])
    assert read_scored({"x": out[0]}, "x").token_logprobs == pytest.approx(base_engine.score([short])[0].token_logprobs)


def test_edge_cases_end_to_end_on_the_real_model(base_engine: HFEngine):
    """An example longer than the context is windowed, an empty one is an error row, a 1-example shard
    is skipped with its reason - and the partition still gets a verdict."""
    long_input = " ".join(f"token{i}" for i in range(200))
    records = [rec(0, text=long_input)] + [rec(i) for i in range(1, 7)]
    records.append(dataclasses.replace(rec(7), input="   ", label=""))  # empty example (fields input, label)
    config = cfg(num_shards=4, permutations_per_shard=3, context_len=96, stride=48)
    rows, outputs, stages = run_stages(METHOD, records, config, {"target": base_engine})
    assert stages == 1  # one request per order; the engine windows the long ones
    by_id = {r["record_id"]: r for r in rows}
    assert len(rows) == len(records)  # nothing silently dropped
    assert "fields ['input', 'label'] are all empty" in by_id["r7"]["error"]
    assert "longer than context_len=96" in by_id["r0"]["note"]
    assert by_id["r0"]["n_windows"] > 1 and math.isfinite(by_id["r0"]["d"])
    # 7 usable examples in 4 shards: sizes 2, 2, 2, 1 -> the last is skipped
    assert by_id["r6"]["shard_status"].startswith("skipped: shard 3") and "at least 2" in by_id["r6"]["shard_status"]
    verdict = METHOD.reduce(pd.DataFrame(rows), config)
    assert verdict.details["n_shards_tested"] == 3
    assert verdict.details["skipped_shards"][0]["shard"] == 3
    assert verdict.n_failed == 1 and verdict.p_value is not None
    assert verdict.decision == "inconclusive" and "only 3 shard(s) could be tested" in verdict.reason  # < min_shards


# ----------------------------------------------------------------------------- reduce


def shard_rows(ds: list[float], partition: str = "bench/default/test") -> list[dict]:
    rows = []
    for i, d in enumerate(ds):
        for j in range(2):
            rows.append(
                {
                    "record_id": f"r{i}_{j}", "partition": partition, "shard": i, "shard_size": 2,
                    "shard_status": "scored", "canonical_logprob": -10.0 + d, "shuffled_mean": -10.0, "d": d,
                    "permutation_p": 0.5, "n_permutations": 5, "error": "",
                    "orderings_logprob": json.dumps([-10.0 + d] + [-10.0 - 0.01 * k for k in range(5)]),
                }
            )  # fmt: skip
    return rows


def test_reduce_is_the_t_test_over_shards_not_examples():
    from contamray.stats.tests import t_test_greater

    ds = [3.0, 1.0, 2.5, 0.5, 4.0]
    verdict = METHOD.reduce(pd.DataFrame(shard_rows(ds)), cfg(num_shards=5, test="t"))
    expected = t_test_greater(ds)
    assert verdict.p_value == pytest.approx(expected.p_value)
    assert verdict.statistic == pytest.approx(expected.statistic)
    assert verdict.contaminated and verdict.details["n_shards_tested"] == 5 and verdict.n_examples == 10


def test_reduce_with_too_few_shards_is_inconclusive_and_says_why():
    verdict = METHOD.reduce(pd.DataFrame(shard_rows([2.0])), cfg(num_shards=5))
    assert verdict.p_value is None and verdict.decision == "inconclusive"
    assert "only 1 shard(s) could be tested" in verdict.reason and "min_shards=5" in verdict.reason
    # four shards, strongly positive: p < 0.01, yet below min_shards - inconclusive, not a decision
    four = METHOD.reduce(pd.DataFrame(shard_rows([3.0, 2.0, 2.5, 3.5])), cfg(num_shards=4))
    assert four.p_value < 0.01 and four.decision == "inconclusive" and not four.contaminated
    assert "num_shards=4 is below min_shards=5" in four.reason and "raise num_shards" in four.reason
    # three clean-looking shards are not "clean" either
    flat = METHOD.reduce(pd.DataFrame(shard_rows([-1.0, 0.5, -0.2])), cfg(num_shards=3, min_shards=5))
    assert flat.decision == "inconclusive" and flat.p_value > 0.05


def _fake(records: list[Record], config) -> dict[str, Output]:
    """Every shard request answered with a likelihood that prefers the canonical order a little."""
    import zlib

    outputs = {}
    for req in METHOD.requests(records, config, 0, {}):
        jitter = 0.01 * (zlib.crc32(req.key.encode()) % 7)
        logprob = (-1.0 if req.key.endswith("|canon") else -1.5) - jitter
        outputs[req.key] = Output(key=req.key, token_logprobs=[logprob] * 20, num_tokens=20)
    return outputs


def test_rows_without_every_orders_likelihood_are_refused_by_the_permutation_test():
    rows = [dict(r, orderings_logprob=None) for r in shard_rows([3.0, 1.0, 2.5, 0.5, 4.0])]
    with pytest.raises(ValueError, match="carry no orderings_logprob.*run.force=true"):
        METHOD.reduce(pd.DataFrame(rows), cfg(num_shards=5))


def test_survey_preset_on_twenty_rows_is_inconclusive_not_clean():
    """Issue #13: the survey preset (15 shards) on the default 20 rows tests 5 two-row shards and skips 10;
    that is not the configured test, so the verdict is inconclusive whatever the shards say, and the
    reason names the fix (30 contiguous rows, or fewer shards)."""
    records = [rec(i) for i in range(20)]
    config = cfg(permutations_per_shard=5)
    verdict = METHOD.reduce(pd.DataFrame(METHOD.score(records, _fake(records, config), config)), config)
    assert verdict.details["n_shards_tested"] == 5 and len(verdict.details["skipped_shards"]) == 10
    assert verdict.decision == "inconclusive" and not verdict.contaminated
    assert "10 of the 15 configured shards were not tested" in verdict.reason
    assert "run.limit >= 30" in verdict.reason and "run.sample=first" in verdict.reason
    assert "lower num_shards" in verdict.reason
    fitted = cfg(permutations_per_shard=5, num_shards=5)  # the same rows in 5 shards of 4: a decision
    decided = METHOD.reduce(pd.DataFrame(METHOD.score(records, _fake(records, fitted), fitted)), fitted)
    assert decided.decision == "contaminated" and decided.details["n_shards_tested"] == 5


def test_the_power_fix_counts_the_rows_a_declared_group_takes():
    """20 rows in runs of 4 (a declared group each, as HellaSwag's activity runs) are 5 units: 5 shards of one unit
    cannot be tested, and the fix asks for 2 units a shard at 4 rows a unit (40 rows), not 2 rows a shard."""
    records = [dataclasses.replace(rec(i), meta={"group": f"g{i // 4}"}) for i in range(20)]
    config = cfg(permutations_per_shard=5, num_shards=5)
    verdict = METHOD.reduce(pd.DataFrame(METHOD.score(records, _fake(records, config), config)), config)
    assert verdict.decision == "inconclusive" and verdict.details["order_structure"]["n_permuted_units"] == 5
    assert "run.limit >= 40 with run.sample=first; its units hold 4 rows on average" in verdict.reason


def _prefers_canonical_text(records: list[Record], config) -> dict[str, Output]:
    """Every shard request scored by its text: a shard's canonical text 1 nat likelier than any other order's."""
    requests = METHOD.requests(records, config, 0, {})
    canonical = {r.text for r in requests if r.key.endswith("|canon")}
    return {r.key: Output(key=r.key, token_logprobs=[-10.0 if r.text in canonical else -11.0], num_tokens=1)
            for r in requests}  # fmt: skip


def test_small_shards_score_each_other_order_once_and_large_ones_distinct_draws():
    """A shard's scored orders are the canonical one plus distinct others, never the canonical again: every other
    order once when there are at most ``permutations_per_shard`` (2 units: 1, 3 units: 5, 4 units: 23), else
    seeded draws without replacement - so a large shard's first draws are what the seeded generator gives."""
    import itertools

    import numpy as np

    for n_units, m in [(2, 5), (3, 5), (4, 23), (4, 25), (4, 5), (6, 50)]:
        orders = sl.unit_orders(n_units, m, np.random.default_rng(0))
        identity = tuple(range(n_units))
        assert identity not in orders and len(set(orders)) == len(orders), (n_units, m)
        assert len(orders) == min(m, math.factorial(n_units) - 1), (n_units, m)
        if math.factorial(n_units) - 1 <= m:  # the whole group
            assert set(orders) == set(itertools.permutations(identity)) - {identity}
    rng = np.random.default_rng(7)
    draws = [tuple(int(k) for k in rng.permutation(8)) for _ in range(5)]  # 8! orders: no repeat among 5 draws
    assert sl.unit_orders(8, 5, np.random.default_rng(7)) == draws


def test_unit_orders_keep_the_shard_permutation_p_exact_under_the_null():
    """Under the null the data's arrangement of a shard's units is a uniform draw, and the model's likelihood of an
    order depends on the order alone (here: a random affinity of each adjacent pair). The canonical order plus
    ``unit_orders``' others must then make the exact permutation p uniform: flagged at about alpha and no more.
    Drawing the others with replacement while never drawing the canonical - the obvious way to avoid repeating
    it - is not exchangeable with it, and this check catches it (on these draws of 3-unit shards 1.7 % at 0.01, above
    the bound 1.47 %; ``unit_orders`` 0.85 %)."""
    import numpy as np

    from contamray.stats.tests import shard_permutation_test

    def null_p_values(k: int, m: int, trials: int) -> np.ndarray:
        rng = np.random.default_rng(k * 100 + m)
        out = []
        for trial in range(trials):
            orderings = []
            for _ in range(5):
                affinity, canonical = rng.normal(size=(k, k)), rng.permutation(k)
                orders = [tuple(range(k)), *sl.unit_orders(k, m, rng)]
                arranged = [canonical[list(o)] for o in orders]
                orderings.append([float(sum(affinity[a[i], a[i + 1]] for i in range(k - 1))) for a in arranged])
            out.append(shard_permutation_test(orderings, seed=trial).p_value)
        return np.array(out)

    for k, m, trials in [(3, 4, 4000), (3, 5, 1000), (2, 5, 1000)]:  # distinct draws; the whole group (twice)
        ps = null_p_values(k, m, trials)
        for alpha in (0.01, 0.05, 0.2):
            sd = math.sqrt(alpha * (1 - alpha) / trials)
            assert (ps <= alpha).mean() <= alpha + 3 * sd, (k, m, alpha, (ps <= alpha).mean())
        assert (ps <= 0.2).mean() >= (0.2 - 3 * math.sqrt(0.16 / trials) if k > 2 else 0.125), (k, m)  # not empty


def test_two_unit_shards_reach_alpha_in_every_layout_and_an_unreachable_one_is_inconclusive():
    """Shards of 2 units have 2 orders. Drawn with replacement, about half of a shard's shuffles repeat the canonical
    order - the same text, the same score, tied with it in every choice of the null - and about half of the layouts
    of 10 such rows in 5 shards x 5 shuffles could not reach 0.05 for a model preferring every canonical order (they
    were inconclusive, and before that clean). Scoring the one other order once, every layout reaches 1/32 and the
    preference is found whatever the seed. Four such shards cannot go below 1/16: inconclusive, naming why and the
    fix. Rows of the older version (repeats recorded in ``canonical_repeats``) keep the tie bound."""
    records = [rec(i) for i in range(10)]
    for seed in range(8):
        config = cfg(num_shards=5, permutations_per_shard=5, seed=seed)
        verdict = METHOD.reduce(pd.DataFrame(METHOD.score(records, _prefers_canonical_text(records, config), config)),
                                config)  # fmt: skip
        assert [s["n_permutations"] for s in verdict.details["shards"]] == [1] * 5
        assert verdict.details["permutation_null"]["canonical_repeats"] == 0
        assert verdict.details["permutation_null"]["min_p"] == pytest.approx(1 / 32) == verdict.min_p
        assert verdict.p_value == pytest.approx(1 / 32) and verdict.decision == "contaminated", (seed, verdict.reason)
    four = cfg(num_shards=4, permutations_per_shard=5, min_shards=4)
    rows8 = [rec(i) for i in range(8)]
    short = METHOD.reduce(pd.DataFrame(METHOD.score(rows8, _prefers_canonical_text(rows8, four), four)), four)
    assert short.decision == "inconclusive" and not short.contaminated and short.p_value == pytest.approx(1 / 16)
    assert "0.0625 > alpha=0.05" in short.reason and "only 1 other order(s)" in short.reason
    assert "more units" in short.reason
    # an older version's rows: three of each shard's five shuffles repeated the canonical order (tied with it)
    config = cfg(num_shards=5, permutations_per_shard=5)
    old = []
    for row in METHOD.score(records, _prefers_canonical_text(records, config), config):
        canonical, other = -10.0, -11.0
        old.append(dict(row, orderings_logprob=json.dumps([canonical] * 4 + [other] * 2), n_permutations=5,
                        canonical_repeats=3, shuffled_mean=(3 * canonical + 2 * other) / 5,
                        d=canonical - (3 * canonical + 2 * other) / 5))  # fmt: skip
    tied = METHOD.reduce(pd.DataFrame(old), config)
    assert tied.details["permutation_null"]["min_p"] == pytest.approx((4 / 6) ** 5)
    assert tied.decision == "inconclusive" and "drew the canonical order again" in tied.reason
    assert tied.p_value == pytest.approx((4 / 6) ** 5)  # the best those orders can do: every tie counted
    # shards of 4 units (24 orders, 5 distinct draws): the same preference is found
    rows20 = [rec(i) for i in range(20)]
    found = METHOD.reduce(pd.DataFrame(METHOD.score(rows20, _prefers_canonical_text(rows20, config), config)), config)
    assert found.decision == "contaminated" and found.p_value == pytest.approx(6**-5), found.reason


def _facts(limit: int | None, sample: str = "first", adapter: str = "arc_challenge"):
    from contamray.methods.base import BenchmarkFacts

    return BenchmarkFacts(name="arc", adapter=adapter, config=None, split="test", task="multiple_choice",
                          has_choices=True, limit=limit, sample=sample)  # fmt: skip


def test_plan_warns_when_rows_cannot_fill_the_shards_and_names_the_fix():
    survey = cfg()
    (few,) = METHOD.plan_warnings(survey, _facts(20))
    assert "limit=20" in few and "num_shards=15" in few and "run.limit" in few and ">= 30" in few
    assert "lower num_shards to 10" in few
    (sampled,) = METHOD.plan_warnings(survey, _facts(100, "random"))
    assert "run.sample=first" in sampled and "sample='random'" in sampled
    assert len(METHOD.plan_warnings(survey, _facts(8, "random"))) == 2
    (tiny,) = METHOD.plan_warnings(survey, _facts(8))
    assert "min_shards=5 needs >= 10 rows" in tiny
    (below,) = METHOD.plan_warnings(cfg(num_shards=4), _facts(100))
    assert "num_shards=4 is below min_shards=5" in below
    assert METHOD.plan_warnings(survey, _facts(30)) == [] and METHOD.plan_warnings(survey, _facts(None)) == []
    assert METHOD.plan_warnings(survey, _facts(30, adapter="unknown")) == []  # no adapter: no groups known
    # Winogrande's twin pairs are one unit each under permute: groups: 30 rows are 15 units, one per shard
    (pairs,) = METHOD.plan_warnings(survey, _facts(30, adapter="winogrande"))
    assert "declares groups of up to 2 rows" in pairs and "needs >= 60" in pairs and "lower num_shards to 7" in pairs
    assert METHOD.plan_warnings(cfg(num_shards=5), _facts(20, adapter="winogrande")) == []  # 5 shards of 2 pairs
    assert METHOD.plan_warnings(cfg(permute="rows"), _facts(30, adapter="winogrande")) == []  # rows as units
    assert METHOD.applies.min_rows == 10


def test_declared_outputs_name_the_columns_score_writes():
    records = [rec(i) for i in range(10)]
    config = cfg(num_shards=5, permutations_per_shard=3)
    rows = METHOD.score(records, _fake(records, config), config)
    assert METHOD.outputs.score == "d" and METHOD.outputs.membership is None
    by_shard = {}
    for row in rows:
        by_shard.setdefault(row["shard"], set()).add(row["d"])
    assert all(len(ds) == 1 and None not in ds for ds in by_shard.values())  # every row carries its shard's d
    with pytest.raises(ValueError, match="min_shards must be >= 2"):
        cfg(min_shards=1)


def test_reduce_refuses_mixed_partitions():
    rows = shard_rows([1.0, 2.0]) + shard_rows([1.0, 2.0], partition="other/default/test")
    with pytest.raises(ValueError, match="mixes partitions"):
        METHOD.reduce(pd.DataFrame(rows), cfg())


# ----------------------------------------------------------------------------- several serialisations


def _answers(records: list[Record], config, prefers: str | None, seed: int = 0) -> dict[str, Output]:
    """Every shard request answered with seeded noise; the canonical orders of serialisation ``prefers`` (a
    request key prefix, "" for the first serialisation) are also 2 nats likelier."""
    import random

    rng = random.Random(seed)
    outputs = {}
    for req in METHOD.requests(records, config, 0, {}):
        prefix = req.key.split("|")[0] + "|" if ":" in req.key.split("|")[0] else ""
        lift = 2.0 if prefers is not None and prefix == prefers and req.key.endswith("|canon") else 0.0
        outputs[req.key] = Output(key=req.key, token_logprobs=[rng.gauss(-30.0, 0.3) + lift], num_tokens=1)
    return outputs


def test_other_serialisations_are_requested_under_their_label_and_bad_ones_name_the_key():
    records = [rec(i) for i in range(10)]
    config = cfg(num_shards=5, permutations_per_shard=3, other_serialisations=["text", "json:input"])
    assert config.other_serialisations == ("text:input+label", "json:input")
    reqs = METHOD.requests(records, config, 0, {})
    by_prefix: dict[str, list] = {}
    for r in reqs:
        head = r.key.split("|")[0]
        by_prefix.setdefault(head if ":" in head else "", []).append(r)
    # 5 shards of 2 rows: the canonical order and the one other order each, per serialisation
    assert {k: len(v) for k, v in by_prefix.items()} == {"": 10, "text:input+label": 10, "json:input": 10}
    canon = {k: next(r.text for r in v if r.key.endswith("r0|shard0|canon")) for k, v in by_prefix.items()}
    assert canon[""].startswith('{"input": "Question number 0 asks something different.", "label": "answer 0"}\n')
    assert canon["text:input+label"].startswith("Question number 0 asks something different.\nanswer 0\n\n")
    assert canon["json:input"] == "".join(
        f'{{"input": "Question number {i} asks something different."}}\n' for i in range(2))
    for bad, match in ((["json"], r"other_serialisations\[0\]: json:input\+label is already tested"),
                       (["text", "xml"], r"other_serialisations\[1\].format: 'xml'"),
                       (["text:nope"], r"other_serialisations\[0\].fields: unknown field"), ([""], "FORMAT:FIELD")):
        with pytest.raises(ValueError, match=match):
            cfg(other_serialisations=bad)


def test_the_raw_format_scores_the_dataset_file_as_it_leaks(mirror_dir):
    """``format: raw``: a shard's canonical text is the benchmark's JSON-lines file, line for line (its own keys,
    not our fields); a record built by hand has no source row and is left out, saying why."""
    from contamray.benchmarks import load_records

    arc = load_records("arc_challenge", n=10, sample="first", mirror_dir=mirror_dir).records
    lines = (mirror_dir / "allenai/ai2_arc/ARC-Challenge/test.jsonl").read_text(encoding="utf-8").splitlines()
    config = cfg(num_shards=5, permutations_per_shard=2, format="raw")
    canon = {r.key: r.text for r in METHOD.requests(arc, config, 0, {}) if r.key.endswith("|canon")}
    assert canon[f"{arc[0].id}|shard0|canon"] == lines[0] + "\n" + lines[1] + "\n"
    assert '"answerKey": ' in canon[f"{arc[0].id}|shard0|canon"]
    both = cfg(num_shards=5, permutations_per_shard=2, other_serialisations=["raw"])
    assert sl.serialisations(both)[1].label == "raw" and sl.serialisations(both)[1].column == "d_raw"
    assert any(r.key.startswith("raw|") for r in METHOD.requests(arc, both, 0, {}))
    rows = METHOD.score([rec(i) for i in range(4)], {}, cfg(num_shards=2, format="raw"))
    assert all(r["shard_status"] == "excluded: empty example" and "has no source row" in r["error"] for r in rows)


def test_the_decision_is_the_bonferroni_combination_of_the_serialisations():
    """Rows the model saw as plain text: the default JSON serialisation finds nothing, the text one does, and the
    combined test decides with p = 3 x the text test's own p; each serialisation's d is a column of the rows."""
    records = [rec(i) for i in range(20)]
    combined = cfg(num_shards=5, permutations_per_shard=5, other_serialisations=["text", "json:input"])
    answers = _answers(records, combined, prefers="text:input+label|")
    rows = METHOD.score(records, answers, combined)
    assert all(r["d_text_input_label"] > 1.0 for r in rows) and {"d", "d_json_input"} <= set(rows[0])
    verdict = METHOD.reduce(pd.DataFrame(rows), combined)
    by = verdict.details["by_serialisation"]
    assert list(by) == ["json:input+label", "text:input+label", "json:input"]
    assert by["json:input+label"]["decision"] == "clean" and by["json:input"]["decision"] == "clean"
    assert by["text:input+label"]["p_value"] < 0.01
    assert verdict.decision == "contaminated" and verdict.details["decided_by"] == "text:input+label"
    assert verdict.p_value == pytest.approx(3 * by["text:input+label"]["p_value"])
    assert "Bonferroni over 3 serialisation(s)" in verdict.details["summary"]
    # the first serialisation alone is the test without the others, row for row
    alone = cfg(num_shards=5, permutations_per_shard=5)
    single = METHOD.reduce(pd.DataFrame(METHOD.score(records, answers, alone)), alone)
    assert single.decision == "clean" and single.p_value == by["json:input+label"]["p_value"]
    # one that cannot decide (hand-built records have no raw row) is left out of the factor, its reason kept
    partial = cfg(num_shards=5, permutations_per_shard=5, format="raw", other_serialisations=["json:input+label"])
    answers = _answers(records, partial, prefers="json:input+label|")
    mixed = METHOD.reduce(pd.DataFrame(METHOD.score(records, answers, partial)), partial)
    assert mixed.details["by_serialisation"]["raw"]["decision"] == "inconclusive"
    assert mixed.details["by_serialisation"]["raw"]["reason"].startswith("every row failed (20 of 20; e.g. record 'r0'")
    assert "has no source row" in mixed.details["by_serialisation"]["raw"]["reason"]
    assert mixed.decision == "contaminated" and "inconclusive_reasons" not in mixed.details
    assert mixed.p_value == mixed.details["by_serialisation"]["json:input+label"]["p_value"]  # k = 1
    assert METHOD.settle(mixed, partial).decision == "contaminated"  # the raw side's failed rows are not its rows
    # no serialisation can decide: inconclusive, the shared reason said once
    few = cfg(num_shards=3, permutations_per_shard=5, other_serialisations=["text"])
    undecided = METHOD.reduce(pd.DataFrame(METHOD.score(records, _answers(records, few, None), few)), few)
    assert undecided.decision == "inconclusive" and undecided.p_value is None
    assert undecided.reason.startswith("only 3 shard(s) could be tested")
    assert "text:input+label:" not in undecided.reason


def test_several_serialisations_hold_the_null():
    """Clean by construction: every order's likelihood is exchangeable noise, in every serialisation. The
    Bonferroni decision over 3 serialisations flags at most alpha (+ 3 standard errors) of 300 partitions."""
    records = [rec(i) for i in range(20)]
    config = cfg(num_shards=5, permutations_per_shard=4, other_serialisations=["text", "json:input"])
    flagged = 0
    n = 300
    for seed in range(n):
        rows = METHOD.score(records, _answers(records, config, None, seed=seed), config)
        verdict = METHOD.reduce(pd.DataFrame(rows), config)
        assert verdict.decision in ("clean", "contaminated")
        flagged += verdict.decision == "contaminated"
    assert flagged / n <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / n), flagged


# ----------------------------------------------------------------------------- the detection test


def test_detects_a_partition_fine_tuned_in_order_and_not_an_unseen_one(contaminated_model):
    """Done-when of issue 3: p < 0.01 on the partition the model was fine-tuned on, p > 0.05 on an unseen
    partition of the same benchmark (ARC-Challenge questions; the canonical order of an unseen slice has no
    structure for the model). 10 permutations per shard (the survey's preset has 25): measured 2026-11-26 with
    fixed seeds, p = 2e-5 seen / 0.86 unseen at 10 and 3e-4 / 0.84 at 25 - the same decisions at 40 % of the
    scoring."""
    engine = HFEngine(contaminated_model.path, dtype="auto", batch_size=16)
    config = cfg(
        num_shards=contaminated_model.num_shards, permutations_per_shard=10, fields=list(contaminated_model.fields),
        format=contaminated_model.format,
    )  # fmt: skip
    verdicts = {}
    for name, records in (("seen", contaminated_model.seen), ("unseen", contaminated_model.unseen)):
        rows, _, _ = run_stages(METHOD, records, config, {"target": engine})
        verdicts[name] = METHOD.reduce(pd.DataFrame(rows), config)
        assert verdicts[name].n_failed == 0
    seen, unseen = verdicts["seen"], verdicts["unseen"]
    assert seen.p_value < 0.01 and seen.contaminated, seen.details
    assert unseen.p_value > 0.05 and not unseen.contaminated, unseen.details
    assert seen.details["mean_d"] > unseen.details["mean_d"]


# ----------------------------------------------------------------------------- backends agree


@pytest.mark.slow
def test_vllm_and_transformers_agree_on_shard_likelihoods(smollm2_path: str, base_engine: HFEngine, mirror_dir):
    """The same requests (windowed: context 64, stride 32) answered by vLLM and by transformers, both
    float32, give the same shard log-likelihoods within 1e-3 nats per scored token (the per-token
    tolerance of tests/test_engines.py, summed). ~1 min: vLLM start-up."""
    pytest.importorskip("vllm")
    from contamray.benchmarks import load_records
    from contamray.engines import EngineSpec, build_engine

    records = load_records("truthfulqa_gen", n=12, mirror_dir=mirror_dir).records
    config = cfg(num_shards=3, permutations_per_shard=3, context_len=64, stride=32)
    vllm = build_engine(EngineSpec(source="smollm2-135m", backend="vllm", dtype="float32", max_model_len=1024))
    try:
        theirs, _, stages = run_stages(METHOD, records, config, {"target": vllm})
    finally:
        vllm.close()
    ours, _, _ = run_stages(METHOD, records, config, {"target": base_engine})
    assert stages == 1
    shards = sl.layout(records, config).shards
    tokens = {s.index: base_engine.count_tokens(["".join(s.texts)])[0] for s in shards}
    for a, b in zip(ours, theirs):
        assert a["record_id"] == b["record_id"] and a["error"] == b["error"] == ""
        assert a["n_windows"] == b["n_windows"] > 1
        tol = 1e-3 * tokens[a["shard"]]
        assert abs(a["canonical_logprob"] - b["canonical_logprob"]) <= tol
        assert abs(a["shuffled_mean"] - b["shuffled_mean"]) <= tol


# ----------------------------------------------------------------------------- presets


@pytest.mark.parametrize(
    "preset, expected",
    [
        (
            "sharded_likelihood",
            {"num_shards": 15, "permutations_per_shard": 25, "context_len": 1024, "stride": 512, "permute": "groups"},
        ),
        (
            "sharded_likelihood_oren",
            {"num_shards": 15, "permutations_per_shard": 25, "context_len": 1024, "stride": 512, "permute": "rows"},
        ),
        (
            "sharded_likelihood_paper",
            {"num_shards": 50, "permutations_per_shard": 250, "context_len": 2048, "stride": 1024, "permute": "rows"},
        ),
        ("min_k", {"k": 0.2}),
        ("min_k_plus_plus", {"k": 0.2}),
        ("perplexity", {}),
        ("zlib_ratio", {}),
        ("lowercase_ratio", {}),
        ("reference_ratio", {}),
    ],
)
def test_method_presets_compose_into_a_plan(preset: str, expected: dict):
    from hydra import compose, initialize_config_dir

    from contamray.experiments import CONF_DIR
    from contamray.pipeline.plan import build_plan

    overrides = [f"method=[{preset}]", "benchmark=[arc_challenge]", "corpus=none"]
    if preset == "reference_ratio":  # its second model (engine role "reference")
        overrides.append("reference_model={source: smollm2-135m}")
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        composed = compose(config_name="config", overrides=overrides)
    composed.run.output_dir = "unused"
    plan = build_plan(composed)
    config = plan.methods[preset].config()
    for key, value in expected.items():
        assert getattr(config, key) == value
