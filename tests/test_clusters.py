"""Sampling units for partition comparisons (``contamray.stats.clusters``), through the membership reduce.

Known answer: two clean contiguous slices of a split whose rows come in runs of correlated scores
(runs of 3-6 rows, intra-run correlation 0.3, as measured on ``synthetic_structured`` with the embedded
model) are exchangeable *as runs*, not as rows. Counting rows as independent over-rejects; blocks of
consecutive rows hold the level, and a random sample of the split needs no blocks.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from contamray.methods.base import get_method
from contamray.stats.clusters import blocks, declared_units, is_contiguous, paired_units, sampling_units

ALPHA = 0.05


def _runs(rng: np.random.Generator, n: int, rho: float, skew: bool = False) -> np.ndarray:
    """``n`` scores in runs of 3-6 rows sharing a run effect (share ``rho`` of the variance)."""
    out: list[float] = []
    while len(out) < n:
        size = int(rng.integers(3, 7))
        effect = rng.normal() * np.sqrt(rho)
        noise = rng.normal(size=size) * np.sqrt(1 - rho)
        out += list(effect + noise)
    values = np.asarray(out[:n])
    return np.exp(values) if skew else values


def _table(own: np.ndarray, ref: np.ndarray, own_orders, ref_orders) -> pd.DataFrame:
    rows = [
        {
            "record_id": f"a{i}",
            "partition": "b/c/test",
            "order": int(o),
            "unit_key": "",
            "score": float(v),
            "error": "",
            "is_reference": False,
        }
        for i, (v, o) in enumerate(zip(own, own_orders, strict=True))
    ]
    rows += [{"record_id": f"r{i}", "partition": "b/c/validation", "order": int(o), "unit_key": "",
              "score": float(v), "error": "", "is_reference": True}
             for i, (v, o) in enumerate(zip(ref, ref_orders, strict=True))]  # fmt: skip
    return pd.DataFrame(rows)


def _flag_rate(units: str, n_tests: int, seed: int, n: int = 20) -> tuple[float, float]:
    method = get_method("perplexity")
    cfg = method.make_config({"reference": {"b": "b_heldout"}, "units": units})
    rng = np.random.default_rng(seed)
    flags = decided = 0
    for _ in range(n_tests):
        own, ref = _runs(rng, n, 0.3), _runs(rng, n, 0.3)
        verdict = method.reduce(_table(own, ref, range(100, 100 + n), range(300, 300 + n)), cfg)
        decided += verdict.decision != "inconclusive"
        flags += verdict.decision == "contaminated"
    return flags / n_tests, decided / n_tests


@pytest.mark.parametrize("n", [20, 100])
def test_blocks_hold_the_level_on_clustered_contiguous_slices_where_rows_do_not(n):
    rows_rate, _ = _flag_rate("rows", 600, seed=1, n=n)
    auto_rate, decided = _flag_rate("auto", 600, seed=1, n=n)
    # rows as units: the design effect (about 1 + 3.5 * 0.3 = 2) pushes the level to about 0.12
    assert rows_rate > 0.09, rows_rate
    # blocks of 5: runs straddle at most two blocks; the level holds (binomial sd at 600 tests: 0.009)
    assert auto_rate <= ALPHA + 0.02, auto_rate
    assert decided == 1.0


def test_contaminated_blocks_are_still_flagged():
    method = get_method("perplexity")
    cfg = method.make_config({"reference": {"b": "b_heldout"}})
    rng = np.random.default_rng(3)
    flagged = 0
    for _ in range(50):
        own, ref = _runs(rng, 20, 0.3) + 2.0, _runs(rng, 20, 0.3)
        flagged += method.reduce(_table(own, ref, range(20), range(40, 60)), cfg).decision == "contaminated"
    assert flagged >= 45


def test_random_samples_are_rows_and_a_blocked_side_blocks_the_other():
    spread = [3, 17, 40, 41, 90, 120]
    assert not is_contiguous(spread)
    assert is_contiguous(list(range(10, 20)))
    units = paired_units([(spread, [""] * 6, False), (spread, [""] * 6, False)], "auto", 5)
    assert all(u.how == "rows" and len(u.units) == 6 for u in units)
    units = paired_units([(list(range(12)), [""] * 12, False), (spread, [""] * 6, False)], "auto", 5)
    assert [len(u.units) for u in units] == [2, 1]  # 12 rows -> 5 + 7; the 6-row random side -> one block
    assert units[1].how.endswith("(the other side is blocked)")


def test_declared_groups_are_never_split_and_topics_are_units():
    keys = ["group=1", "group=1", "", "subject=law", "subject=law", "subject=law", "group=7", "group=7"]
    assert declared_units(range(8), keys) == [[0, 1], [2], [3, 4, 5], [6, 7]]
    assert blocks([[0, 1], [2], [3, 4, 5], [6, 7]], 3) == [[0, 1, 2], [3, 4, 5, 6, 7]]
    one_topic = sampling_units(list(range(0, 40, 3)), ["subject=law"] * 14, "declared", 5)
    assert len(one_topic.units) == 1


def test_a_slice_of_one_declared_topic_is_inconclusive():
    """MMLU sorted by subject: 20 rows of one subject against 20 of another are 1 unit vs 1: no test."""
    method = get_method("min_k")
    cfg = method.make_config({"reference": {"b": "b_heldout"}})
    table = _table(np.zeros(20), np.ones(20), range(20), range(50, 70))
    table["unit_key"] = ["subject=law"] * 20 + ["subject=art"] * 20
    table["min_k_5"] = table["score"]
    verdict = method.reduce(table, cfg)
    assert verdict.decision == "inconclusive"
    assert "sampling units" in verdict.reason


def test_one_topic_against_a_held_out_of_the_same_topic_is_tested_in_blocks():
    """A slice of one subject against rows of the same subject (README: "test one subject against a held-out of the
    same subject"): the topic is shared by every row, so it makes no unit and the sides are blocks of consecutive
    rows - 6 against 6 at 40 rows, where the subject as one unit gave 1 against 1 and no test. Known answers: a
    shifted partition is flagged; clean pairs of clustered runs (the dependence left inside a subject) hold the
    level; a topic shared by only some rows, or under ``units: declared``, still makes units."""
    astronomy = ["subject=astronomy"] * 40
    units = paired_units([(list(range(172, 212)), astronomy, False), (list(range(212, 252)), astronomy, False)],
                         "auto", 5)  # fmt: skip
    assert [len(u.units) for u in units] == [6, 6]
    assert units[0].how.startswith("blocks of >= 6") and "subject=astronomy on every row" in units[0].how
    mixed = paired_units([(list(range(40)), ["subject=a"] * 20 + ["subject=b"] * 20, False),
                          (list(range(40, 80)), ["subject=b"] * 40, False)], "auto", 5)  # fmt: skip
    assert [len(u.units) for u in mixed] == [2, 1]  # topic runs stay units (and are merged into blocks)
    declared = paired_units([(list(range(20)), astronomy[:20], False), (list(range(20, 40)), astronomy[:20], False)],
                            "declared", 5)  # fmt: skip
    assert [len(u.units) for u in declared] == [1, 1]

    method = get_method("min_k")
    cfg = method.make_config({"reference": {"b": "b_heldout"}})
    rng = np.random.default_rng(5)

    def verdict(shift: float):
        table = _table(_runs(rng, 40, 0.3) + shift, _runs(rng, 40, 0.3), range(172, 212), range(212, 252))
        table["unit_key"] = "subject=astronomy"
        table["min_k_5"] = table["score"]
        return method.reduce(table, cfg)

    seen = verdict(2.0)
    assert seen.decision == "contaminated", seen.reason
    assert [seen.details["units"][side]["n_units"] for side in ("partition", "reference")] == [6, 6]
    assert seen.p_value == pytest.approx(1 / 924)  # 6 vs 6 units all apart: 1 / C(12, 6), the smallest there is
    clean = [verdict(0.0).decision for _ in range(400)]
    assert "inconclusive" not in clean
    assert clean.count("contaminated") / len(clean) <= ALPHA + 0.02, clean.count("contaminated")


def test_rows_a_dataset_declares_independent_are_units_even_in_a_block():
    block = list(range(100, 120))
    units = paired_units([(block, [""] * 20, True), (list(range(300, 320)), [""] * 20, True)], "auto", 5)
    assert [len(u.units) for u in units] == [20, 20]
    units = paired_units([(block, [""] * 20, False), (list(range(300, 320)), [""] * 20, True)], "auto", 5)
    assert [len(u.units) for u in units] == [4, 4]  # one side a cluster sample: both blocked
