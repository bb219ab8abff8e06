"""METEOR (Banerjee & Lavie 2005) with exact and Porter-stem matching, and its recall-only form.

What is implemented, from Banerjee & Lavie 2005, "METEOR: An Automatic Metric for MT Evaluation with
Improved Correlation with Human Judgments" (ACL workshop), Sec. 2, in the parametrisation of Lavie &
Agarwal 2007 (the one ``nltk.translate.meteor_score`` uses):

- **Alignment** in stages: first ``exact`` (same word), then ``stem`` (same Porter stem, Porter 1980)
  among the words still unaligned. Within a stage the number of aligned pairs is maximal, and among
  maximal alignments METEOR prefers the one with the fewest crossings; we get there by taking the
  longest runs of consecutive matching words first (a run is aligned as a block), then any single
  matches left. Because matching by surface form or stem is an equivalence, every maximal matching of
  a stage is also maximum, so the count is exact; the run-first order keeps chunks long.
  The WordNet-synonym stage is left out: WordNet data cannot be downloaded here, and Li et al.'s
  contamination matcher (below) scores near-verbatim text, where synonyms do not matter.
- **Score**: precision ``P = m / |hypothesis|``, recall ``R = m / |reference|``,
  ``Fmean = P R / (alpha P + (1 - alpha) R)``, fragmentation penalty
  ``Pen = gamma (chunks / m) ** beta`` with ``chunks`` the number of runs of aligned words adjacent in
  both strings, and ``METEOR = Fmean (1 - Pen)``. Defaults are the paper's ``alpha=0.9``, ``beta=3``,
  ``gamma=0.5`` (``Fmean = 10PR / (R + 9P)``, penalty at most 0.5).
- **METEOR recall** (``alpha=1``: ``Fmean = R``) is what Li et al. 2023, "An Open-Source Data
  Contamination Report for Large Language Models", score a benchmark example (the reference) against
  a candidate web text (the hypothesis) with: how much of the example the text contains, in order.
  ``contamray.methods.open.meteor_recall`` uses it with their gamma 0.8.

Words: lowercased letters-and-digits runs (``contamray.metrics.ngrams.words`` with the ``gpt2`` rule,
so NFKC and a word per character of scripts written without spaces, as the n-gram prefilter);
no nltk tokenizer data is needed. The Porter stemmer is nltk's (pure code, no data).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from contamray.metrics.ngrams import words as normalized_words

STAGES = ("exact", "stem")


def tokens(text: str) -> list[str]:
    """METEOR's words: lowercased runs of letters and digits."""
    return normalized_words(text, "gpt2")


@lru_cache(maxsize=1)
def _stemmer():  # noqa: ANN202 - nltk has no type hints
    from nltk.stem.porter import PorterStemmer

    return PorterStemmer()


@lru_cache(maxsize=200_000)
def stem(word: str) -> str:
    """Porter stem of a lowercased word (memoised: corpora repeat words)."""
    return _stemmer().stem(word, to_lowercase=False)


@dataclass(frozen=True)
class MeteorScore:
    """The parts of one METEOR score (see the module docstring)."""

    matches: int
    chunks: int
    reference_len: int
    hypothesis_len: int
    precision: float
    recall: float
    fmean: float
    penalty: float
    score: float


def _align_stage(
    hyp: Sequence[str],
    ref: Sequence[str],
    free_h: list[bool],
    free_r: list[bool],
    pairs: list[tuple[int, int]],
) -> None:
    """Align equal items of ``hyp`` and ``ref`` among the free positions: longest runs first."""
    where: dict[str, list[int]] = {}
    for j, w in enumerate(ref):
        if free_r[j]:
            where.setdefault(w, []).append(j)
    if not where:
        return
    candidates = {(i, j) for i, w in enumerate(hyp) if free_h[i] for j in where.get(w, ())}
    if not candidates:
        return
    runs = []
    for i, j in candidates:
        if (i - 1, j - 1) in candidates:
            continue  # not the start of a run
        length = 1
        while (i + length, j + length) in candidates:
            length += 1
        runs.append((-length, i, j))
    runs.sort()
    for neg_length, i, j in runs:
        for k in range(-neg_length):
            if free_h[i + k] and free_r[j + k]:
                free_h[i + k] = free_r[j + k] = False
                pairs.append((i + k, j + k))


def align(
    hypothesis: Sequence[str], reference: Sequence[str], stages: Sequence[str] = STAGES
) -> list[tuple[int, int]]:
    """Aligned ``(hypothesis index, reference index)`` pairs, one-to-one, sorted by hypothesis index."""
    free_h = [True] * len(hypothesis)
    free_r = [True] * len(reference)
    pairs: list[tuple[int, int]] = []
    for stage in stages:
        if stage == "exact":
            _align_stage(hypothesis, reference, free_h, free_r, pairs)
        elif stage == "stem":
            _align_stage([stem(w) for w in hypothesis], [stem(w) for w in reference], free_h, free_r, pairs)
        else:
            raise ValueError(f"unknown METEOR stage {stage!r}; expected one of {', '.join(STAGES)}")
    pairs.sort()
    return pairs


def count_chunks(pairs: Sequence[tuple[int, int]]) -> int:
    """Runs of pairs adjacent in both strings (``pairs`` sorted by hypothesis index)."""
    chunks = 0
    previous: tuple[int, int] | None = None
    for i, j in pairs:
        if previous is None or i != previous[0] + 1 or j != previous[1] + 1:
            chunks += 1
        previous = (i, j)
    return chunks


def meteor(
    reference: Sequence[str] | str,
    hypothesis: Sequence[str] | str,
    alpha: float = 0.9,
    beta: float = 3.0,
    gamma: float = 0.5,
    stages: Sequence[str] = STAGES,
) -> MeteorScore:
    """METEOR of ``hypothesis`` against ``reference`` (token lists, or texts tokenised by ``tokens``)."""
    if not 0.0 <= alpha <= 1.0 or not 0.0 <= gamma <= 1.0 or beta < 0:
        raise ValueError(
            f"METEOR parameters out of range: alpha={alpha} (0-1), beta={beta} (>= 0), gamma={gamma} (0-1)"
        )
    ref = tokens(reference) if isinstance(reference, str) else list(reference)
    hyp = tokens(hypothesis) if isinstance(hypothesis, str) else list(hypothesis)
    pairs = align(hyp, ref, stages)
    m = len(pairs)
    if m == 0:
        return MeteorScore(0, 0, len(ref), len(hyp), 0.0, 0.0, 0.0, 0.0, 0.0)
    precision, recall = m / len(hyp), m / len(ref)
    fmean = precision * recall / (alpha * precision + (1 - alpha) * recall)
    chunks = count_chunks(pairs)
    penalty = gamma * (chunks / m) ** beta
    return MeteorScore(
        m, chunks, len(ref), len(hyp), precision, recall, fmean, penalty, fmean * (1 - penalty)
    )


def meteor_recall(
    reference: Sequence[str] | str,
    hypothesis: Sequence[str] | str,
    gamma: float = 0.5,
    beta: float = 3.0,
    stages: Sequence[str] = STAGES,
) -> float:
    """METEOR with ``alpha=1``: recall of the reference's words in the hypothesis, order-penalised."""
    return meteor(reference, hypothesis, alpha=1.0, beta=beta, gamma=gamma, stages=stages).score
