"""METEOR (exact + Porter stem, fragmentation penalty) and the rolling hashes of the exact matchers."""

from __future__ import annotations

import random

import numpy as np
import pytest

from contamray.metrics import meteor as mt
from contamray.metrics import rolling


def test_identical_strings_lose_only_the_one_chunk_penalty():
    s = mt.meteor("the cat sat on the mat", "the cat sat on the mat")
    assert (s.matches, s.chunks, s.precision, s.recall, s.fmean) == (6, 1, 1.0, 1.0, 1.0)
    assert s.score == pytest.approx(1 - 0.5 * (1 / 6) ** 3)


def test_formula_of_banerjee_and_lavie():
    # one inserted word: P = 6/7, R = 1, Fmean = 10PR / (R + 9P), two chunks of six matches
    s = mt.meteor("the president spoke to the audience", "the president then spoke to the audience")
    p, r = 6 / 7, 1.0
    assert (s.matches, s.chunks) == (6, 2)
    assert s.fmean == pytest.approx(10 * p * r / (r + 9 * p))
    assert s.score == pytest.approx(s.fmean * (1 - 0.5 * (2 / 6) ** 3))
    assert mt.meteor("a b c", "x y z").score == 0.0


def test_alignment_takes_the_fewest_chunks():
    # "on the mat" | "sat" | "the cat": 3 chunks (nltk's greedy aligner makes 6 of this pair)
    s = mt.meteor("the cat sat on the mat", "on the mat sat the cat")
    assert (s.matches, s.chunks) == (6, 3)
    assert mt.align(mt.tokens("x the cat"), mt.tokens("the cat y the")) == [(1, 0), (2, 1)]


def test_porter_stems_match_after_exact_words():
    s = mt.meteor("running dogs barked", "the dog runs and barked")
    assert s.matches == 3  # barked (exact), dogs~dog, running~runs (stem "run")
    assert mt.meteor("running dogs barked", "the dog runs and barked", stages=("exact",)).matches == 1
    with pytest.raises(ValueError, match="unknown METEOR stage"):
        mt.align(["a"], ["a"], stages=("synonym",))


def test_recall_form_used_for_contamination():
    query = "which gas do plants absorb carbon dioxide"
    window = "many ask which gas do plants absorb from the air and the answer is carbon dioxide of course"
    # alpha = 1: Fmean = recall = 7/7; two chunks; gamma 0.8 as in Li et al.
    assert mt.meteor_recall(query, window, gamma=0.8) == pytest.approx(1 - 0.8 * (2 / 7) ** 3)
    assert mt.meteor_recall(query, "plants absorb water", gamma=0.8) == pytest.approx(
        (2 / 7) * (1 - 0.8 * (1 / 2) ** 3)
    )


def test_agrees_with_nltk_when_the_alignment_is_unambiguous():
    nltk_meteor = pytest.importorskip("nltk.translate.meteor_score")

    class NoWordNet:  # nltk's synonym stage needs WordNet data, which is not available offline
        def synsets(self, *args, **kwargs):
            return []

    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(40)]
    for _ in range(50):
        ref = rng.sample(vocab, rng.randint(3, 15))  # distinct words: one possible alignment
        hyp = rng.sample(ref, rng.randint(1, len(ref))) + rng.sample(vocab, 3)
        hyp = list(dict.fromkeys(hyp))
        rng.shuffle(hyp)
        want = nltk_meteor.single_meteor_score(ref, hyp, wordnet=NoWordNet())
        assert mt.meteor(ref, hyp).score == pytest.approx(want, abs=1e-9)


def test_rolling_hashes_are_the_polynomial():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 2**32, size=300).astype(np.uint64)
    base, mod = rolling.BASE, 1 << 64
    for length in (1, 7, 50, 300):
        got = rolling.window_hashes(codes, length)
        assert got.shape == (300 - length + 1,)
        for i in {0, min(1, len(got) - 1), len(got) // 2, len(got) - 1}:
            want = sum(int(codes[i + k]) * pow(base, k, mod) for k in range(length)) % mod
            assert int(got[i]) == want
    assert rolling.window_hashes(codes[:3], 5).shape == (0,)
    text = "abcabcXabc"
    hashes = rolling.window_hashes(rolling.text_codes(text), 3)
    key = np.array([rolling.sequence_hash(rolling.text_codes("abc"))], dtype=np.uint64)
    positions, _ = rolling.find_all(hashes, key)
    assert positions.tolist() == [0, 3, 7]
