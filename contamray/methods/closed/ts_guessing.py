"""TS-Guessing (Testset Slot Guessing): Deng et al., "Investigating Data Contamination in Modern Benchmarks for
Large Language Models" (NAACL 2024, arXiv:2311.09783; reference implementation: LLMSanitize,
``model_methods/ts_guessing_question_based.py`` and ``ts_guessing_question_multichoice.py``).

Idea: hide one slot of a test item that cannot be inferred from the rest and ask the model to fill it in;
a model that reproduces the exact hidden text has most likely seen the item. Two variants, two methods:

- ``ts_guessing`` - question-based TS-Guessing (Deng et al., NAACL 2024, arXiv:2311.09783): one
  informative word of the question (a noun, adjective or verb) is replaced by ``[MASK]`` and the model is
  asked for it with the paper's prompt ``QUESTION_PROMPT``: "Complete the sentence in one word:" / the
  masked question / "Reply the answer only."; per example, exact match of the first word of the answer
  with the masked word (normalised). The word is chosen by a documented heuristic, not a POS tagger
  (``ts_words``: none installs offline here): the longest content word that occurs once. Questions of
  fewer than ``min_words`` = 5 words are dropped (the reference implementation's filter: 4 words or fewer).
- ``ts_guessing_mc`` - multiple-choice TS-Guessing (Deng et al., NAACL 2024, arXiv:2311.09783): one
  *wrong* option is replaced by ``[MASK]`` (a seeded random wrong option: the correct one could be
  reasoned out from the question) and the model is asked for it with the paper's prompt
  (``MC_PROMPT_HEAD`` + options + ``MC_PROMPT_TAIL``): "Please fill in the [] in option B based on your
  benchmark knowledge." / "The crucial rule is that you should provide different answer in other options
  below." / "Question: ..." / "Options:" / "A: [...]" / "B: [MASK]" ... / "Reply with answer only."; per
  example, exact match (normalised) and ROUGE-L F1 of the answer against the *masked wrong option*. The
  paper's filters drop items whose options cannot be guessed as text: two options that are yes/no or
  true/false, and items where any two options have ROUGE-L F1 >= ``max_option_similarity`` = 0.65
  (near-duplicates: one option gives another away). Multiple-choice benchmarks only
  (``applies.needs_choices``).

Where this departs from the reference implementation, and why:

- **LLMSanitize scores the multiple-choice answer against the correct option** (its ``build_prompt``
  returns ``choices[answer_index]`` as the target while the mask hides a wrong option), so a model that
  reproduces the hidden wrong option scores 0 and one that repeats the visible correct answer scores 1. This
  is a bug; here, as in the paper, the target is the masked wrong option (``masked`` column);
- the question-based mask: LLMSanitize keeps only the Penn tags ``NN``/``JJ``/``VB`` of the Stanford tagger
  (no plurals, proper nouns or inflected verbs) and picks one at random, and replaces the first occurrence
  of the word *as a substring* (so "art" in "start"); here whole words, the longest content word by default
  (``choose: random`` for its uniform pick, seeded per record), never a word that occurs twice;
- answers are parsed, not tokenised with NLTK punkt (its data cannot be downloaded here): question-based,
  the first word of the reply that is not an article ("Answer:" labels skipped); multiple choice, the text
  after "B:" when the reply repeats the option letter, its first line, without the brackets of the prompt's
  ``[option]`` format. Normalisation for exact match: lower case, every character that is neither a letter
  nor a digit a space, whitespace collapsed (LLMSanitize only lower-cases);
- ``in_reply`` (1/0): the masked word or option occurs, as whole words, anywhere in the normalised reply.
  Not the paper's measure and never the decision: small instruct models seldom answer in one word (the
  embedded SmolLM2-135M restates the question: "The smallest unit of copper that still maintains the
  characteristics of copper is ..." for a masked "characteristics"), so exact match on the first word
  misses what they reproduce. It is reported (``details["in_reply_rate"]``) and tested against the
  held-out like every column of ``score_columns`` (``details["by_column"]``, as ROUGE-L for multiple choice);
- ROUGE-L with stemming (``rouge_stemmer``) as LLMSanitize (its ``rougeLsum`` equals ROUGE-L on one-line
  texts); prompts go through the model's chat template when it has one (``chat``; the paper prompted chat
  models: ChatGPT, GPT-4, Claude, Llama-2-chat); greedy decoding (temperature 0, LLMSanitize's default).

Partition decision (``reduce``, shared with the membership scores: ``heldout_test.HeldoutTest``): an
exact-match rate means little alone - how guessable a masked word or option is depends on the benchmark -
so the partition's per-example exact matches are compared with those of a *held-out partition of the same
benchmark known unseen* (``reference``, ``mode: heldout``) by a one-sided Mann-Whitney U test over sampling
units (``units``: a contiguous block of a split is tested as blocks of consecutive rows, each unit its
exact-match rate; rows of a random sample are units). Null: the partition and the held-out are
exchangeable draws and neither was seen, so their exact matches are exchangeable. ``rate`` is the
partition's exact-match rate (``details``: the held-out's, ROUGE-L means, filtered rows). ``inconclusive``
without a reference, with fewer than 10 scored rows a side, or when no ranking of the units could reach
``alpha``. Filtered items are not failures: they get a ``filtered`` reason, no score, and no request.

Per example: ``exact_match`` (1/0; the score the report plots and the membership score), ``masked`` (the
hidden word or wrong option), ``answer`` (parsed from ``completion``), ``in_reply``, ``rouge_l`` (multiple choice),
``masked_question`` / ``masked_letter``, ``filtered``, ``error``. Requests: stage 0, one greedy generation
per kept example, key ``"<record id>|ts_guessing"``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from contamray.methods.base import Applies, Output, Outputs, Verdict, register
from contamray.methods.closed import cell_rows
from contamray.methods.closed.cell_rows import built, column_mean, rows_of
from contamray.methods.closed.clean_dirty_eval import gold_index
from contamray.methods.closed.greedy_probe import GreedyProbe
from contamray.methods.closed.heldout_test import MIN_ROWS, HeldoutConfig, split_sides, unit_columns
from contamray.methods.closed.ts_words import CHOOSE, mask_word
from contamray.metrics.rouge import rouge_l_f1
from contamray.records import Record

# The paper's prompts (Deng et al. 2024, Figure 2 / the reference implementation), verbatim.
QUESTION_PROMPT = "Complete the sentence in one word:\n\n{question}\nReply the answer only."
MC_PROMPT_HEAD = (
    "Please fill in the [] in option {letter} based on your benchmark knowledge.\n\n"
    "The crucial rule is that you should provide different answer in other options below.\n\n"
    "Question: {question}\nOptions:"
)
MC_PROMPT_TAIL = "\n\nReply with answer only."
MASK = "[MASK]"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
BINARY_OPTIONS = ({"yes", "no"}, {"true", "false"})

_ARTICLES = frozenset({"a", "an", "the"})
_ANSWER_LABEL = re.compile(r"^\s*(?:the\s+)?(?:answer|word|option)\s*(?:is)?\s*[:\-]?\s*", re.IGNORECASE)
_TOKEN = re.compile(r"[^\W_]+(?:['\-][^\W_]+)*")


class Filtered(cell_rows.Filtered):
    """The paper's protocol leaves this item out (not a failure: no score, no request)."""


@dataclass
class TSGuessingConfig(HeldoutConfig):
    """Question-based TS-Guessing; defaults follow the paper (module docstring)."""

    seed: int = 0
    chat: bool = True  # the prompt through the model's chat template when it has one (the paper: chat models)
    max_tokens: int = 16  # the reply is one word
    choose: str = "longest"  # which content word to mask: longest (default) or random (LLMSanitize)
    min_len: int = 3  # letters a maskable word has at least
    min_words: int = 5  # questions of fewer words are dropped (the reference implementation: <= 4 words)
    method_name: ClassVar[str] = "ts_guessing"

    def __post_init__(self) -> None:
        super().__post_init__()
        where = f"methods.{self.method_name}"
        if self.max_tokens < 1:
            raise ValueError(f"{where}.max_tokens must be >= 1, got {self.max_tokens}")
        if self.choose not in CHOOSE:
            raise ValueError(f"{where}.choose: {self.choose!r}; use one of {', '.join(CHOOSE)}")
        if self.min_len < 1 or self.min_words < 1:
            raise ValueError(f"{where}: min_len and min_words must be >= 1, got {self.min_len} / {self.min_words}")


@dataclass
class TSGuessingMCConfig(HeldoutConfig):
    """Multiple-choice TS-Guessing; defaults follow the paper (module docstring)."""

    seed: int = 0
    chat: bool = True
    max_tokens: int = 48  # an option's text
    max_option_similarity: float = 0.65  # drop items with two options at ROUGE-L F1 >= this (the paper's 0.65)
    drop_binary: bool = True  # drop two-option yes/no and true/false items (the paper's filter)
    rouge_stemmer: bool = True
    method_name: ClassVar[str] = "ts_guessing_mc"

    def __post_init__(self) -> None:
        super().__post_init__()
        where = f"methods.{self.method_name}"
        if self.max_tokens < 1:
            raise ValueError(f"{where}.max_tokens must be >= 1, got {self.max_tokens}")
        if not 0.0 < self.max_option_similarity <= 1.0:
            raise ValueError(
                f"{where}.max_option_similarity must be in (0, 1] (the paper: 0.65), got {self.max_option_similarity}"
            )


# ----------------------------------------------------------------------------- text


def normalise(text: str) -> str:
    """Lower case, every non-alphanumeric character a space, whitespace collapsed."""
    return " ".join(re.sub(r"[^\w]|_", " ", text.lower()).split())


def exact_match(answer: str, target: str) -> bool:
    """Normalised equality; an empty answer never matches."""
    a = normalise(answer)
    return bool(a) and a == normalise(target)


def in_reply(target: str, reply: str) -> bool:
    """The normalised ``target`` occurs in the normalised ``reply`` as whole words (an empty target never)."""
    t = normalise(target)
    return bool(t) and f" {t} " in f" {normalise(reply)} "


def first_word(reply: str) -> str:
    """The first word of ``reply`` that is not an article, after an "Answer:" label ("" when none)."""
    text = _ANSWER_LABEL.sub("", reply.strip(), count=1)
    for token in _TOKEN.findall(text):
        if token.lower() not in _ARTICLES:
            return token
    return ""


def option_answer(reply: str, letter: str) -> str:
    """The option text of ``reply``: after "<letter>:" when the reply repeats it, its first non-empty line,
    without the prompt's brackets, an "Answer:" label or a leading "<letter>." / "<letter>)"."""
    text = reply.strip()
    marker = f"{letter}:"
    if marker in text:
        text = text.split(marker, 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    text = lines[0] if lines else ""
    text = _ANSWER_LABEL.sub("", text, count=1)
    text = re.sub(rf"^{re.escape(letter)}\s*[.)]\s+", "", text)
    if text.startswith("[") and "]" in text:
        text = text[1 : text.index("]")]
    return text.strip().strip("[]\"'`").strip()


def near_duplicate_options(options: Iterable[str], threshold: float, stemmer: bool = True) -> tuple[int, int] | None:
    """The first pair of option positions whose ROUGE-L F1 is >= ``threshold``, or None."""
    opts = list(options)
    for i in range(len(opts)):
        for j in range(i + 1, len(opts)):
            if rouge_l_f1(opts[i], opts[j], stemmer=stemmer) >= threshold:
                return (i, j)
    return None


def _rng(seed: int, record_id: str) -> np.random.Generator:
    digest = hashlib.blake2b(f"{seed}\x1fts_guessing_mc\x1f{record_id}".encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


# ----------------------------------------------------------------------------- probes


@dataclass(frozen=True)
class Probe:
    """What one example asks and what answer counts."""

    prompt: str
    target: str  # the masked word / wrong option
    columns: dict[str, Any]  # masked_question / masked_letter, ...


def question_probe(record: Record, cfg: TSGuessingConfig) -> Probe:
    """Mask one content word of the question; Filtered when the paper's filters drop it."""
    question = record.input.strip()
    if not question:
        raise ValueError("field 'input' (the question) is empty; fix the benchmark adapter")
    n_words = len(question.split())
    if n_words < cfg.min_words:
        raise Filtered(f"{n_words} word(s) < min_words={cfg.min_words}: too short to mask an informative word")
    try:
        masked = mask_word(question, record.id, cfg.choose, cfg.seed, cfg.min_len, MASK)
    except ValueError as err:
        raise Filtered(str(err)) from None
    return Probe(QUESTION_PROMPT.format(question=masked.text), masked.word, {"masked_question": masked.text})


def mc_probe(record: Record, cfg: TSGuessingMCConfig) -> Probe:
    """Mask one wrong option (seeded); Filtered by the paper's option filters, ValueError without a gold key."""
    options = [c.strip() for c in record.choices]
    if len(options) < 2:
        raise ValueError("has fewer than 2 options; ts_guessing_mc needs a multiple-choice benchmark")
    if len(options) > len(LETTERS):
        raise ValueError(f"has {len(options)} options; the prompt letters them A-Z (at most {len(LETTERS)})")
    gold = gold_index(record)
    if gold is None:
        raise ValueError(f"the gold answer {record.answer!r} / label {record.label!r} names none of its options")
    if cfg.drop_binary and len(options) == 2 and {normalise(o) for o in options} in BINARY_OPTIONS:
        raise Filtered("two options yes/no or true/false: nothing to guess (the paper's filter)")
    pair = near_duplicate_options(options, cfg.max_option_similarity, cfg.rouge_stemmer)
    if pair is not None:
        raise Filtered(
            f"options {LETTERS[pair[0]]} and {LETTERS[pair[1]]} have ROUGE-L F1 >= "
            f"max_option_similarity={cfg.max_option_similarity} (near-duplicates; the paper's filter)"
        )
    wrong = [k for k, o in enumerate(options) if k != gold and o]
    if not wrong:
        raise Filtered("no non-empty wrong option to mask")
    k = wrong[int(_rng(cfg.seed, record.id).integers(len(wrong)))]
    letter = LETTERS[k]
    lines = [f"{LETTERS[i]}: {MASK}" if i == k else f"{LETTERS[i]}: [{o}]" for i, o in enumerate(options)]
    prompt = MC_PROMPT_HEAD.format(letter=letter, question=record.input.strip()) + "\n" + "\n".join(lines)
    return Probe(prompt + MC_PROMPT_TAIL, options[k], {"masked_letter": letter, "correct_option": options[gold]})


# ----------------------------------------------------------------------------- the methods


class _TSGuessing(GreedyProbe):
    """Shared probe / score / reduce; subclasses build the probe and parse the reply."""

    family = "closed"
    engine_roles = ("target",)
    applies: ClassVar[Applies] = Applies(min_rows=MIN_ROWS)
    tie_hint = "no masked word guessed"
    key_suffix = "ts_guessing"
    extra_columns: ClassVar[tuple[str, ...]] = ()

    def prompt(self, probe: Probe, cfg: Any) -> str:
        return probe.prompt

    def judge(self, reply: str, probe: Probe, cfg: Any) -> dict[str, Any]:
        """``answer``, ``exact_match`` and the variant's columns from the model's reply."""
        raise NotImplementedError

    def _score_one(self, record: Record, got: dict[str, Output], cfg: Any) -> dict[str, Any]:
        row: dict[str, Any] = {**unit_columns(record), "masked": "", "completion": "", "answer": "",
                               "exact_match": None, "in_reply": None, **dict.fromkeys(self.extra_columns),
                               "filtered": "", "error": ""}  # fmt: skip
        probe = built(row, lambda: self._probe(record, cfg))
        if probe is None:
            return row
        row.update(masked=probe.target, **probe.columns)
        output = self.reply(record, got, row)
        if output is None:
            return row
        row["completion"] = output.text
        row.update(self.judge(output.text, probe, cfg))
        row["in_reply"] = float(in_reply(probe.target, output.text))
        return row

    def score_columns(self, cfg: Any) -> list[str]:
        """Tested beside ``exact_match`` in ``details["by_column"]`` (never deciding)."""
        return ["in_reply", *(["rouge_l"] if "rouge_l" in self.extra_columns else [])]

    rate_label: ClassVar[str] = "exact match"

    def reduce(self, table: Any, cfg: Any) -> Verdict:
        """The held-out test on ``exact_match`` (``GreedyProbe``: the exact-match rates as ``rate``), and the mean
        ROUGE-L of both sides when scored."""
        rows = rows_of(table)
        verdict = super().reduce(rows, cfg)
        if "rouge_l" in self.extra_columns:
            own, ref = split_sides(rows)
            verdict.details["mean_rouge_l"] = column_mean(own, "rouge_l")[0]
            verdict.details["reference_mean_rouge_l"] = column_mean(ref, "rouge_l")[0]
        return verdict


@register
class TSGuessing(_TSGuessing):
    """TS-Guessing, question-based: mask an informative word of the question, ask for it (Deng et al. 2024)."""

    name = "ts_guessing"
    Config = TSGuessingConfig
    outputs = Outputs(
        score="exact_match", score_label="masked word guessed exactly (1) or not (0)", membership="exact_match"
    )
    extra_columns = ("masked_question",)

    def probe(self, record: Record, cfg: TSGuessingConfig) -> Probe:
        return question_probe(record, cfg)

    def judge(self, reply: str, probe: Probe, cfg: TSGuessingConfig) -> dict[str, Any]:
        answer = first_word(reply)
        return {"answer": answer, "exact_match": float(exact_match(answer, probe.target))}


@register
class TSGuessingMC(_TSGuessing):
    """TS-Guessing, multiple choice: mask a wrong option, ask for it; exact match and ROUGE-L (Deng et al. 2024)."""

    name = "ts_guessing_mc"
    Config = TSGuessingMCConfig
    outputs = Outputs(
        score="exact_match",
        score_label="masked wrong option reproduced exactly (1) or not (0)",
        membership="exact_match",
    )
    applies = Applies(needs_choices=True, min_rows=MIN_ROWS)
    tie_hint = "no masked option reproduced"
    extra_columns = ("rouge_l", "masked_letter", "correct_option")

    def probe(self, record: Record, cfg: TSGuessingMCConfig) -> Probe:
        return mc_probe(record, cfg)

    def judge(self, reply: str, probe: Probe, cfg: TSGuessingMCConfig) -> dict[str, Any]:
        answer = option_answer(reply, probe.columns["masked_letter"])
        return {
            "answer": answer,
            "exact_match": float(exact_match(answer, probe.target)),
            "rouge_l": rouge_l_f1(probe.target, answer, stemmer=cfg.rouge_stemmer),
        }
