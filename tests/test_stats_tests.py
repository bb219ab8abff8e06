"""contamray.stats.tests against answers known independently of the code (hand counts, textbook values)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from contamray.stats.tests import (
    Stratum,
    describe,
    joint_mann_whitney_greater,
    mann_whitney_greater,
    permutation_p_value,
    roc_auc,
    roc_curve,
    shard_permutation_test,
    sign_flip_greater,
    sign_flip_min_nonzero,
    stratified_exact_greater,
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


# ----------------------------------------------------------------------------- sign-flip permutation test


def test_sign_flip_p_on_a_hand_enumerated_example():
    # d = (0.3, -0.1, 0.2), T = 0.4; the 8 sums of +-0.3 +-0.1 +-0.2 are
    # 0.4, 0.0, 0.6, 0.2, -0.2, -0.6, 0.0, -0.4: two of them (0.4, 0.6) are >= 0.4 -> p = 2/8
    res = sign_flip_greater([0.3, -0.1, 0.2])
    assert res.p_value == 0.25 and res.statistic == pytest.approx(0.4) and res.detail["exact"]
    # a zero flips to itself: same p, counted apart
    res = sign_flip_greater([0.3, -0.1, 0.2, 0.0])
    assert res.p_value == 0.25 and res.n == 4 and res.detail["n_nonzero"] == 3
    # ties with the observed sum count: d = (0.2, 0.2, -0.2), T = 0.2; sums 0.2, 0.6, -0.2, 0.2, -0.2, 0.2,
    # -0.6, -0.2 -> four >= 0.2 -> p = 1/2 (0.2 + 0.2 - 0.2 is not exactly 0.2 in floating point)
    assert sign_flip_greater([0.2, 0.2, -0.2]).p_value == 0.5
    # all positive: only the observed assignment reaches T -> 2^-m; the smallest p the data can give
    res = sign_flip_greater([0.1, 0.4, 0.2, 0.3, 0.05])
    assert res.p_value == 1 / 32 == res.detail["min_p"]
    assert sign_flip_greater([0.0, 0.0]).p_value == 1.0
    assert sign_flip_greater([-0.1, -0.2]).p_value == 1.0  # T = -0.3, the smallest of the four sums


def test_sign_flip_needs_five_nonzero_differences_at_alpha_005():
    assert sign_flip_min_nonzero(0.05) == 5 and sign_flip_min_nonzero(0.01) == 7 and sign_flip_min_nonzero(0.5) == 1
    assert sign_flip_greater([0.1, 0.2, 0.3, 0.4]).p_value == 1 / 16 > 0.05


def test_sign_flip_monte_carlo_agrees_with_the_enumeration():
    rng = np.random.default_rng(4)
    d = rng.normal(0.3, 1.0, 18)
    exact = sign_flip_greater(d)
    mc = sign_flip_greater(d, max_exact=10, n_resamples=40_000, seed=1)
    assert exact.detail["exact"] and not mc.detail["exact"] and mc.detail["n_resamples"] == 40_000
    assert 0.01 < exact.p_value < 0.5  # informative
    assert mc.p_value == pytest.approx(exact.p_value, abs=4 * math.sqrt(exact.p_value / 40_000))
    assert mc == sign_flip_greater(d, max_exact=10, n_resamples=40_000, seed=1)  # seeded
    # +1 correction: all positive, no random assignment can beat the observed one
    assert sign_flip_greater(np.full(40, 0.1), n_resamples=999).p_value == pytest.approx(1 / 1000)


def test_sign_flip_enumeration_matches_brute_force_with_large_n():
    import itertools

    rng = np.random.default_rng(9)
    for n in (7, 12):
        d = np.round(rng.normal(0.1, 1.0, n), 2)
        count = sum(np.dot(s, d) >= d.sum() - 1e-9 for s in itertools.product((-1, 1), repeat=n))
        assert sign_flip_greater(d).p_value == count / 2**n
    d = rng.normal(0.0, 1.0, 30)  # 2^30 assignments, counted by meet in the middle
    p30 = sign_flip_greater(d).p_value
    assert p30 == pytest.approx(sign_flip_greater(d, max_exact=0, n_resamples=50_000, seed=3).p_value, abs=0.01)


def test_sign_flip_p_is_exactly_uniform_over_sign_assignments():
    # Under the null the signs are fair coins given |d|: over the 1024 assignments of 10 generic |d| the
    # p-values are 1/1024, ..., 1024/1024, once each, so exactly floor(alpha * 1024) of them are <= alpha
    import itertools

    size = np.random.default_rng(2).uniform(0.01, 1.0, 10)
    ps = np.array([sign_flip_greater(np.array(s) * size).p_value for s in itertools.product((-1, 1), repeat=10)])
    assert sorted(ps * 1024) == pytest.approx(list(range(1, 1025)))
    for alpha in (0.01, 0.05, 0.1, 0.5):
        assert np.count_nonzero(ps <= alpha) == math.floor(alpha * 1024)


@pytest.mark.parametrize("n", [10, 20])
def test_sign_flip_flags_alpha_of_symmetric_null_samples(n):
    """Simulation: differences symmetric about 0 (normal, a difference of two i.i.d. ROUGE-like Beta scores,
    heavy-tailed t3); the test at 0.05 flags ~5 % (measured 4.6-5.6 % over 2,000-4,000 samples each at n = 10
    and 20), the paper's bootstrap 6.2-8.8 % (tests/test_bootstrap.py)."""
    rng = np.random.default_rng(100 + n)
    draws = {
        "normal": lambda: rng.normal(0, 1, n),
        "beta difference": lambda: rng.beta(2, 5, n) - rng.beta(2, 5, n),
        "t3": lambda: rng.standard_t(3, n),
    }
    reps = 1500
    for name, draw in draws.items():
        ps = np.array([sign_flip_greater(draw()).p_value for _ in range(reps)])
        se = math.sqrt(0.05 * 0.95 / reps)
        assert abs(np.mean(ps <= 0.05) - 0.05) < 3 * se, (name, np.mean(ps <= 0.05))
        assert abs(np.mean(ps <= 0.2) - 0.2) < 3 * math.sqrt(0.2 * 0.8 / reps), (name, np.mean(ps <= 0.2))
    # and a real shift is found: d ~ N(0.8, 1) at n = 20 (power of the t-test there ~ 0.93)
    if n == 20:
        ps = np.array([sign_flip_greater(rng.normal(0.8, 1, n)).p_value for _ in range(300)])
        assert np.mean(ps <= 0.05) > 0.8


def test_shard_permutation_p_on_a_hand_enumerated_example():
    """Two shards of two orderings: 4 choices of canonical; d = +-(difference) per shard."""
    # shard 0: canonical 1.0, shuffle 0.0 -> d = +1 (or -1); shard 1: canonical 3.0, shuffle 1.0 -> d = +2 (or -2)
    res = shard_permutation_test([[1.0, 0.0], [3.0, 1.0]])
    # t of (1, 2) = 1.5 / (0.707 / 1.414) = 3; the other choices: (-1, 2) t=1/3, (1, -2) t=-1/3, (-1, -2) t=-3
    assert res.statistic == pytest.approx(3.0) and res.p_value == pytest.approx(0.25)
    assert res.detail["null"] == "exact" and res.detail["n_null"] == 4 and res.detail["min_p"] == 0.25


def test_shard_permutation_monte_carlo_agrees_with_the_enumeration():
    rng = np.random.default_rng(3)
    orderings = [rng.normal(size=6) + (0.8 if i % 2 else 0.0) * np.eye(6)[0] for i in range(6)]
    exact = shard_permutation_test(orderings)
    drawn = shard_permutation_test(orderings, max_exact=10, draws=50_000)
    assert exact.detail["null"] == "exact" and drawn.detail["null"] == "monte carlo"
    assert abs(exact.p_value - drawn.p_value) < 0.01


def test_shard_permutation_holds_alpha_where_students_t_does_not():
    """Skewed log-likelihoods over orderings (a few orderings far worse than the rest), 5 shards of 11
    orderings, canonical exchangeable with its shuffles: the permutation p flags <= alpha, Student's t
    (the paper's) over-rejects (measured 0.035 vs 0.155 at alpha 0.05 over 400 draws)."""
    rng = np.random.default_rng(0)
    perm, student = [], []
    for _ in range(400):
        orderings = [-rng.gamma(0.5, size=11) for _ in range(5)]
        perm.append(shard_permutation_test(orderings).p_value)
        student.append(t_test_greater([o[0] - o[1:].mean() for o in orderings]).p_value)
    perm_rate, t_rate = np.mean(np.array(perm) <= 0.05), np.mean(np.array(student) <= 0.05)
    assert perm_rate <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 400), perm_rate
    assert t_rate > 0.1, t_rate


def test_shard_permutation_flags_a_preferred_canonical_order():
    rng = np.random.default_rng(1)
    orderings = [np.r_[0.0, -0.5 - rng.random(10)] for _ in range(5)]  # canonical best in every shard
    assert shard_permutation_test(orderings).p_value == pytest.approx(1 / 11**5)


def test_an_infinite_shard_t_ties_only_the_choices_that_reach_it():
    """Every shard's d equal and positive: the observed t is +inf (sd 0), reached only by the canonical choice in
    every shard - p is 1 / #choices, never 0 (an inf - inf tie margin once made every comparison false)."""
    assert shard_permutation_test([[1.0, 0.0]] * 3).p_value == pytest.approx(1 / 8)
    assert shard_permutation_test([[1.0, 0.0, 0.0]] * 2).p_value == pytest.approx(1 / 9)
    drawn = shard_permutation_test([[1.0, 0.0, 0.0]] * 2, max_exact=2, draws=999)
    assert drawn.detail["null"] == "monte carlo" and drawn.p_value >= 1 / 1000


def test_mann_whitney_with_ties_by_permutation_holds_alpha_on_coarse_scores():
    """0/1 scores, 10 against 60 rows, a 5 % hit rate, neither side seen: the permutation p (``ties:
    permutation``) flags at most alpha; scipy's normal approximation is the default and says so in ``null``; a
    distinct-valued sample is untouched by ``ties``."""
    rng = np.random.default_rng(0)
    flagged = 0
    for _ in range(150):
        x, y = (rng.random(10) < 0.05).astype(float), (rng.random(60) < 0.05).astype(float)
        if (x.sum() + y.sum()) == 0:
            continue
        flagged += mann_whitney_greater(x, y, ties="permutation").p_value <= 0.05
    assert flagged / 150 <= 0.05, flagged
    assert mann_whitney_greater([1.0, 0.0], [0.0, 0.0]).detail["null"] == "normal approximation (ties)"
    binary = mann_whitney_greater([1.0, 0.0], [0.0, 0.0], ties="permutation")
    assert binary.detail["null"] == "exact (two values: hypergeometric)" and binary.p_value == pytest.approx(0.5)
    levels = mann_whitney_greater([0.5, 1.0, 1.0, 0.5, 0.0], [0.0, 0.0, 0.5, 0.0, 0.0], ties="permutation")
    assert levels.detail["null"] == "permutation (coarse ties)" and 0 < levels.p_value < 0.2
    few_ties = mann_whitney_greater(np.linspace(0, 1, 10), [0.0, *np.linspace(1.1, 2, 9)], ties="permutation")
    assert few_ties.detail["null"] == "normal approximation (ties)"  # mostly distinct: the approximation holds
    # ... but not on sides so small that every arrangement can be counted: 4 v 4 block means of 0/1 hits with two
    # tied pairs, the partition's all above - the approximation gave 0.0137, below the 1/70 any ranking allows
    small = mann_whitney_greater([0.8, 0.6, 0.4, 0.4], [0.2, 0.0, 0.0, 0.2], ties="permutation")
    assert small.detail["null"] == "exact permutation (ties, every arrangement)"
    assert small.p_value == pytest.approx(1 / 70)
    assert mann_whitney_greater([0.8, 0.6, 0.4, 0.4], [0.2, 0.0, 0.0, 0.2]).p_value < 1 / 70  # the default's
    distinct = ([0.3, 0.9, 0.5], [0.1, 0.2, 0.4])
    assert mann_whitney_greater(*distinct, ties="permutation").p_value == mann_whitney_greater(*distinct).p_value
    with pytest.raises(ValueError, match="ties must be"):
        mann_whitney_greater([1.0], [0.0], ties="exact")


def test_the_smallest_mann_whitney_p_the_pooled_values_allow():
    """Without ties 1 / C(n_x + n_y, n_x); with ties the share of assignments reaching the largest U; 1 when every
    value is equal. Checked against enumerating every assignment of the pooled values."""
    import itertools
    import math

    from contamray.stats.tests import mann_whitney_min_p

    assert mann_whitney_min_p([3, 2, 1], [0, -1, -2]) == pytest.approx(1 / math.comb(6, 3))
    assert mann_whitney_min_p([0] * 20, [0] * 20) == 1.0
    assert mann_whitney_min_p([1] + [0] * 19, [0] * 20) == pytest.approx(math.comb(39, 19) / math.comb(40, 20))
    rng = np.random.default_rng(1)
    for _ in range(30):
        n_x, n_y = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        pooled = rng.integers(0, 3, n_x + n_y).astype(float)
        us = []
        for chosen in itertools.combinations(range(n_x + n_y), n_x):
            x = pooled[list(chosen)]
            y = np.delete(pooled, list(chosen))
            us.append(sum((a > b) + 0.5 * (a == b) for a in x for b in y))
        best = max(us)
        expected = sum(u == best for u in us) / len(us)
        assert mann_whitney_min_p(pooled[:n_x], pooled[n_x:]) == pytest.approx(expected)


def _brute_stratified_p(strata: list[tuple[int, int, int, int]]) -> float:
    """P(sum of the a sides' correct >= observed), every stratum's count hypergeometric given its margins:
    the joint distribution enumerated by hand (math.comb), no scipy."""
    dist: dict[int, float] = {}
    for ks in itertools.product(*[range(n_a + 1) for _, n_a, _, _ in strata]):
        prob = 1.0
        for k, (ca, na, cb, nb) in zip(ks, strata):
            correct, n = ca + cb, na + nb
            prob *= math.comb(correct, k) * math.comb(n - correct, na - k) / math.comb(n, na) if k <= correct else 0
        dist[sum(ks)] = dist.get(sum(ks), 0.0) + prob
    observed = sum(s[0] for s in strata)
    return sum(p for total, p in dist.items() if total >= observed)


def test_the_stratified_exact_test_is_fishers_for_one_stratum_and_the_enumerated_sum_for_several():
    from scipy.stats import fisher_exact

    rng = np.random.default_rng(7)
    for _ in range(150):
        na, nb = (int(v) for v in rng.integers(1, 12, 2))
        ca, cb = int(rng.integers(0, na + 1)), int(rng.integers(0, nb + 1))
        one = stratified_exact_greater([Stratum(ca, na, cb, nb)])
        assert one.p_value == pytest.approx(fisher_exact([[ca, na - ca], [cb, nb - cb]], alternative="greater")[1])
    for _ in range(150):
        strata = []
        for _k in range(3):  # sides may be empty: such a stratum adds a constant
            na, nb = (int(v) for v in rng.integers(0, 6, 2))
            strata.append((int(rng.integers(0, na + 1)), na, int(rng.integers(0, nb + 1)), nb))
        got = stratified_exact_greater([Stratum(*s) for s in strata])
        assert got.p_value == pytest.approx(_brute_stratified_p(strata), abs=1e-12), strata
        assert got.detail["n_informative"] == sum(na and nb and 0 < ca + cb < na + nb for ca, na, cb, nb in strata)
    # the smallest p: every stratum at its most extreme count (1/C(4,2) * 1/C(3,1))
    assert stratified_exact_greater([Stratum(0, 2, 2, 2), Stratum(0, 1, 1, 2)]).detail["min_p"] == pytest.approx(1 / 18)
    with pytest.raises(ValueError, match="correct <= n"):
        Stratum(3, 2, 0, 1)


# ---------------------------------------------------------------------------------------------------------------
# The joint Mann-Whitney of several scores of the same units (chat: both's two prompt forms)


def test_the_joint_test_of_one_form_is_the_mann_whitney_test():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=6) + 0.5, rng.normal(size=7)
    exact = stats.mannwhitneyu(x, y, alternative="greater", method="exact").pvalue
    assert joint_mann_whitney_greater([(x, y)]).p_value == pytest.approx(exact)
    assert joint_mann_whitney_greater([(x, y), (x, y)]).p_value == pytest.approx(exact)  # two equal forms: one test
    big_x, big_y = rng.normal(size=40) + 0.3, rng.normal(size=35)
    one = joint_mann_whitney_greater([(big_x, big_y)])
    assert one.detail["null"].startswith("normal") and one.p_value == pytest.approx(
        mann_whitney_greater(big_x, big_y).p_value, rel=1e-9)  # fmt: skip
    with pytest.raises(ValueError, match="same units"):
        joint_mann_whitney_greater([(x, y), (x[:5], y)])


def test_the_joint_exact_p_counts_the_arrangements_whose_larger_rank_sum_reaches_the_observed_one():
    rng = np.random.default_rng(4)
    for _ in range(20):
        a, b = rng.normal(size=9), rng.normal(size=9)
        b = 0.5 * a + b  # correlated forms
        ranks = [stats.rankdata(v) for v in (a, b)]
        sd = [np.sqrt(4 * 5 / (9 * 8) * np.sum((r - 5) ** 2)) for r in ranks]

        def t(pick: tuple[int, ...], ranks=ranks, sd=sd) -> float:
            return max((r[list(pick)].sum() - 4 * 10 / 2) / s for r, s in zip(ranks, sd, strict=True))

        observed = t((0, 1, 2, 3))
        by_hand = np.mean([t(p) >= observed - 1e-9 for p in itertools.combinations(range(9), 4)])
        assert joint_mann_whitney_greater([(a[:4], a[4:]), (b[:4], b[4:])]).p_value == pytest.approx(by_hand)


@pytest.mark.parametrize(("n_x", "n_y", "rho", "kind"), [
    (4, 4, 0.9, "exact"), (6, 6, 0.0, "exact"), (3, 4, 0.5, "exact"), (3, 4, 0.9, "exact"), (20, 20, 0.5, "normal"),
    (15, 60, 0.95, "normal"), (20, 40, 0.5, "coarse"),
])  # fmt: skip
def test_the_joint_test_holds_alpha_under_the_null_whatever_the_forms_correlation(n_x, n_y, rho, kind):
    """Both forms exchangeable between the sides (the null), correlated by ``rho``; coarse: 0/1 scores. Told alpha,
    as the held-out tests call it: on 3 units against 4 the largest z mostly cannot reach it and the sum decides."""
    rng = np.random.default_rng(5)
    reps = 300 if kind == "coarse" else 1000
    flagged, summed = 0, 0
    for _ in range(reps):
        a = rng.normal(size=n_x + n_y)
        b = rho * a + np.sqrt(1 - rho**2) * rng.normal(size=n_x + n_y)
        if kind == "coarse":
            a, b = (a > 0.8).astype(float), (b > 0.8).astype(float)
        test = joint_mann_whitney_greater([(a[:n_x], a[n_x:]), (b[:n_x], b[n_x:])], seed=int(rng.integers(1 << 30)),
                                          alpha=0.05)  # fmt: skip
        assert test.detail["null"].startswith({"exact": "exact", "normal": "normal", "coarse": "sequential"}[kind])
        flagged += test.p_value <= 0.05
        summed += test.detail["statistic"] == "sum"
    assert flagged / reps <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / reps), (kind, flagged)
    assert (summed > reps / 4) == (n_x == 3), summed  # the sum only where the largest could not reach alpha


def test_where_the_largest_z_cannot_reach_alpha_the_sum_of_the_forms_decides_exactly():
    """3 units against 4, the forms ranking different units highest: two arrangements tie at the largest z's maximum
    (p >= 2 / 35 = 0.057), while the units' summed ranks (x: 9, 12, 14; y: 6, 3, 5, 7) have one most extreme
    arrangement, the observed one: p = 1 / 35 with the sum, chosen because alpha = 0.05 was out of the largest's
    reach."""
    raw = ([5.0, 6, 7], [1.0, 2, 3, 4])  # ranks x 5 6 7, y 1 2 3 4
    chat = ([4.5, 6.5, 7.5], [5.0, 1.5, 2.5, 3.5])  # ranks x 4 6 7, y 5 1 2 3: the top three are y0, x1, x2
    largest = joint_mann_whitney_greater([raw, chat])
    assert largest.detail["statistic"] == "max" and largest.p_value == pytest.approx(2 / 35)
    assert largest.detail["min_p"] == pytest.approx(2 / 35)
    summed = joint_mann_whitney_greater([raw, chat], alpha=0.05)
    assert summed.detail["statistic"] == "sum" and summed.p_value == pytest.approx(1 / 35)
    assert (summed.detail["min_p"], summed.detail["min_p_max"]) == (pytest.approx(1 / 35), pytest.approx(2 / 35))
    assert summed.statistic == pytest.approx(sum(summed.detail["z"]))
    # by hand: the share of arrangements whose summed ranks reach the observed 35
    ranks = stats.rankdata(np.concatenate(raw)) + stats.rankdata(np.concatenate(chat))
    by_hand = np.mean([ranks[list(c)].sum() >= 35 for c in itertools.combinations(range(7), 3)])
    assert summed.p_value == pytest.approx(by_hand)
    # alpha within the largest's reach: it stays (the sum would lose power where one form alone moves)
    assert joint_mann_whitney_greater([raw, chat], alpha=0.06).detail["statistic"] == "max"
    # sums of a few integer ranks tie often: equal sums are ordered by their largest z. Summed ranks x 7, 12, 14 and
    # y 6, 5, 7, 5 put two arrangements at the top sum (x0 or y2 beside x1, x2); the observed one has the larger z
    tied = ([5.0, 6, 7], [1.0, 2, 3, 4]), ([2.0, 6, 7], [5.0, 3, 4, 1])
    assert joint_mann_whitney_greater(list(tied)).p_value == pytest.approx(2 / 35)
    broken = joint_mann_whitney_greater(list(tied), alpha=0.05)
    assert (broken.detail["statistic"], broken.p_value, broken.detail["min_p"]) == ("sum", pytest.approx(1 / 35),
                                                                                     pytest.approx(1 / 35))
    # forms in reverse order of each other: every unit's summed ranks are equal, and the two arrangements of the
    # largest z tie again - the sum cannot go lower, the largest stays
    crossed = joint_mann_whitney_greater([([5.0, 6, 7], [1.0, 2, 3, 4]), ([3.0, 2, 1], [7.0, 6, 5, 4])], alpha=0.05)
    assert crossed.detail["statistic"] == "max" and crossed.detail["min_p"] == pytest.approx(2 / 35)


def test_the_joint_test_is_as_sharp_as_one_test_when_the_forms_agree_and_bonferroni_when_they_do_not():
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=30) + 0.8, rng.normal(size=30)
    single = mann_whitney_greater(x, y).p_value
    agree = joint_mann_whitney_greater([(x, y), (x + 0.01 * rng.normal(size=30), y + 0.01 * rng.normal(size=30))])
    independent = joint_mann_whitney_greater([(x, y), (rng.normal(size=30), rng.normal(size=30))])
    assert single <= agree.p_value < 1.2 * single  # nearly the one test
    assert 1.5 * single < independent.p_value <= 2 * single  # nearly Bonferroni's factor 2
    # 3 units against 4: the smallest p any arrangement could give - one test's 1 / 35 when the forms rank the same
    # units highest, 2 / 35 when they rank different ones
    same = joint_mann_whitney_greater([([5.0, 6, 7], [1.0, 2, 3, 4]), ([5.5, 6.5, 7.5], [1.5, 2.5, 3.5, 4.5])])
    crossed = joint_mann_whitney_greater([([5.0, 6, 7], [1.0, 2, 3, 4]), ([1.0, 2, 3], [4.0, 5, 6, 7])])
    assert (same.p_value, same.detail["min_p"]) == (pytest.approx(1 / 35), pytest.approx(1 / 35))
    assert crossed.detail["min_p"] == pytest.approx(2 / 35)
    flat = joint_mann_whitney_greater([([1.0] * 3, [1.0] * 4)])
    assert flat.p_value == 1.0 and flat.detail["forms_varying"] == 0
