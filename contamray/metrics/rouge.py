"""ROUGE-L F1 between a reference and a candidate text, through Google's ``rouge-score`` package.

ROUGE-L (Lin 2004) scores the longest common subsequence of tokens; F1 weighs precision and recall
equally, so it is symmetric in its two arguments. ``rouge-score`` lower-cases, keeps only ASCII letters
and digits as tokens (text in other scripts scores 0) and, with ``stemmer=True``, applies the Porter
stemmer, so "running dogs" and "run dog" match fully. Guided prompting (Golchin & Surdeanu 2023)
scores each completion against the reference's second piece with ROUGE-L; LLMSanitize does so with
stemming. The paper authors' released code went through HF ``evaluate``'s "rouge", whose default is no
stemming: pass ``stemmer=False`` to reproduce their numbers. Empty texts score 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=2)
def _scorer(stemmer: bool) -> Any:
    # imported here: rouge_score pulls in nltk, scipy and sklearn (about a second), which every
    # process that merely registers the methods (corpus match workers) would otherwise pay
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=stemmer)


def rouge_l_f1(reference: str, candidate: str, *, stemmer: bool = True) -> float:
    """ROUGE-L F1 of ``candidate`` against ``reference`` in [0, 1]."""
    return float(_scorer(stemmer).score(reference, candidate)["rougeL"].fmeasure)


def rouge_l_f1_many(
    references: Sequence[str], candidates: Sequence[str], *, stemmer: bool = True
) -> list[float]:
    """ROUGE-L F1 of each candidate against the reference at the same position."""
    if len(references) != len(candidates):
        raise ValueError(
            f"rouge_l_f1_many: {len(references)} references but {len(candidates)} candidates; "
            "pass one candidate per reference"
        )
    scorer = _scorer(stemmer)
    return [float(scorer.score(r, c)["rougeL"].fmeasure) for r, c in zip(references, candidates)]
