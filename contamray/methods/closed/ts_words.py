"""Which word of a question TS-Guessing masks: a deterministic content-word heuristic (no POS tagger).

Deng et al. (2024) tag the question with the Stanford POS tagger and mask a noun, adjective or verb
(LLMSanitize's reference implementation keeps the Penn tags ``NN``, ``JJ`` and ``VB`` of the Stanford
``english-bidirectional-distsim`` tagger and picks one at random). No POS tagger installs offline from the
package index here: NLTK's averaged-perceptron and Stanford tagger models are downloads from outside the
index, and spaCy's English pipelines are on the index only as third-party re-uploads. So the choice is a
documented heuristic that needs no model:

1. words are runs of letters (inner apostrophes and hyphens kept); numbers and symbols are never masked;
2. a *content word* is one of at least ``min_len`` letters that is not in ``STOP_WORDS`` (determiners,
   pronouns, prepositions, conjunctions, auxiliary and modal verbs, wh-words, negation, quantifiers,
   frequent adverbs, and "following" of "which of the following": the closed classes, which POS taggers
   never tag noun/adjective/verb) and is not an adverb by the suffix rule (ends in ``-ly``, except the
   nouns/adjectives of ``LY_CONTENT`` such as "family", "supply", "early"); what remains is overwhelmingly
   nouns, verbs and adjectives;
3. a word that occurs twice in the question (case-insensitive) is not a candidate: masking one
   occurrence would leave the answer in plain sight;
4. ``choose="longest"`` (default) masks the longest candidate (the first on ties): by Zipf's law of
   abbreviation longer words are rarer, and the paper's abstract asks for "an unlikely word" - a word the
   grammar around the blank does not give away; ``choose="random"`` masks a candidate drawn from a
   generator seeded by (seed, record id), as LLMSanitize's uniform pick.

Proper nouns count as nouns here (Penn ``NNP``), plural and inflected forms as their words (the reference
implementation's exact tag match would skip ``NNS``/``VBD``/``VBZ``); the paper says nouns, adjectives or
verbs, not which forms.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np

CHOOSE = ("longest", "random")

_WORD = re.compile(r"[A-Za-z]+(?:['\-][A-Za-z]+)*")

STOP_WORDS = frozenset(
    """
    a an the this that these those such what which who whom whose where when why how whether whatever
    i me my mine myself we us our ours ourselves you your yours yourself yourselves he him his himself she her
    hers herself it its itself they them their theirs themselves one ones someone something anyone anything
    everyone everything nobody nothing none
    and or but nor so yet for if then than because although though while unless until since as
    of in on at by to from with without into onto upon over under above below between among through during
    before after about against around across along behind beyond near off out up down within toward towards
    per via like unlike
    be am is are was were been being have has had having do does did doing done
    can could may might must shall should will would ought
    not no yes very too also only just even still already again ever never always often sometimes usually
    more most less least much many few several some any all each every both either neither other another
    same own there here now then thus hence however therefore instead rather quite almost
    let lets said say says following
    """.split()
)

# words ending in -ly that are nouns or adjectives, not adverbs
LY_CONTENT = frozenset(
    "family families supply supplies reply replies apply applies assembly butterfly butterflies jelly belly "
    "italy july ally allies rally monopoly anomaly anomalies early likely friendly daily weekly monthly yearly "
    "holy ugly silly lonely lovely elderly costly deadly orderly fly flies lily bully".split()
)


@dataclass(frozen=True)
class Masked:
    """A question with one word replaced by ``[MASK]``, and the word."""

    text: str
    word: str
    start: int
    end: int


def words(text: str) -> list[tuple[str, int, int]]:
    """(word, start, end) of every word of ``text`` (letters, inner apostrophes and hyphens)."""
    return [(m.group(), m.start(), m.end()) for m in _WORD.finditer(text)]


def is_content_word(word: str, min_len: int = 3) -> bool:
    """Not a closed-class word, not an adverb by the -ly rule, at least ``min_len`` letters."""
    low = word.lower()
    if len(low) < min_len or low in STOP_WORDS:
        return False
    return not (low.endswith("ly") and len(low) > 4 and low not in LY_CONTENT)


def candidates(text: str, min_len: int = 3) -> list[tuple[str, int, int]]:
    """The maskable words of ``text``: content words that occur once (case-insensitive)."""
    found = words(text)
    counts: dict[str, int] = {}
    for w, _, _ in found:
        counts[w.lower()] = counts.get(w.lower(), 0) + 1
    return [(w, a, b) for w, a, b in found if counts[w.lower()] == 1 and is_content_word(w, min_len)]


def _rng(seed: int, record_id: str) -> np.random.Generator:
    digest = hashlib.blake2b(f"{seed}\x1fts_guessing\x1f{record_id}".encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


def mask_word(
    text: str, record_id: str = "", choose: str = "longest", seed: int = 0, min_len: int = 3, mask: str = "[MASK]"
) -> Masked:
    """Mask one content word of ``text`` (module docstring); ValueError when it has none."""
    if choose not in CHOOSE:
        raise ValueError(f"choose={choose!r}; use one of {', '.join(CHOOSE)}")
    pool = candidates(text, min_len)
    if not pool:
        raise ValueError(
            f"no content word of >= {min_len} letters that occurs once: nothing informative to mask"
        )
    if choose == "longest":
        word, start, end = max(pool, key=lambda c: (len(c[0]), -c[1]))
    else:
        word, start, end = pool[int(_rng(seed, record_id).integers(len(pool)))]
    return Masked(text[:start] + mask + text[end:], word, start, end)
