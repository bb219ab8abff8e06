"""contamray.stats.tests against answers known independently of the code (hand counts, textbook values)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from contamray.stats.tests import (
    describe,
    mann_whitney_greater,
    permutation_p_value,
    roc_auc,
    roc_curve,
    t_test_greater,
    tpr_at_fpr,
)


def test_t_test_matches_the_textbook_formula_with_sample_sd():
    d = [1.0, 2.0, 3.0, 4.0]  # mean 2.5, sample sd sqrt(5/3)
    res = t_test_greater(d)
    t = 2.5 / (math.sqrt(5 / 3) / 2)
    assert res.statistic == pytest.approx(t)
    # one-sided p of t = 3.873 with 3 df, from the t table: 0.01522
    assert res.p_value == pytest.approx(0.015219, abs=2e-5)
    assert res.detail["df"] == 3


def test_t_test_differs_from_the_authors_ddof0_version():
    """The authors' code divides by np.std (ddof 0): t larger by sqrt(n / (n - 1))."""
    d = np.array([0.5, -0.2, 1.3, 0.8, 0.1])
    ours = t_test_greater(d).statistic
    theirs = d.mean() / d.std() * math.sqrt(d.size)
    assert theirs / ours == pytest.approx(math.sqrt(5 / 4))


def test_t_test_edge_cases():
    assert t_test_greater([2.0, 2.0, 2.0]).p_value == 0.0
    assert t_test_greater([0.0, 0.0]).p_value == 1.0
    assert t_test_greater([-1.0, -1.0]).p_value == 1.0
    with pytest.raises(ValueError, match="at least 2"):
        t_test_greater([1.0])
    with pytest.raises(ValueError, match="non-finite"):
        t_test_greater([1.0, float("nan")])


def test_symmetric_differences_give_p_one_half():
    assert t_test_greater([-1.0, 1.0, -2.0, 2.0]).p_value == pytest.approx(0.5)


def test_permutation_p_value_is_the_rank():
    assert permutation_p_value(10.0, [1, 2, 3, 4]) == pytest.approx(1 / 5)  # largest of 5
    assert permutation_p_value(0.0, [1, 2, 3, 4]) == pytest.approx(5 / 5)  # smallest
    assert permutation_p_value(2.0, [1, 2, 3, 4]) == pytest.approx(4 / 5)  # ties count against it
    with pytest.raises(ValueError, match="observed"):
        permutation_p_value(float("inf"), [1.0])


def test_mann_whitney_on_a_hand_counted_example():
    x, y = [3.0, 4.0, 5.0], [1.0, 2.0, 3.5]
    # pairs with x > y: 3>1,3>2, 4>1,4>2,4>3.5, 5>1,5>2,5>3.5 -> U = 8 of 9
    res = mann_whitney_greater(x, y)
    assert res.statistic == 8.0
    assert res.detail["auc"] == pytest.approx(8 / 9)
    # exact one-sided p: P(U >= 8) for n = m = 3 is 2 / C(6, 3) = 0.1
    assert res.p_value == pytest.approx(0.1)


def test_mann_whitney_separated_samples_are_significant_and_reversed_are_not():
    low = np.arange(20, dtype=float)
    high = low + 100
    assert mann_whitney_greater(high, low).p_value < 1e-6
    assert mann_whitney_greater(low, high).p_value > 0.99


def test_roc_auc_counts_ties_half_and_equals_u_over_n1n0():
    scores = [0.9, 0.8, 0.8, 0.3, 0.1]
    labels = [1, 1, 0, 0, 0]
    # positives 0.9, 0.8 vs negatives 0.8, 0.3, 0.1: 0.9 beats 3; 0.8 beats 2 and ties 1 -> (3 + 2.5) / 6
    assert roc_auc(scores, labels) == pytest.approx(5.5 / 6)
    assert roc_auc(scores, [True, True, False, False, False]) == pytest.approx(5.5 / 6)
    assert roc_auc([1, 2, 3, 4], [0, 0, 1, 1]) == 1.0
    assert roc_auc([1, 2, 3, 4], [1, 1, 0, 0]) == 0.0


def test_roc_auc_equals_the_trapezoid_under_roc_curve():
    rng = np.random.default_rng(0)
    scores = np.round(rng.normal(size=200), 1)  # rounded: many ties
    labels = rng.random(200) < 0.4
    fpr, tpr, thresholds = roc_curve(scores, labels)
    assert fpr[0] == tpr[0] == 0.0 and fpr[-1] == tpr[-1] == 1.0
    assert np.all(np.diff(thresholds[1:]) < 0)
    area = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))
    assert roc_auc(scores, labels) == pytest.approx(area)


def test_tpr_at_fpr():
    scores = [10, 9, 8, 7, 6, 5, 4, 3, 2, 1]
    labels = [1, 1, 0, 1, 0, 0, 0, 0, 0, 0]
    assert tpr_at_fpr(scores, labels, 0.0) == pytest.approx(2 / 3)  # above the first negative
    assert tpr_at_fpr(scores, labels, 1 / 7) == pytest.approx(1.0)


def test_bad_labels_are_named():
    with pytest.raises(ValueError, match="both classes"):
        roc_auc([1.0, 2.0], [1, 1])
    with pytest.raises(ValueError, match="booleans or 0/1"):
        roc_auc([1.0, 2.0], [0.5, 1])
    with pytest.raises(ValueError, match="one label per score"):
        roc_auc([1.0, 2.0], [1])


def test_describe():
    d = describe([1.0, 2.0, 3.0, 4.0])
    assert d["n"] == 4 and d["mean"] == 2.5 and d["median"] == 2.5 and d["min"] == 1.0 and d["max"] == 4.0
    assert describe([]) == {"n": 0}
