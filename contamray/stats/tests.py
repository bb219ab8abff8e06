"""Significance tests and ranking metrics of the likelihood-based detectors (pure numpy / scipy).

- ``t_test_greater``: one-sided one-sample t-test of H1 mean > 0. Oren et al. (2023) test the
  per-shard differences d_i = canonical_i - mean(shuffled_i) with it. Their released code
  (tatsu-lab/test_set_contamination, copied by LLMSanitize) divides by ``np.std`` (ddof=0), which
  inflates t by sqrt(n / (n - 1)) and makes the p-value anti-conservative (15 shards: t x 1.035); the
  t-test the paper states uses the sample standard deviation (ddof=1), and so does this function.
- ``permutation_p_value``: the exact Monte Carlo permutation p-value of one observed statistic among
  its permuted values: ``(1 + #{permuted >= observed}) / (1 + n_permuted)`` - the rank of the
  canonical order among its shuffles (Oren et al., Section 3; Phipson & Smyth 2010 for the +1).
- ``shard_permutation_test``: the same t statistic over shards with its exact permutation p-value (each
  shard's canonical order exchangeable with its shuffles under the null), valid at any shard count.
- ``sign_flip_greater``: one-sided paired sign-flip permutation test of H1 "the differences d_i are
  shifted above 0", under the null that each d_i is symmetric about 0 (the two members of a pair are
  exchangeable). Exact over all 2^m sign assignments of the m non-zero differences when m <= ``max_exact``
  (counted by meet in the middle: two halves of 2^(m/2) sums, sorted), else seeded Monte Carlo with the
  +1 correction. Valid at any n (Fisher 1935; Good 2005, "Permutation, Parametric and Bootstrap Tests
  of Hypotheses", sec. 3.1): the percentile bootstrap's p of ``stats.bootstrap`` is not computed under
  the null and over-rejects at small n (see ``tests/test_stats_tests.py``).
- ``mann_whitney_greater``: one-sided Mann-Whitney U test of H1 "x tends to be larger than y"
  (scipy's exact distribution for small samples without ties, its normal approximation for larger ones;
  with ties the permutation distribution given the pooled values when asked - the held-out tests do -
  else the tie-corrected normal approximation). A partition's membership scores are compared with those of a reference
  partition known to be unseen.
- ``joint_mann_whitney_greater``: several scores of the same units tested at once (the largest standardised rank sum,
  its permutation null - exact, Monte Carlo or the rank sums' multivariate normal): a held-out test asked in two
  prompt forms (``methods/closed/prompt_forms``), valid whatever their dependence, as sharp as one test when they
  agree (Westfall & Young 1993); on so few units that the largest could not reach alpha, the sum of the standardised
  rank sums instead (O'Brien 1984), chosen from the pooled units so the exact null still holds.
- ``stratified_exact_greater``: one-sided exact conditional test of "correct is independent of the group (a
  or b) within every stratum" in 2 x 2 x K tables, H1: group a does better (a common odds ratio above 1) - the
  exact version of the Cochran-Mantel-Haenszel test (Birch 1964; Gart 1970; Agresti 2013, "Categorical Data
  Analysis", sec. 6.7.5): given every stratum's margins the a side's correct count of each stratum is
  hypergeometric, and the p is the upper tail of their sum (the pmfs convolved, exact). One stratum: Fisher's
  one-sided exact test.
- ``roc_auc``, ``roc_curve``, ``tpr_at_fpr``: instance-level detection quality when membership labels
  exist (Shi et al. 2024, Zhang et al. 2024 report AUROC and TPR at 5 % FPR). ``roc_auc`` is the
  Mann-Whitney statistic U / (n_pos * n_neg) with ties counted one half, which equals the area under
  the trapezoidal ROC curve.

Every function takes sequences of finite numbers; non-finite values are an error naming the
argument and the positions, because a NaN silently dropped would change the answer.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


def _scipy_stats() -> Any:
    """``scipy.stats``, imported on first use: half a second that processes which only register the
    methods (corpus match workers) need not pay."""
    from scipy import stats

    return stats


def _finite(values: Sequence[float] | np.ndarray, name: str, min_size: int = 1) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of numbers, got shape {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ValueError(f"{name} has non-finite values at positions {bad[:5].tolist()}; drop failed rows first")
    if arr.size < min_size:
        raise ValueError(f"{name} has {arr.size} value(s); this test needs at least {min_size}")
    return arr


@dataclass(frozen=True)
class TestResult:
    """A test's statistic and one-sided p-value, plus what it was computed from."""

    __test__ = False  # not a pytest test class, despite the name

    statistic: float
    p_value: float
    n: int
    detail: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def t_test_greater(diffs: Sequence[float] | np.ndarray) -> TestResult:
    """One-sided one-sample t-test, H1: E[diffs] > 0 (sample standard deviation, n - 1 df).

    Needs at least 2 values. When every value is identical the t statistic is undefined: a constant
    positive sample gives p = 0, a constant sample <= 0 gives p = 1 (the limits of the test).
    """
    d = _finite(diffs, "t_test_greater: diffs", min_size=2)
    n = d.size
    mean = float(d.mean())
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        t, p = (math.inf, 0.0) if mean > 0 else (-math.inf if mean < 0 else 0.0, 1.0)
    else:
        t = mean / (sd / math.sqrt(n))
        p = float(_scipy_stats().t.sf(t, df=n - 1))
    return TestResult(statistic=float(t), p_value=p, n=n, detail={"mean": mean, "sd": sd, "df": n - 1})


SHARD_PERMUTATION_MAX_EXACT = 250_000  # enumerate every choice of canonical orders up to this many
SHARD_PERMUTATION_DRAWS = 100_000  # else seeded Monte Carlo draws (with the +1 correction)


def _t_rows(d: np.ndarray) -> np.ndarray:
    """The one-sample t statistic of each row of ``d`` (ddof 1); +inf / -inf / 0 where a row is constant."""
    mean = d.mean(axis=1)
    sd = d.std(axis=1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = mean / (sd / math.sqrt(d.shape[1]))
    constant = sd == 0
    t[constant] = np.sign(mean[constant]) * np.inf
    t[constant & (mean == 0)] = 0.0
    return t


def shard_permutation_test(
    orderings: Sequence[Sequence[float]],
    seed: int = 0,
    max_exact: int = SHARD_PERMUTATION_MAX_EXACT,
    draws: int = SHARD_PERMUTATION_DRAWS,
) -> TestResult:
    """Oren et al.'s sharded statistic with its exact permutation p-value.

    ``orderings[i]``: shard i's log-likelihoods, the canonical order's first and its shuffles after. The
    statistic is the paper's: the one-sample t of d_i = canonical_i - mean(shuffled_i) over shards. Its
    null distribution is not taken from Student's t (which needs the d_i normal, and with a handful of
    shards their skew shows) but from the null itself: when the model does not prefer the canonical
    order, the canonical order is exchangeable with its shard's shuffles (all are orderings of the same
    units), so every choice - one ordering per shard playing the canonical, the rest the shuffles - is
    equally likely. p = share of those choices whose t is >= the observed t, enumerated exactly when there are
    at most ``max_exact`` of them, else from ``draws`` seeded draws as (1 + #{>=}) / (1 + draws). Valid at
    any number of shards, whatever the d_i's distribution (Oren et al.'s own permutation argument,
    Section 3, applied to the whole statistic; Phipson & Smyth 2010 for the +1).
    """
    shards = [_finite(v, f"shard_permutation_test: orderings[{i}]", min_size=2) for i, v in enumerate(orderings)]
    if len(shards) < 2:
        raise ValueError(f"shard_permutation_test needs at least 2 shards, got {len(shards)}")
    # d of every ordering as the canonical: v_k - mean(v without k)
    dvals = [(v - (v.sum() - v) / (v.size - 1)) for v in shards]
    observed = float(_t_rows(np.array([[d[0] for d in dvals]]))[0])
    # ties count as >= (float round-off of equal sums allowed); an infinite t (every d_i equal) ties only itself
    threshold = observed - 1e-12 * max(1.0, abs(observed)) if math.isfinite(observed) else observed
    sizes = [d.size for d in dvals]
    total = math.prod(sizes)
    if total <= max_exact:
        grid = np.stack([d.ravel() for d in np.meshgrid(*dvals, indexing="ij")], axis=1)
        stats = _t_rows(grid)
        p = float(np.count_nonzero(stats >= threshold) / total)
        how, n_null = "exact", total
    else:
        rng = np.random.default_rng(seed)
        sample = np.stack([d[rng.integers(0, d.size, size=draws)] for d in dvals], axis=1)
        stats = _t_rows(sample)
        hits = np.count_nonzero(stats >= threshold)
        p = float((1 + hits) / (1 + draws))
        how, n_null = "monte carlo", draws
    d_obs = np.array([d[0] for d in dvals])
    detail = {"mean": float(d_obs.mean()), "sd": float(d_obs.std(ddof=1)), "null": how, "n_null": n_null,
              "min_p": 1.0 / total if how == "exact" else 1.0 / (1 + draws)}  # fmt: skip
    return TestResult(statistic=observed, p_value=p, n=len(shards), detail=detail)


def permutation_p_value(observed: float, permuted: Sequence[float] | np.ndarray) -> float:
    """``(1 + #{permuted >= observed}) / (1 + len(permuted))``: small when ``observed`` is the largest."""
    if not math.isfinite(float(observed)):
        raise ValueError(f"permutation_p_value: observed is {observed}; it must be a finite number")
    perm = _finite(permuted, "permutation_p_value: permuted", min_size=1)
    return float((1 + np.count_nonzero(perm >= observed)) / (1 + perm.size))


SIGN_FLIP_MAX_EXACT = 30  # exact enumeration up to 2^30 sign assignments (two sorted halves of 2^15 sums)


def sign_flip_min_p(n_nonzero: int) -> float:
    """The smallest p-value the exact sign-flip test can give with ``n_nonzero`` non-zero differences:
    2^-m (every difference positive; no other assignment reaches the observed sum)."""
    return 2.0 ** -max(0, int(n_nonzero))


def sign_flip_min_nonzero(alpha: float) -> int:
    """Non-zero differences the sign-flip test needs before any outcome can reach ``alpha``:
    the smallest m with 2^-m <= alpha (5 at alpha = 0.05, 7 at 0.01)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"sign_flip_min_nonzero: alpha must be in (0, 1), got {alpha}")
    return max(1, math.ceil(math.log2(1.0 / alpha) - 1e-12))


def sign_flip_nonzero(diffs: np.ndarray) -> np.ndarray:
    """The differences the sign-flip test can flip: |d| above 1e-12 of the sample's scale (zeros, and
    rounding residues of equal scores, flip to themselves and carry no information)."""
    scale = float(np.abs(diffs).sum())
    return diffs[np.abs(diffs) > 1e-12 * max(1.0, scale)]


def _half_sums(values: np.ndarray) -> np.ndarray:
    """All 2^k sums of +-values[i] (k = len(values))."""
    sums = np.zeros(1)
    for v in values:
        sums = np.concatenate([sums + v, sums - v])
    return sums


def _sign_flip_exact_count(d: np.ndarray, threshold: float) -> int:
    """#{s in {-1, +1}^m : sum(s * d) >= threshold}, by meet in the middle."""
    half = d.size // 2
    left, right = _half_sums(d[:half]), np.sort(_half_sums(d[half:]))
    below = np.searchsorted(right, threshold - left, side="left")  # right-sums too small for each left-sum
    return int(right.size * left.size - below.sum())


def _sign_flip_mc_count(d: np.ndarray, threshold: float, n_resamples: int, seed: int) -> int:
    rng = np.random.default_rng(seed)
    rows = max(1, (1 << 20) // d.size)
    count = 0
    for start in range(0, n_resamples, rows):
        k = min(rows, n_resamples - start)
        signs = rng.integers(0, 2, size=(k, d.size), dtype=np.int8) * 2 - 1
        count += int(np.count_nonzero(signs @ d >= threshold))
    return count


def sign_flip_greater(
    diffs: Sequence[float] | np.ndarray,
    *,
    n_resamples: int = 10_000,
    seed: int = 0,
    max_exact: int = SIGN_FLIP_MAX_EXACT,
) -> TestResult:
    """One-sided paired sign-flip permutation test, H1: the differences are shifted above 0.

    Null: every difference d_i is symmetric about 0 (for a paired design: the two scores of a pair are
    exchangeable), so each of the 2^n sign assignments is equally likely. Statistic: T = sum(d) (the
    mean, times n). p = #{s : sum(s * d) >= T} / 2^m over the m non-zero differences when
    m <= ``max_exact`` (zeros flip to themselves), else ``(1 + #{T* >= T}) / (1 + n_resamples)`` over
    ``n_resamples`` seeded random sign vectors. Both are valid: P(p <= alpha) <= alpha under the null.
    Sums within a relative 1e-9 of T count as ties (>= T). No non-zero difference gives p = 1.
    ``detail``: mean, n_nonzero, exact, n_resamples (0 when exact), min_p (the smallest p the data can give).
    """
    d = _finite(diffs, "sign_flip_greater: diffs", min_size=1)
    if n_resamples < 1 or max_exact < 0:
        raise ValueError(f"sign_flip_greater: need n_resamples >= 1 and max_exact >= 0, got {n_resamples}, {max_exact}")
    scale = float(np.abs(d).sum())
    nonzero = sign_flip_nonzero(d)
    m = int(nonzero.size)
    observed = float(nonzero.sum())
    threshold = observed - 1e-9 * max(1.0, scale)
    exact = m <= max_exact
    if m == 0:
        p = 1.0
    elif exact:
        p = _sign_flip_exact_count(nonzero, threshold) / 2.0**m
    else:
        p = (1 + _sign_flip_mc_count(nonzero, threshold, n_resamples, seed)) / (n_resamples + 1)
    min_p = sign_flip_min_p(m) if exact else 1.0 / (n_resamples + 1)
    detail = {
        "mean": float(d.mean()),
        "n_nonzero": m,
        "exact": exact,
        "n_resamples": 0 if exact else n_resamples,
        "seed": seed,
        "min_p": max(min_p, sign_flip_min_p(m)),
    }
    return TestResult(statistic=float(d.sum()), p_value=float(p), n=int(d.size), detail=detail)


MW_TIE_RESAMPLES = 9_999  # permutations for a coarse tied Mann-Whitney p (all arrangements when there are fewer)


def mann_whitney_greater(
    x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, ties: str = "normal", seed: int = 0
) -> TestResult:
    """One-sided Mann-Whitney U test, H1: values of ``x`` tend to be larger than values of ``y``.

    ``statistic`` is U of ``x`` (the number of pairs with x > y, ties one half); ``detail["auc"]`` is
    U / (n_x * n_y), the probability that a random x beats a random y. Without ties: scipy's exact distribution
    up to 8 values a side, its normal approximation beyond. With ties, ``ties`` chooses: ``normal`` (scipy's
    tie-corrected normal approximation) or ``permutation``: when the pooled values are coarse (at most half of
    them distinct: 0/1 hits, a quiz's few levels) the permutation distribution of U given the pooled values -
    exact for two values (hypergeometric: Fisher's exact test), else scipy's ``PermutationMethod`` (every
    arrangement when there are at most ``MW_TIE_RESAMPLES``, else that many seeded ones with the +1 correction);
    values mostly distinct keep the normal approximation, which is accurate there - unless the sides are so small
    that every arrangement can be enumerated (C(n_x + n_y, n_x) <= ``MW_TIE_RESAMPLES``), where the permutation
    distribution is taken exactly (the approximation there can fall below the smallest p the ranks allow: 4 v 4
    block means with two tied pairs gave 0.0137 < 1/70). The approximation is not
    for coarse scores: on 0/1 scores with unequal sides it flags 6-7 % of clean partitions at 0.05 (10 or 20 rows
    against 60-200, hit rates 2-10 %; measured 2026-11-29), where the permutation p stays below alpha.
    ``detail["null"]`` says which distribution gave p.
    """
    if ties not in ("normal", "permutation"):
        raise ValueError(f"mann_whitney_greater: ties must be 'normal' or 'permutation', got {ties!r}")
    xs = _finite(x, "mann_whitney_greater: x")
    ys = _finite(y, "mann_whitney_greater: y")
    stats = _scipy_stats()
    pooled = np.concatenate([xs, ys])
    distinct = np.unique(pooled)
    tied = ties == "permutation" and distinct.size < pooled.size
    coarse = tied and 2 * distinct.size <= pooled.size
    few = tied and math.comb(pooled.size, xs.size) <= MW_TIE_RESAMPLES  # every arrangement can be enumerated
    binary = coarse and distinct.size == 2  # the exact p is hypergeometric (below)
    method: Any = "auto"
    null = "scipy auto" if distinct.size == pooled.size else "normal approximation (ties)"
    if (coarse or few) and not binary:
        method = stats.PermutationMethod(n_resamples=MW_TIE_RESAMPLES, random_state=seed)
        null = "permutation (coarse ties)" if coarse else "exact permutation (ties, every arrangement)"
    res = stats.mannwhitneyu(xs, ys, alternative="greater", method=method)
    u, p = float(res.statistic), float(res.pvalue)
    if binary:  # U is the x side's count of the higher value: hypergeometric given the margins
        high = distinct[1]
        p = float(stats.hypergeom.sf(int(np.sum(xs == high)) - 1, pooled.size, int(np.sum(pooled == high)), xs.size))
        null = "exact (two values: hypergeometric)"
    return TestResult(
        statistic=u,
        p_value=min(1.0, p),
        n=int(xs.size + ys.size),
        detail={"n_x": int(xs.size), "n_y": int(ys.size), "auc": u / (xs.size * ys.size), "null": null},
    )


JOINT_EXACT_LIMIT = 100_000  # arrangements the joint Mann-Whitney enumerates; beyond, a normal or Monte Carlo null
JOINT_MC_HITS = 10  # its Monte Carlo null stops at this many arrangements reaching the observed statistic ...
JOINT_MC_MAX = 199_999  # ... or after this many (p >= 1 / (JOINT_MC_MAX + 1))


def joint_mann_whitney_greater(
    forms: Sequence[tuple[Sequence[float], Sequence[float]]], seed: int = 0, alpha: float | None = None
) -> TestResult:
    """One-sided Mann-Whitney tests of several scores of the *same* units at once, by the largest of their
    standardised rank sums (the max-T permutation test: Westfall & Young 1993, "Resampling-Based Multiple Testing",
    sec. 2.6). ``forms``: per score, its ``x`` and ``y`` values, unit ``i`` of every form the same unit; H1: ``x``
    tends to be larger in at least one score. Under the null the units' vectors of scores are exchangeable between
    the sides, so every arrangement of the units is equally likely and each form's rank sum moves with the others:
    the p is the share of arrangements whose largest standardised rank sum reaches the observed one. Valid whatever
    the dependence between the forms (like Bonferroni), and as sharp as one test when they agree (Bonferroni's
    factor k is paid when they are independent only): two forms of one text scored by one model are highly
    correlated, and the smallest p stays the single test's 1 / C(n, n_x) where Bonferroni needs k times that.

    The null distribution: every arrangement when there are at most ``JOINT_EXACT_LIMIT``; else, when a form's
    values are coarse (at most half distinct, as ``mann_whitney_greater``'s ``permutation`` ties), seeded
    arrangements until ``JOINT_MC_HITS`` reach the observed statistic (p = hits / draws) or ``JOINT_MC_MAX`` are
    drawn (p = (hits + 1) / (draws + 1)): Besag & Clifford's sequential Monte Carlo p (Biometrika 1991), exact at
    any stop; else the multivariate normal of the standardised rank sums with their permutation covariance (the rank
    sums' exact first two moments; the normal limit Mann-Whitney's own approximation uses). A form whose values all
    tie cannot move and is left out; none left: p = 1.
    ``alpha`` (exact null only): when no arrangement could take the largest standardised rank sum to ``alpha`` - on few
    units, forms that rank different units highest make several arrangements tie at its maximum (3 units against 4:
    2 / 35 = 0.057) - the statistic is the *sum* of the standardised rank sums instead when it can go lower (O'Brien
    1984, "Procedures for comparing samples with multiple endpoints", Biometrics 40: the sum of the endpoints'
    ranks, here with its exact permutation null), arrangements of equal sums ordered by their largest z (sums of a
    few integer ranks tie often; the order is still a statistic of the arrangement); its most extreme arrangement is
    then mostly unique, one test's 1 / C(n, n_x). The choice depends on the pooled units alone, which every
    arrangement shares, so given them the chosen statistic's permutation p is exact and the level stays alpha (a
    randomization test is exact with any statistic, here one picked by a function the arrangements leave unchanged:
    Lehmann & Romano 2005, "Testing Statistical Hypotheses", 3rd ed., sec. 15.2). The sum loses power where one form
    alone moves, but it is taken only where the largest could decide nothing.
    ``statistic``: the statistic used (``detail["statistic"]``: ``max`` or ``sum``); ``detail["z"]``: each form's
    standardised rank sum; ``detail["min_p"]`` (exact null only): the smallest p any arrangement could give with the
    statistic used - above alpha, no outcome could be significant (``detail["min_p_max"]``: the largest's, when the
    sum replaced it).
    """
    if not forms:
        raise ValueError("joint_mann_whitney_greater: no form given")
    xs = [_finite(x, f"joint_mann_whitney_greater: form {i} x") for i, (x, _) in enumerate(forms)]
    ys = [_finite(y, f"joint_mann_whitney_greater: form {i} y") for i, (_, y) in enumerate(forms)]
    n_x, n_y = xs[0].size, ys[0].size
    if any(x.size != n_x for x in xs) or any(y.size != n_y for y in ys):
        raise ValueError("joint_mann_whitney_greater: every form needs the same units (equal side sizes)")
    stats = _scipy_stats()
    n = n_x + n_y
    ranks = np.array([stats.rankdata(np.concatenate([x, y])) for x, y in zip(xs, ys, strict=True)])
    centred = ranks - (n + 1) / 2.0
    scale = n_x * n_y / (n * (n - 1)) if n > 1 else 0.0
    cov = scale * centred @ centred.T  # permutation covariance of the forms' rank sums
    sd = np.sqrt(np.diag(cov))
    live = sd > 1e-12
    detail: dict[str, Any] = {"n_x": int(n_x), "n_y": int(n_y), "forms": len(forms), "forms_varying": int(live.sum()),
                              "statistic": "max"}  # fmt: skip
    if n_x == 0 or n_y == 0 or not live.any():
        return TestResult(statistic=0.0, p_value=1.0, n=int(n), detail={**detail, "null": "nothing can vary"})
    centred, sd = centred[live], sd[live]
    z_obs = centred[:, :n_x].sum(axis=1) / sd
    t_obs = float(z_obs.max())
    detail["z"] = [float(z) for z in z_obs]
    arrangements = math.comb(n, n_x)
    coarse = any(2 * np.unique(np.concatenate([x, y])).size <= n
                 for (x, y), varies in zip(zip(xs, ys, strict=True), live, strict=True) if varies)  # fmt: skip
    def zs(picks: np.ndarray) -> np.ndarray:  # each form's z (rows) of each arrangement (a row of x-side units)
        return centred[:, picks].sum(axis=2) / sd[:, None]

    if arrangements <= JOINT_EXACT_LIMIT:
        picks = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(n), n_x)), dtype=np.int64,
                            count=arrangements * n_x).reshape(arrangements, n_x)  # fmt: skip
        z = zs(picks)
        t = z.max(axis=0)
        floor = float(np.mean(_reaches(t, float(t.max()))))  # the smallest p any arrangement could give
        p = float(np.mean(_reaches(t, t_obs)))
        detail["null"] = f"exact (every one of {arrangements} arrangements)"
        if alpha is not None and floor > alpha and live.sum() > 1:
            total, s_obs = z.sum(axis=0), float(z_obs.sum())
            top = _ties(total, float(total.max()))
            floor_sum = float(np.mean(top & _reaches(t, float(t[top].max()))))  # the larger breaking the sum's ties
            if floor_sum < floor:  # the sum can go lower: it decides (chosen from the pooled units alone)
                level = _ties(total, s_obs)
                p = float(np.mean(((total > s_obs) & ~level) | (level & _reaches(t, t_obs))))
                detail.update(statistic="sum", min_p_max=floor)
                t_obs, floor = s_obs, floor_sum
        detail["min_p"] = floor
    elif coarse:  # Besag & Clifford (1991) sequential Monte Carlo: stop at JOINT_MC_HITS arrangements reaching t_obs
        rng = np.random.default_rng(seed)
        hits = draws = 0
        while draws < JOINT_MC_MAX:
            size = min(1000, JOINT_MC_MAX - draws)
            picks = rng.permuted(np.tile(np.arange(n), (size, 1)), axis=1)[:, :n_x]
            reached = np.flatnonzero(_reaches(zs(picks).max(axis=0), t_obs))
            if hits + reached.size >= JOINT_MC_HITS:
                draws += int(reached[JOINT_MC_HITS - hits - 1]) + 1
                hits = JOINT_MC_HITS
                p = hits / draws
                break
            hits, draws = hits + int(reached.size), draws + size
        else:
            p = (hits + 1) / (draws + 1)
        detail["null"] = f"sequential permutation ({draws} seeded arrangements, coarse ties)"
    else:
        corr = cov[np.ix_(live, live)] / np.outer(sd, sd)
        corrected = float(((centred[:, :n_x].sum(axis=1) - 0.5) / sd).max())  # continuity, as Mann-Whitney's own
        p = _max_normal_sf(corrected, corr)
        detail["null"] = "normal (the rank sums' permutation covariance, continuity-corrected)"
    return TestResult(statistic=t_obs, p_value=min(1.0, max(p, 0.0)), n=int(n), detail=detail)


def _reaches(t: np.ndarray, bound: float) -> np.ndarray:
    """Which statistics reach ``bound``, allowing for rounding in sums of ranks (a relative 1e-9)."""
    return t >= bound - 1e-9 * max(1.0, abs(bound))


def _ties(t: np.ndarray, bound: float) -> np.ndarray:
    """Which statistics equal ``bound`` but for rounding (``_reaches``' allowance)."""
    return np.abs(t - bound) <= 1e-9 * max(1.0, abs(bound))


def _max_normal_sf(t: float, corr: np.ndarray) -> float:
    """P(max Z_i >= t) for standard normal Z with correlation ``corr``: one or two forms by their tails (exact to
    the bivariate normal's precision, small p kept), more by the complement of the joint cdf."""
    stats = _scipy_stats()
    k = corr.shape[0]
    single = float(stats.norm.sf(t))
    if k == 1:
        return single
    if k == 2:
        rho = float(np.clip(corr[0, 1], -1.0, 1.0))
        if rho > 1 - 1e-9:
            return single
        both = float(stats.multivariate_normal.cdf([-t, -t], mean=[0.0, 0.0], cov=[[1.0, rho], [rho, 1.0]],
                                                   allow_singular=True, abseps=1e-12, releps=1e-8, rng=0))
        return 2 * single - max(0.0, min(both, single))
    joint = stats.multivariate_normal.cdf(np.full(k, t), mean=np.zeros(k), cov=corr, allow_singular=True, rng=0)
    return float(1.0 - joint)


def mann_whitney_min_p(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """The smallest one-sided p (``x`` larger) any assignment of the pooled values to the two sides could give,
    under the permutation distribution that conditions on those values: the ``n_x`` largest on the ``x`` side,
    C(b, n_x - a) of the C(n_x + n_y, n_x) equally likely assignments reaching that U (``a`` values above the
    ``n_x``-th largest, ``b`` equal to it). 1 / C(n_x + n_y, n_x) without ties; 1 when every value is equal
    (e.g. nothing guessed on either side): then no outcome of the test could be significant."""
    xs = _finite(x, "mann_whitney_min_p: x")
    ys = _finite(y, "mann_whitney_min_p: y")
    n_x = xs.size
    if n_x == 0 or ys.size == 0:
        return 1.0
    pooled = np.sort(np.concatenate([xs, ys]))[::-1]
    boundary = pooled[n_x - 1]
    above = int(np.sum(pooled > boundary))
    equal = int(np.sum(pooled == boundary))
    return math.comb(equal, n_x - above) / math.comb(pooled.size, n_x)


@dataclass(frozen=True)
class Stratum:
    """One 2 x 2 table: correct of ``n_a`` in group a, correct of ``n_b`` in group b."""

    correct_a: int
    n_a: int
    correct_b: int
    n_b: int

    def __post_init__(self) -> None:
        if not (0 <= self.correct_a <= self.n_a and 0 <= self.correct_b <= self.n_b):
            raise ValueError(f"stratum {self}: counts must satisfy 0 <= correct <= n on each side")

    @property
    def compared(self) -> bool:
        """Whether both groups have rows here (else the stratum says nothing about a difference between them)."""
        return self.n_a > 0 and self.n_b > 0

    @property
    def informative(self) -> bool:
        """Whether the stratum's count can vary given its margins (both sides present, not all of one outcome)."""
        correct = self.correct_a + self.correct_b
        return self.compared and 0 < correct < self.n_a + self.n_b


def _hypergeom_pmfs(strata: Sequence[Stratum]) -> tuple[np.ndarray, int]:
    """The null distribution of the a sides' total correct given every stratum's margins: pmf over
    ``offset + 0 .. offset + len - 1`` (the informative strata convolved; the others add a constant)."""
    stats = _scipy_stats()
    total, offset = np.ones(1), 0
    for s in strata:
        correct, n = s.correct_a + s.correct_b, s.n_a + s.n_b
        low, high = max(0, s.n_a - (n - correct)), min(s.n_a, correct)
        offset += low
        if high > low:
            pmf = stats.hypergeom.pmf(np.arange(low, high + 1), n, correct, s.n_a)
            total = np.convolve(total, pmf / pmf.sum())
    return total, offset


def stratified_exact_greater(strata: Sequence[Stratum]) -> TestResult:
    """One-sided exact conditional test over strata, H1: group a is more often correct than group b within strata.

    The null: within every stratum, correct or not is independent of the group (the rows of a stratum exchangeable
    between the groups, given its margins). Its statistic is the a sides' total correct count; its p is the upper
    tail of that count's exact null distribution (each stratum's count hypergeometric given its margins, the strata
    independent: the convolution). A stratum with only one group, or only one outcome, cannot vary: it adds a
    constant and no evidence (``detail["n_informative"]``). ``detail["min_p"]``: the smallest p these margins allow
    (every stratum at its most extreme count); ``detail["odds_ratio_mh"]``: the Mantel-Haenszel common odds ratio.
    """
    if not strata:
        raise ValueError("stratified_exact_greater: no stratum given")
    pmf, offset = _hypergeom_pmfs(strata)
    observed = sum(s.correct_a for s in strata) - offset
    tail = np.cumsum(pmf[::-1])[::-1]  # tail[k] = P(count >= offset + k)
    p = float(tail[observed]) if observed < tail.size else 0.0
    num = sum(s.correct_a * (s.n_b - s.correct_b) / (s.n_a + s.n_b) for s in strata if s.n_a + s.n_b)
    den = sum((s.n_a - s.correct_a) * s.correct_b / (s.n_a + s.n_b) for s in strata if s.n_a + s.n_b)
    odds = num / den if den else (math.inf if num else math.nan)
    return TestResult(
        statistic=float(observed + offset),
        p_value=min(1.0, max(p, 0.0)),
        n=sum(s.n_a + s.n_b for s in strata),
        detail={
            "n_strata": len(strata),
            "n_informative": sum(s.informative for s in strata),
            "min_p": min(1.0, float(pmf[-1])),
            "expected": float(offset + np.dot(np.arange(pmf.size), pmf)),
            "odds_ratio_mh": odds,
            "null": "exact conditional (hypergeometric per stratum, convolved)",
        },
    )


def _labels(labels: Sequence[Any] | np.ndarray, n: int) -> np.ndarray:
    lab = np.asarray(labels, dtype=object)
    if lab.shape != (n,):
        raise ValueError(f"labels has shape {lab.shape}; expected one label per score ({n})")
    wrong = [v for v in lab.tolist() if v not in (True, False)]  # 0/1 compare equal to False/True
    if wrong:
        raise ValueError(f"labels must be booleans or 0/1, got {sorted(map(repr, set(wrong)))[:5]}")
    return np.asarray([bool(v) for v in lab.tolist()], dtype=bool)


def roc_auc(scores: Sequence[float] | np.ndarray, labels: Sequence[Any] | np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` (higher = positive) against boolean ``labels``.

    Ties between a positive and a negative count one half. Needs at least one positive and one
    negative label.
    """
    s = _finite(scores, "roc_auc: scores")
    lab = _labels(labels, s.size)
    pos, neg = s[lab], s[~lab]
    if pos.size == 0 or neg.size == 0:
        raise ValueError(f"roc_auc: need both classes, got {pos.size} positive and {neg.size} negative label(s)")
    ranks = _scipy_stats().rankdata(s)  # average ranks for ties
    u = float(ranks[lab].sum() - pos.size * (pos.size + 1) / 2.0)
    return u / (pos.size * neg.size)


def roc_curve(
    scores: Sequence[float] | np.ndarray, labels: Sequence[Any] | np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fpr, tpr, thresholds) for "positive when score >= threshold", from (0, 0) to (1, 1).

    Thresholds are the distinct scores in decreasing order, preceded by +inf.
    """
    s = _finite(scores, "roc_curve: scores")
    lab = _labels(labels, s.size)
    n_pos, n_neg = int(lab.sum()), int((~lab).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"roc_curve: need both classes, got {n_pos} positive and {n_neg} negative label(s)")
    order = np.argsort(-s, kind="mergesort")
    s_sorted, lab_sorted = s[order], lab[order]
    last_of_value = np.r_[np.flatnonzero(np.diff(s_sorted)), s_sorted.size - 1]
    tp = np.cumsum(lab_sorted)[last_of_value]
    fp = (last_of_value + 1) - tp
    fpr = np.r_[0.0, fp / n_neg]
    tpr = np.r_[0.0, tp / n_pos]
    thresholds = np.r_[np.inf, s_sorted[last_of_value]]
    return fpr, tpr, thresholds


def tpr_at_fpr(
    scores: Sequence[float] | np.ndarray, labels: Sequence[Any] | np.ndarray, max_fpr: float = 0.05
) -> float:
    """The largest true-positive rate among thresholds whose false-positive rate is <= ``max_fpr``."""
    if not 0.0 <= max_fpr <= 1.0:
        raise ValueError(f"tpr_at_fpr: max_fpr must be in [0, 1], got {max_fpr}")
    fpr, tpr, _ = roc_curve(scores, labels)
    return float(tpr[fpr <= max_fpr + 1e-12].max())


def describe(values: Sequence[float] | np.ndarray) -> dict[str, float | int]:
    """Distribution summary (n, mean, sd, quartiles) for reports when no test can be run."""
    v = _finite(values, "describe: values", min_size=0)
    if v.size == 0:
        return {"n": 0}
    q25, q50, q75 = np.quantile(v, [0.25, 0.5, 0.75])
    return {
        "n": int(v.size),
        "mean": float(v.mean()),
        "sd": float(v.std(ddof=1)) if v.size > 1 else 0.0,
        "min": float(v.min()),
        "q25": float(q25),
        "median": float(q50),
        "q75": float(q75),
        "max": float(v.max()),
    }
