"""Property-based tests (hypothesis): metric bounds and symmetry, multiple-testing corrections against
their definitions and scipy, and every partition test's p-value valid under its null on simulated data.

Hypothesis runs derandomised (``derandomize=True``), so CI sees the same examples every time; the
simulations use fixed seeds. A valid p-value satisfies P(p <= a) <= a for every a under the null;
continuous tests (t, Mann-Whitney without ties) are uniform, which a Kolmogorov-Smirnov test checks;
discrete ones (sign flip, shard permutation) are checked at a grid of levels, with the binomial
tolerance of the simulation (3 standard errors).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from contamray.metrics.meteor import meteor, meteor_recall
from contamray.metrics.rouge import rouge_l_f1
from contamray.report.correction import benjamini_hochberg, holm
from contamray.stats.tests import mann_whitney_greater, shard_permutation_test, sign_flip_greater, t_test_greater

SETTINGS = settings(derandomize=True, max_examples=60, deadline=None, database=None)  # nothing written to disk
WORDS = st.sampled_from(["the", "cat", "sat", "on", "a", "mat", "dogs", "running", "ran", "blue", "sky", "42"])
TEXT = st.lists(WORDS, min_size=0, max_size=12).map(" ".join)
P_VALUES = st.lists(st.floats(min_value=0.0, max_value=1.0, allow_nan=False), min_size=1, max_size=30)


# ----------------------------------------------------------------------------- metrics


@SETTINGS
@given(TEXT, TEXT)
def test_rouge_l_f1_is_bounded_and_symmetric(a: str, b: str):
    score = rouge_l_f1(a, b)
    assert 0.0 <= score <= 1.0
    assert score == pytest.approx(rouge_l_f1(b, a))
    if a.split():
        assert rouge_l_f1(a, a) == pytest.approx(1.0)
    if not a.split() or not b.split():
        assert score == 0.0


@SETTINGS
@given(TEXT, TEXT)
def test_meteor_is_bounded_and_an_exact_copy_scores_highest(reference: str, hypothesis: str):
    score = meteor(reference, hypothesis).score
    recall = meteor_recall(reference, hypothesis)
    assert 0.0 <= score <= 1.0 and 0.0 <= recall <= 1.0
    if reference.split():
        assert meteor(reference, reference).score >= score - 1e-12
        assert meteor_recall(reference, reference) >= recall - 1e-12


# ----------------------------------------------------------------------------- multiple testing


def _holm_by_definition(p: np.ndarray) -> np.ndarray:
    """Holm (1979): the k-th smallest p, adjusted, is max over j <= k of min(1, (m - j + 1) p_(j))."""
    m = len(p)
    order = np.argsort(p, kind="mergesort")
    out = np.empty(m)
    for k in range(m):
        out[order[k]] = max(min(1.0, (m - j) * p[order[j]]) for j in range(k + 1))
    return out


@SETTINGS
@given(P_VALUES)
def test_holm_equals_its_definition(values: list[float]):
    p = np.asarray(values)
    np.testing.assert_allclose(holm(p), _holm_by_definition(p), rtol=1e-12, atol=1e-15)


@SETTINGS
@given(P_VALUES)
def test_benjamini_hochberg_equals_scipy(values: list[float]):
    p = np.asarray(values)
    np.testing.assert_allclose(benjamini_hochberg(p), stats.false_discovery_control(p, method="bh"), rtol=1e-12,
                               atol=1e-15)  # fmt: skip


@SETTINGS
@given(P_VALUES)
def test_adjusted_p_values_are_bounded_and_never_below_the_raw_ones(values: list[float]):
    p = np.asarray(values)
    for adjusted in (holm(p), benjamini_hochberg(p)):
        assert np.all(adjusted >= p - 1e-15) and np.all(adjusted <= 1.0)
    assert np.all(holm(p) >= benjamini_hochberg(p) - 1e-12)  # Holm controls FWER, so it is never less strict


# ----------------------------------------------------------------------------- p-values under the null

N_SIMULATIONS = 400
LEVELS = (0.01, 0.05, 0.1, 0.25, 0.5)


def _within_level(p_values: list[float], what: str) -> None:
    """P(p <= a) <= a at every level, up to 3 binomial standard errors of the simulation."""
    p = np.asarray(p_values)
    for a in LEVELS:
        rate = float(np.mean(p <= a + 1e-12))
        slack = 3 * math.sqrt(a * (1 - a) / len(p))
        assert rate <= a + slack, f"{what}: P(p <= {a}) = {rate:.3f} over {len(p)} null simulations"


def test_mann_whitney_p_is_uniform_under_the_null():
    rng = np.random.default_rng(11)
    p = [mann_whitney_greater(rng.normal(size=12), rng.normal(size=15)).p_value for _ in range(N_SIMULATIONS)]
    assert stats.kstest(p, "uniform").pvalue > 0.01
    _within_level(p, "Mann-Whitney")


def test_t_test_p_is_uniform_under_a_normal_null():
    rng = np.random.default_rng(12)
    p = [t_test_greater(rng.normal(size=10)).p_value for _ in range(N_SIMULATIONS)]
    assert stats.kstest(p, "uniform").pvalue > 0.01
    _within_level(p, "t test")


def test_sign_flip_p_is_valid_under_a_skewed_symmetric_null():
    """Differences symmetric about 0 but heavy-tailed (Student t, 2 df): exact up to 30 non-zero ones."""
    rng = np.random.default_rng(13)
    p = [sign_flip_greater(rng.standard_t(2, size=9)).p_value for _ in range(N_SIMULATIONS)]
    _within_level(p, "sign flip")


def test_shard_permutation_p_is_valid_when_the_canonical_order_is_exchangeable():
    """Per shard, skewed log-likelihoods (where Student's t over-rejects): the canonical one is just one
    of the shard's orderings, drawn like the others."""
    rng = np.random.default_rng(14)
    p = []
    for _ in range(N_SIMULATIONS):
        orderings = [-rng.gamma(0.7, 3.0, size=5) for _ in range(4)]
        p.append(shard_permutation_test(orderings).p_value)
    _within_level(p, "shard permutation")


# ----------------------------------------------------------------------------- corpus matching vs brute force

GRAM_WORDS = st.sampled_from(["alpha", "beta", "gamma", "delta", "Eps", "zeta,", "eta", "theta!", "7", "iota"])


@st.composite
def planted_corpus(draw) -> tuple[list[list[str]], list[list[str]]]:
    """Examples of 4-12 words from a 10-word vocabulary (so chance collisions happen) and documents of
    random words with random windows of random examples planted at random places."""
    examples = draw(st.lists(st.lists(GRAM_WORDS, min_size=4, max_size=12), min_size=1, max_size=5))
    docs = []
    for _ in range(draw(st.integers(1, 4))):
        doc = draw(st.lists(GRAM_WORDS, min_size=0, max_size=25))
        for _ in range(draw(st.integers(0, 2))):
            source = examples[draw(st.integers(0, len(examples) - 1))]
            start = draw(st.integers(0, len(source) - 1))
            stop = draw(st.integers(start + 1, len(source)))
            at = draw(st.integers(0, len(doc)))
            doc[at:at] = source[start:stop]
        docs.append(doc)
    return examples, docs


def _grams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


@SETTINGS
@given(planted_corpus(), st.integers(2, 4))
def test_ngram_matching_equals_brute_force(corpus, n: int):
    """``ngram_overlap``'s hashed index and vectorised match find exactly the n-grams (and documents) a
    brute-force set intersection of normalised word n-grams finds; n-grams two examples share are
    template n-grams, counted apart (an example found only through them is ``template_only``)."""
    from contamray.methods.open import ngram_overlap as ngo
    from contamray.metrics.ngrams import words
    from contamray.records import Record

    examples, docs = corpus
    records = [Record(id=f"r{i}", partition="p", input=" ".join(ws), label="", reference="", task="question_answering")
               for i, ws in enumerate(examples)]  # fmt: skip
    documents = [{"doc_id": f"d{j}", "text": " ".join(ws)} for j, ws in enumerate(docs)]
    cfg = ngo.NGramOverlapConfig(n=n, label_fields=(), min_words=1, short_examples="skip", max_evidence=100)
    matches = ngo.match(documents, ngo.build_index(records, cfg), cfg)
    rows = {r["record_id"]: r for r in ngo.score(records, matches, cfg)}
    doc_grams = {d["doc_id"]: _grams(words(d["text"]), n) for d in documents}
    holders: dict[tuple[str, ...], int] = {}
    for record in records:
        for gram in _grams(words(record.input), n):
            holders[gram] = holders.get(gram, 0) + 1
    for record in records:
        mine = _grams(words(record.input), n)
        found = {g for g in mine if any(g in grams for grams in doc_grams.values())}
        shared = {g for g in found if holders[g] >= 2}
        row = rows[record.id]
        if len(words(record.input)) < n:
            assert row["status"] == ngo.STATUS_TOO_SHORT and not row["contaminated"]
            continue
        assert row["n_ngrams"] == len(mine)
        assert (row["matched_total"], row["matched_template"]) == (len(found - shared), len(shared))
        assert row["contaminated"] == bool(found - shared)
        assert (row["contamination_type"] == "template_only") == bool(shared and not found - shared)
        evidence = found - shared if found - shared else shared
        assert row["doc_ids"] == sorted(d for d, grams in doc_grams.items() if grams & evidence)


CHARS = st.text(alphabet="abAB12 ,.-", min_size=0, max_size=40)


@st.composite
def planted_texts(draw) -> tuple[list[str], list[str]]:
    """Short examples over a 6-character alphabet (chance matches happen) and documents with random pieces
    of random examples planted into random text."""
    examples = draw(st.lists(st.text(alphabet="abAB12 ,.-", min_size=1, max_size=30), min_size=1, max_size=4))
    docs = []
    for _ in range(draw(st.integers(1, 3))):
        doc = draw(CHARS)
        for _ in range(draw(st.integers(0, 2))):
            source = examples[draw(st.integers(0, len(examples) - 1))]
            start = draw(st.integers(0, len(source)))
            stop = draw(st.integers(start, len(source)))
            at = draw(st.integers(0, len(doc)))
            doc = doc[:at] + source[start:stop] + doc[at:]
        docs.append(doc)
    return examples, docs


@SETTINGS
@given(planted_texts(), st.integers(3, 8), st.booleans())
def test_substring_matching_equals_brute_force(corpus, length: int, lowercase: bool):
    """``gpt4_substring``'s rolling-hash match finds exactly the sampled substrings (and documents) that
    Python's ``in`` finds in the processed documents."""
    from contamray.methods.open import gpt4_substring as g4
    from contamray.records import Record

    examples, docs = corpus
    records = [Record(id=f"r{i}", partition="p", input=text, label="", reference="", task="question_answering")
               for i, text in enumerate(examples)]  # fmt: skip
    documents = [{"doc_id": f"d{j}", "text": text} for j, text in enumerate(docs)]
    cfg = g4.GPT4SubstringConfig(length=length, n_samples=3, label_fields=(), lowercase=lowercase, max_evidence=100)
    rows = {r["record_id"]: r for r in g4.score(records, g4.match(documents, g4.build_index(records, cfg), cfg), cfg)}
    processed = {d["doc_id"]: g4.normalize(d["text"], lowercase) for d in documents}
    for record in records:
        samples = g4.example_samples(record, cfg).samples
        row = rows[record.id]
        found = [i for i, s in enumerate(samples) if any(s.text in text for text in processed.values())]
        assert row["samples_found"] == found
        assert row["contaminated"] == bool(found)
        docs_hit = sorted(d for d, text in processed.items() if any(s.text in text for s in samples))
        assert row["doc_ids"] == docs_hit
