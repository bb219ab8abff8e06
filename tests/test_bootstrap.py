"""The one-sided bootstrap test on samples whose answer is known in closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from contamray.stats.bootstrap import bootstrap_greater


def test_clear_positive_shift_is_significant() -> None:
    rng = np.random.default_rng(1)
    general = rng.uniform(0.0, 0.3, size=10)
    guided = general + rng.uniform(0.3, 0.6, size=10)  # every pair favours guided
    result = bootstrap_greater(guided, general, seed=0)
    assert result.p_value < 0.01
    # no resample can reach <= 0: only the +1 correction is left
    assert result.p_value == pytest.approx(1 / 10_001)
    assert result.statistic == pytest.approx(float(np.mean(guided - general)))
    assert 0 < result.ci_low < result.statistic < result.ci_high


def test_plain_ratio_reproduces_zero_when_every_pair_favours_x() -> None:
    result = bootstrap_greater([0.9, 0.8, 0.7], [0.1, 0.2, 0.3], plus_one=False)
    assert result.p_value == 0.0


def test_zero_mean_symmetric_differences_give_p_near_half() -> None:
    # differences +-0.2 in equal numbers: the bootstrap distribution of the mean is symmetric about 0,
    # P(d* < 0) = P(d* > 0) = (1 - P(d* = 0)) / 2 with P(d* = 0) = C(20, 10) / 2**20 for n = 20
    d = np.array([0.2, -0.2] * 10)
    result = bootstrap_greater(d + 0.5, np.full(20, 0.5), seed=3)
    p_tie = math.comb(20, 10) / 2**20
    expected = (1 - p_tie) / 2 + p_tie  # ties count as "not greater"
    assert result.p_value == pytest.approx(expected, abs=0.015)
    assert result.p_value > 0.05


def test_identical_samples_give_p_one() -> None:
    x = [0.31, 0.52, 0.18, 0.77, 0.4]
    result = bootstrap_greater(x, list(x), seed=0)
    assert result.p_value == 1.0
    assert result.statistic == 0.0
    assert result.ci_low == result.ci_high == 0.0


def test_one_positive_pair_among_ties_matches_closed_form() -> None:
    # n = 10 pairs, one with guided > general, nine ties: the resampled mean difference is <= 0 exactly
    # when the positive pair is never drawn, probability (1 - 1/10)**10 = 0.3487
    guided = [0.6] + [0.3] * 9
    general = [0.3] * 10
    result = bootstrap_greater(guided, general, seed=11)
    assert result.p_value == pytest.approx(0.9**10, abs=0.015)


def test_deterministic_by_seed() -> None:
    rng = np.random.default_rng(5)
    x, y = rng.normal(0.1, 1, 30), rng.normal(0, 1, 30)
    a = bootstrap_greater(x, y, seed=42)
    b = bootstrap_greater(x, y, seed=42)
    c = bootstrap_greater(x, y, seed=43)
    assert a == b
    assert a.p_value != c.p_value


def test_large_sample_matches_normal_approximation() -> None:
    # n = 2000 differences ~ N(0.05, 1): the bootstrap distribution of the mean is ~ N(mean, s / sqrt n),
    # so p ~ Phi(-mean / (s / sqrt n)) with s the plug-in standard deviation
    rng = np.random.default_rng(7)
    d = rng.normal(0.05, 1.0, 2000)
    expected = float(norm.cdf(-d.mean() / (d.std() / math.sqrt(d.size))))
    result = bootstrap_greater(d, seed=1, chunk_elements=1 << 18)
    assert 0.01 < expected < 0.99  # an informative case: p neither 0 nor 1
    assert result.p_value == pytest.approx(expected, abs=0.006)


@pytest.mark.parametrize(
    ("guided", "general", "published"),
    [
        # per-example ROUGE-L (rounded to 2 decimals) and the p-value published with the paper's code
        # (time-travel-in-llms, results/<model>/rte/valid): GPT-4, then GPT-3.5, RTE validation
        (
            [0.57, 0.32, 0.47, 0.32, 0.39, 0.11, 0.10, 0.38, 0.47, 0.25],
            [0.32, 0.45, 0.47, 0.29, 0.39, 0.11, 0.11, 0.31, 0.41, 0.25],
            0.165,
        ),
        (
            [0.55, 0.19, 0.24, 0.52, 0.33, 0.21, 0.35, 0.29, 0.20, 0.23],
            [0.28, 0.30, 0.26, 0.54, 0.27, 0.00, 0.12, 0.00, 0.41, 0.08],
            0.051,
        ),
    ],
)
def test_paired_test_reproduces_published_p_values(
    guided: list[float], general: list[float], published: float
) -> None:
    result = bootstrap_greater(guided, general, plus_one=False, seed=0)
    assert result.p_value == pytest.approx(published, abs=0.012)
    # the independent resampling of the authors' released code does not give the published numbers
    unpaired = bootstrap_greater(guided, general, paired=False, plus_one=False, seed=0)
    assert unpaired.p_value > published + 0.04


def test_unpaired_accepts_different_lengths() -> None:
    high = bootstrap_greater([0.9, 0.8, 0.85], [0.1, 0.2, 0.15, 0.1, 0.3], paired=False, seed=0)
    assert high.p_value == pytest.approx(1 / 10_001)
    same = bootstrap_greater([0.2, 0.4, 0.6], [0.6, 0.4, 0.2, 0.4], paired=False, seed=0)
    assert 0.3 < same.p_value < 0.8


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="equal length"):
        bootstrap_greater([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="x is empty"):
        bootstrap_greater([], [])
    with pytest.raises(ValueError, match="non-finite values at positions \\[1\\]"):
        bootstrap_greater([0.1, float("nan")], [0.0, 0.0])
    with pytest.raises(ValueError, match="n_resamples"):
        bootstrap_greater([0.1], [0.0], n_resamples=0)


@pytest.mark.parametrize(("n", "least"), [(10, 0.065), (20, 0.057)])
def test_percentile_bootstrap_over_rejects_under_a_symmetric_null(n: int, least: float) -> None:
    """Its p is the share of resampled means <= 0 around the *observed* mean, not a p computed under the
    null: on differences symmetric about 0 it flags more than alpha (measured with 2,000 samples x 2,000
    resamples: 7.0-8.8 % at n = 10, 6.2-6.9 % at n = 20, nominal 5 %), while the sign-flip permutation
    test on the same samples flags ~5 %. Guided prompting uses the sign-flip test by default."""
    from contamray.stats.tests import sign_flip_greater

    rng = np.random.default_rng(7 + n)
    reps = 2000
    boot, flip = [], []
    for i in range(reps):
        d = rng.beta(2, 5, n) - rng.beta(2, 5, n)  # guided - general ROUGE-L of an unseen instance, say
        boot.append(bootstrap_greater(d, n_resamples=2000, seed=i).p_value)
        flip.append(sign_flip_greater(d).p_value)
    boot_rate, flip_rate = np.mean(np.array(boot) <= 0.05), np.mean(np.array(flip) <= 0.05)
    se = math.sqrt(0.05 * 0.95 / reps)
    assert boot_rate > least, boot_rate
    assert abs(flip_rate - 0.05) < 3 * se, flip_rate
    assert boot_rate - flip_rate > 2 * se
