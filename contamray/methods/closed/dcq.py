"""Data Contamination Quiz (DCQ): Golchin & Surdeanu, "Data Contamination Quiz: A Tool to Detect and Estimate
Contamination in Large Language Models" (arXiv:2311.06233, TACL 2025; authors' code: github.com/shahriargolchin/DCQ).

- ``dcq`` - Data Contamination Quiz (Golchin & Surdeanu, arXiv:2311.06233, TACL 2025): each instance is hidden
  among four word-level perturbations of itself (words swapped for contextual synonyms, meaning, structure and
  label kept) and the model is asked which option is the *exact* instance of the named dataset split, with
  "E) None of the provided options" as a way out; a model that picks the original beyond what its positional
  bias explains has seen it. Perturbations come from the judge engine (``judge: true``, the paper's GPT-4 role)
  or, without a judge, from a deterministic offline synonym substitution; bias compensated as in the paper
  (the original in each position); the paper's contamination range per partition in the verdict's details.

The protocol, as in the authors' code (``src/core``, ``src/helpers/option_counter.py``):

1. **Options.** Four distinct word-level perturbations per instance (``OPTIONS_PROMPT``: our wording of the
   paper's option-generation prompt - swap words for contextually relevant synonyms, keep meaning, structure,
   symbols and label, four *distinct* options laid out ``A)\\n...\\n\\nB)\\n...``; parsed with the authors'
   regex). With ``judge: true`` the judge engine writes them (stage 0, key ``"<id>|dcq|options"``); else
   ``synonym_perturbations`` (below).
2. **Bias Detector Quiz (BDQ).** The four perturbations alone in A-D, E) "None of the provided options"
   (``QUIZ_PROMPT``: our wording of the paper's quiz prompt - select the option that *exactly* corresponds to an
   instance from the {split} split of the {dataset} dataset - with ``name_split: false`` "an instance from the
   {dataset} dataset" -, one letter, E when unknown; hint: only one option
   has the exact wording). Greedy; the paper allows 1 token, here ``max_tokens`` = 5 and the first option
   letter A-E of the reply is the answer (``parse_answer``). The letters chosen are the model's positional
   bias; "non-preferred" positions are the letters A-D chosen fewer than ``ceil(n / 5)`` times (``n`` the
   partition's scored rows); if none, all of A-D (``non_preferred``).
3. **Bias Compensator Quizzes (BCQ).** For a position p, the original replaces the perturbation at p; the
   BCQ count of p is how often p (the original) is chosen.
4. **Contamination range** (``contamination_range``): positions sorted by most original choices, then least
   BDQ bias; upper = best count / n; kappa = (best - BDQ bias at best) / (n - BDQ bias at best);
   lower = max(kappa, second-best count / n).

Where this departs from the authors' code, and why:

- **The partition verdict is not the paper's.** The paper reads the range ("better than chance" = seen); but
  a model can prefer the original over word-swapped copies of a text it never saw, because the original is
  the more fluent, more human-like wording (the same reason a perturbation-based membership score is positive
  on unseen text, ``heldout_test``), so "better than chance" is not a valid null. Here the decision is
  ``heldout_test.HeldoutTest``'s: per example, ``score`` = the share of its BCQ quizzes in which the original
  was chosen (higher = member), compared with the same score on a *held-out partition of the same benchmark*
  known unseen (``reference``, ``mode: heldout``) by a one-sided Mann-Whitney U test over sampling units
  (null: the two partitions are exchangeable and neither was seen, so the fluency preference is the same on
  both). The two sides must be asked the same question: the quiz names the dataset and split (``name_split``,
  the paper's prompt), so the plan refuses a reference from another split ("an instance from the validation
  split" is not the question "... the test split" asks) and names the fix - a held-out of the same split, or
  ``name_split: false`` (the dataset only, in both). No reference: ``inconclusive`` (the range alone is
  reported). ``rate`` is the paper's *upper*
  estimate of the partition (its "contamination level"); the range, BDQ counts, non-preferred positions and
  BCQ counts of the partition and of its reference are in ``details["dcq"]`` / ``details["reference_dcq"]``;
- ``positions: all`` (default) asks the BCQ in all four positions for every example (each option in each
  position, 5 quizzes an example), so every example's ``score`` is measured the same way on both sides of the
  held-out test; the paper's range still uses only the non-preferred positions. ``positions: non_preferred``
  asks only those, as the authors' code (1 + k quizzes; one stage later, since the positions need the whole
  partition's BDQ answers); then the partition and its reference may be quizzed at different positions, and
  the held-out comparison is only approximately exchangeable;
- **one non-preferred position**: the authors' code reads the second entry of the sorted positions and crashes
  when there is only one; here lower = max(kappa, 0) then (kappa alone, clipped at 0: a negative share means
  the original was chosen less often than the BDQ chose that letter);
- the answer is the first option letter of a reply of up to ``max_tokens`` tokens, not the authors' count of
  every letter-word in a 1-token reply; prompts go through the model's chat template (``chat``; the paper
  prompted chat models: GPT-4, GPT-3.5); a reply with no letter counts as no choice (``answer`` empty: never
  the original; ``n_unparsed`` in the details);
- the instance is the record's ``input`` (question, passage, sentence pair), followed for classification and
  NLI items by a ``Label: <label>`` line identical in every option (``include_label``; the authors joined the
  columns they chose as ``<column>: <value>`` lines, label included, and asked GPT-4 to keep the label); the
  judge perturbs only the text, the label line is appended after;
- the judge's options are generated greedily (``judge_temperature`` = 0; the authors sampled GPT-4 at
  temperature 1.0) and checked: four non-empty options, distinct, none equal to the instance (whitespace
  ignored); otherwise the row fails with that reason (the authors' code left the cell empty);
- **without a judge** (``judge: false``, the default), ``synonym_perturbations``: a deterministic offline
  substitution from the curated table ``dcq_synonyms.SYNONYMS`` (no WordNet or spaCy model installs offline
  here). Words of the table (lower-case, or capitalised at a sentence start; never names, acronyms, numbers,
  or words joined to digits or hyphens) are each swapped with probability ``swap_share`` for one of their
  synonyms (case kept; "a"/"an" before a swapped word is never left wrong: the synonym must start with the
  same vowel/consonant class), by a generator seeded with (``seed``, record id), until four options distinct
  from each other and from the original are drawn. Weakness: the swaps are context-free (no sense or
  part-of-speech check), so an option may read less naturally than GPT-4's, which widens the fluency gap the
  held-out comparison corrects for; a text with too few table words has fewer than four distinct
  perturbations and is left out (``filtered`` column with the reason, no request, not a failure - the same
  rule drops the same kind of text on both sides of the held-out test; ``details["n_filtered"]``). Measured on
  200 rows each (700 table words): 16 % of ARC-Challenge questions left out, 5 % GSM8K, 7 % HellaSwag, 8 %
  WinoGrande, 16 % AG News, 13 % RTE, 38 % MMLU, 43 % TruthfulQA (short questions), under 1 % XSum, IMDB.

Per example: ``score`` (share of BCQ quizzes where the original was chosen; the plotted and membership
score), ``instance``, ``perturbation_1`` .. ``perturbation_4``, ``perturbed_by`` (judge / synonyms),
``bdq_reply`` (the model's reply to the BDQ, as it came), ``bdq_answer``, ``bcq_A`` .. ``bcq_D`` (the
letter chosen with the original at that position; None where not quizzed), ``n_bcq``, ``n_original``,
``filtered``, ``error``, and the sampling-unit columns of ``unit_columns``.
Requests: (judge) stage 0 ``"<id>|dcq|options"`` on engine role ``judge``; then ``"<id>|dcq|bdq"`` and
``"<id>|dcq|bcq_<P>"`` on the target (with ``positions: non_preferred`` the BCQ one stage after the BDQ).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from contamray.methods.base import Applies, BenchmarkFacts, Output, Outputs, Request, Sampling, Verdict, register
from contamray.methods.closed import cell_rows
from contamray.methods.closed.cell_rows import built, finite, missing, output_map, row_failed, rows_of, truthy
from contamray.methods.closed.dcq_synonyms import SYNONYMS
from contamray.methods.closed.guided_prompting import dataset_and_split
from contamray.methods.closed.heldout_test import MIN_ROWS, HeldoutConfig, HeldoutTest, partition_of, unit_columns
from contamray.records import Record

NAME = "dcq"
POSITIONS = "ABCD"  # where an option (and in a BCQ, the original) can stand
NONE_LETTER = "E"  # "None of the provided options"
LETTERS = POSITIONS + NONE_LETTER
POSITION_MODES = ("all", "non_preferred")
LABEL_TASKS = ("classification", "nli")

# Our wording of the paper's prompts (the authors' src/prompts; not copied verbatim).
OPTIONS_PROMPT = (
    "Turn the INPUT TEXT below into four options of a multiple-choice quiz. Write each option by swapping words "
    "of the INPUT TEXT for synonyms that fit their context, so that every option means exactly the same as the "
    "INPUT TEXT and keeps its sentence structure.\n\n"
    "Rules:\n"
    "(1) The four options must be DISTINCT from each other and from the INPUT TEXT; never repeat the INPUT TEXT "
    "as an option.\n"
    "(2) Options may differ from the INPUT TEXT ONLY by WORD-LEVEL substitutions: no reordering, no added or "
    "dropped content.\n"
    "(3) Keep every number, name, symbol and label of the INPUT TEXT exactly as it is.\n"
    "(4) Give the options in order, in the LAYOUT below, with no explanation.\n"
    "---\n"
    "INPUT TEXT:\n{text}\n"
    "---\n"
    "LAYOUT:\n\n"
    "A)\nfirst option\n\nB)\nsecond option\n\nC)\nthird option\n\nD)\nfourth option\n"
    "---\n"
)
QUIZ_PROMPT = (
    "Here is a quiz with five options. Choose the option that is, word for word, an instance from {source}.\n\n"
    "Rules:\n"
    "(1) Answer with the letter of one option only.\n"
    '(2) If you do not know the dataset or which option is the instance, answer "E) None of the provided '
    'options."\n\n'
    "Hint: the options all mean the same thing, but ONLY one of them has the EXACT WORDING of the original "
    "instance.\n"
    "---\n"
    "{options}\n\n"
    "E)\nNone of the provided options.\n"
    "---\n"
    "ANSWER:"
)
_OPTION_SPLIT = re.compile(r"(?<!\w)([A-D])\)\s*\n")  # the authors' parser of the generated options
_ANSWER = re.compile(
    r"^\W*(?:(?:the\s+)?(?:correct\s+)?(?:answer|option|choice)\s*(?:is)?\s*[:\-]?\s*)?\(?([A-Ea-e])(?![A-Za-z])",
    re.IGNORECASE,
)
_LETTER_PAREN = re.compile(r"(?<![A-Za-z])([A-E])\)")
_LETTER_WORD = re.compile(r"\b(?:option|answer|choice)\s*(?:is\s*)?:?\s*\(?([A-E])(?![A-Za-z])", re.IGNORECASE)
_SWAPPABLE = re.compile(r"(?<![\w'\-])[A-Za-z]+(?![\w'\-])")
_SENTENCE_START = re.compile(r"(?:^|[.!?:]\s+|\n\s*)[\"'(\[]?$")


class Filtered(cell_rows.Filtered):
    """The offline synonym table cannot give this text four distinct perturbations (no score, no request, not a
    failure: the same rule drops the same kind of text on both sides of the held-out test)."""


@dataclass
class DCQConfig(HeldoutConfig):
    """Parameters of the Data Contamination Quiz; defaults follow the paper (module docstring)."""

    seed: int = 0
    chat: bool = True  # quizzes (and judge prompts) through the model's chat template when it has one
    max_tokens: int = 5  # the paper: 1; the first option letter A-E of the reply is the answer
    positions: str = "all"  # BCQ positions: all four (default), or the non-preferred ones only (the authors' code)
    include_label: bool = True  # classification / NLI: a "Label: <label>" line, identical in every option
    judge: bool = False  # the judge engine writes the perturbations; else the offline synonym substitution
    self_judge: bool = False  # allow the target to write its own perturbations (labelled in the verdict)
    judge_max_tokens: int = 0  # 0: 4 options of twice the instance's words each, clipped to [64, 2048]
    judge_temperature: float = 0.0  # the authors sampled GPT-4 at 1.0; greedy here, for reproducible options
    swap_share: float = 0.5  # synonym substitution: each swappable word is swapped with this probability
    dataset_names: dict[str, str] = field(default_factory=dict)  # display names by benchmark (guided prompting's)
    name_split: bool = True  # the quiz names the split (the paper); false: the dataset only
    method_name: ClassVar[str] = NAME

    def __post_init__(self) -> None:
        super().__post_init__()
        self.dataset_names = dict(self.dataset_names or {})
        where = f"methods.{NAME}"
        if self.max_tokens < 1:
            raise ValueError(f"{where}.max_tokens must be >= 1 (the paper: 1), got {self.max_tokens}")
        if self.positions not in POSITION_MODES:
            raise ValueError(f"{where}.positions: {self.positions!r}; use one of {', '.join(POSITION_MODES)}")
        if self.judge_max_tokens < 0 or self.judge_temperature < 0:
            raise ValueError(f"{where}: judge_max_tokens (0 = derived) and judge_temperature must be >= 0")
        if not 0.0 < self.swap_share <= 1.0:
            raise ValueError(f"{where}.swap_share must be in (0, 1], got {self.swap_share}")


# ----------------------------------------------------------------------------- the instance and its options


@dataclass(frozen=True)
class Instance:
    """What one example's quizzes are built from."""

    text: str  # the part that is perturbed
    label_line: str  # appended unchanged to the original and every option ("" when none)
    dataset: str
    split: str

    @property
    def original(self) -> str:
        return self.text + self.label_line


def instance(record: Record, cfg: DCQConfig) -> Instance:
    """The record's instance text and label line; ValueError when it has no text."""
    text = record.input.strip()
    if not text:
        raise ValueError("field 'input' (the instance text) is empty; fix the benchmark adapter")
    label = record.label.strip()
    line = f"\nLabel: {label}" if cfg.include_label and record.task in LABEL_TASKS and label else ""
    dataset, split = dataset_and_split(record.partition, cfg.dataset_names, NAME)
    return Instance(text, line, dataset, split)


def _normalise(text: str) -> str:
    return " ".join(text.split())


def _rng(seed: int, record_id: str) -> np.random.Generator:
    digest = hashlib.blake2b(f"{seed}\x1fdcq\x1f{record_id}".encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


def _vowel(word: str) -> bool:
    return word[:1].lower() in "aeiou"


def _with_case(word: str, like: str) -> str:
    return word[:1].upper() + word[1:] if like[:1].isupper() else word


def swappable_words(text: str) -> list[tuple[int, int, tuple[str, ...]]]:
    """(start, end, synonyms) of the words ``synonym_perturbations`` may swap: table words in lower case, or
    capitalised at a sentence start (so names and acronyms stay); never words joined to digits or hyphens.
    Before "a"/"an" only synonyms of the same vowel/consonant class are kept (the article stays right)."""
    slots = []
    for m in _SWAPPABLE.finditer(text):
        word = m.group()
        low = word.lower()
        synonyms = SYNONYMS.get(low)
        if not synonyms:
            continue
        if word != low and not (word == low.capitalize() and _SENTENCE_START.search(text[: m.start()])):
            continue
        before = text[: m.start()].rstrip().rsplit(None, 1)
        if before and before[-1].lower() in ("a", "an"):
            synonyms = tuple(s for s in synonyms if _vowel(s) == _vowel(low))
        if synonyms:
            slots.append((m.start(), m.end(), synonyms))
    return slots


def synonym_perturbations(text: str, record_id: str, seed: int = 0, n: int = 4, swap_share: float = 0.5) -> list[str]:
    """``n`` distinct word-level perturbations of ``text``, none equal to it (module docstring), deterministic
    in (``seed``, ``record_id``); ``Filtered`` when the table offers fewer than ``n`` distinct ones."""
    slots = swappable_words(text)
    variants = math.prod(len(s) + 1 for _, _, s in slots) - 1
    if variants < n:
        words = ", ".join(repr(text[a:b]) for a, b, _ in slots) or "none"
        raise Filtered(
            f"only {variants} distinct word-level perturbation(s) from the offline synonym table (swappable words: "
            f"{words}); {n} are needed - too few table words in the text (set methods.{NAME}.judge=true for "
            "perturbations written by a judge model)"
        )
    rng = _rng(seed, record_id)
    seen, out = {_normalise(text)}, []
    for _ in range(500 * n):
        swap = rng.random(len(slots)) < swap_share
        if not swap.any():
            swap[int(rng.integers(len(slots)))] = True
        pieces, at = [], 0
        for (a, b, synonyms), on in zip(slots, swap):
            if on:
                pieces += [text[at:a], _with_case(synonyms[int(rng.integers(len(synonyms)))], text[a:b])]
                at = b
        option = "".join(pieces) + text[at:]
        if _normalise(option) not in seen:
            seen.add(_normalise(option))
            out.append(option)
            if len(out) == n:
                return out
    raise Filtered(f"could not draw {n} distinct perturbations in {500 * n} tries (raise swap_share)")


def parse_options(reply: str) -> list[str]:
    """The options A-D of a judge's reply laid out ``A)\\n...`` (the authors' parser); missing ones are ""."""
    chunks = _OPTION_SPLIT.split(reply)
    options = dict.fromkeys(POSITIONS, "")
    for i in range(1, len(chunks) - 1, 2):
        if not options[chunks[i]]:
            options[chunks[i]] = chunks[i + 1].strip().split("\n---", 1)[0].strip()
    return [options[p] for p in POSITIONS]


def check_options(options: Sequence[str], original: str) -> None:
    """ValueError unless there are four non-empty options, distinct, none equal to ``original`` (whitespace
    ignored)."""
    missing_ = [p for p, o in zip(POSITIONS, options) if not o.strip()]
    if missing_:
        raise ValueError(f"option(s) {', '.join(missing_)} missing or empty")
    norm = [_normalise(o) for o in options]
    if _normalise(original) in norm:
        raise ValueError(f"option {POSITIONS[norm.index(_normalise(original))]} repeats the instance")
    if len(set(norm)) < len(norm):
        raise ValueError("two options are identical")


# ----------------------------------------------------------------------------- quizzes and answers


def quiz_options(perturbations: Sequence[str], original: str, position: str | None) -> list[str]:
    """The options A-D of a quiz: the perturbations, with the original at ``position`` (a BCQ) or nowhere
    (``None``: the BDQ)."""
    options = list(perturbations)
    if position is not None:
        options[POSITIONS.index(position)] = original
    return options


def quiz_prompt(options: Sequence[str], dataset: str, split: str | None) -> str:
    """The quiz naming the dataset, and its split unless ``split`` is None (``name_split: false``)."""
    body = "\n\n".join(f"{p})\n{o}" for p, o in zip(POSITIONS, options))
    source = f"the {split} split of the {dataset} dataset" if split is not None else f"the {dataset} dataset"
    return QUIZ_PROMPT.format(source=source, options=body)


def parse_answer(reply: str) -> str:
    """The option letter A-E a reply chooses ("" when none): a leading letter ("C", "(c)", "Answer: C",
    "Option C"; not the article of "A scientist ..."), else the first "X)" or "option X" in it."""
    text = reply.strip()
    m = _ANSWER.match(text)
    article = m is not None and m.group(1) in "Aa" and re.match(r"\s+[A-Za-z]", text[m.end(1) :]) is not None
    if m and not article and (m.group(1).isupper() or len(text) <= 3 or m.start(1) > 0):
        return m.group(1).upper()
    for pattern in (_LETTER_PAREN, _LETTER_WORD):
        found = pattern.search(text)
        if found:
            return found.group(1).upper()
    return ""


def letter_counts(answers: Iterable[str]) -> dict[str, int]:
    """How often each letter A-E was chosen."""
    counts = Counter(a for a in answers if a)
    return {letter: int(counts.get(letter, 0)) for letter in LETTERS}


def non_preferred(bdq_counts: Mapping[str, int], n: int) -> list[str]:
    """Positions A-D the BDQ chose fewer than ``ceil(n / 5)`` times (below chance among five); all of A-D when
    none (the authors' ``calculate_non_preferred_options``)."""
    chance = math.ceil(n / 5)
    low = [p for p in POSITIONS if bdq_counts.get(p, 0) < chance]
    return low or list(POSITIONS)


def contamination_range(bcq_counts: Mapping[str, int], bdq_counts: Mapping[str, int], n: int) -> dict[str, Any]:
    """The paper's estimated contamination range of a partition of ``n`` examples, from the BCQ counts (times
    the original was chosen) of the positions quizzed and the BDQ counts (positional bias) of each letter.

    Positions sorted by most original choices, then least BDQ bias; upper = best / n; kappa = (best - bias) /
    (n - bias) at the best position; lower = max(kappa, second best / n). One position only (the authors' code
    crashes): lower = max(kappa, 0)."""
    if n <= 0 or not bcq_counts:
        return {"lower": None, "upper": None, "kappa": None, "best_position": None, "n": n}
    ranked = sorted(bcq_counts, key=lambda p: (-bcq_counts[p], bdq_counts.get(p, 0), p))
    best = ranked[0]
    count, bias = bcq_counts[best], bdq_counts.get(best, 0)
    kappa = (count - bias) / (n - bias) if n > bias else 0.0
    lower = max(kappa, bcq_counts[ranked[1]] / n) if len(ranked) > 1 else max(kappa, 0.0)
    return {"lower": lower, "upper": count / n, "kappa": kappa, "best_position": best, "n": n}


# ----------------------------------------------------------------------------- the method


def _key(record_id: str, kind: str) -> str:
    return f"{record_id}|{NAME}|{kind}"


def _bcq(position: str) -> str:
    return f"bcq_{position}"


@dataclass(frozen=True)
class _Quiz:
    instance: Instance
    perturbations: tuple[str, ...]
    perturbed_by: str


@register
class DCQ(HeldoutTest):
    """Data Contamination Quiz (Golchin & Surdeanu): how often the original is chosen among its perturbations."""

    name = NAME
    family = "closed"
    Config = DCQConfig
    engine_roles = ("target",)
    outputs = Outputs(
        score="score", score_label="share of bias-compensator quizzes where the original was chosen",
        membership="score",
    )  # fmt: skip
    applies: ClassVar[Applies] = Applies(min_rows=MIN_ROWS)
    tie_hint = "the original never chosen"

    def check_reference(self, cfg: DCQConfig, bench: BenchmarkFacts, reference: BenchmarkFacts) -> str | None:
        """The held-out test's checks, and in ``heldout`` mode the quiz's wording: it names the dataset and split
        (``name_split``, the paper), so a held-out from another split would be asked "an instance from the
        validation split" where the partition is asked "the test split" - the two sides answer different
        questions and are not exchangeable under the null."""
        problem = super().check_reference(cfg, bench, reference)
        if problem or cfg.mode != "heldout" or not cfg.name_split:
            return problem
        try:
            mine, theirs = (dataset_and_split(partition_of(b), cfg.dataset_names, NAME) for b in (bench, reference))
        except ValueError:  # an adapter the registry does not know: the loader names it when the run starts
            return None
        if mine == theirs:
            return None
        return (
            f"{NAME} names the dataset and split in every quiz: {bench.name} is asked for an instance from the "
            f"{mine[1]} split of {mine[0]}, its reference {reference.name} for one from the {theirs[1]} split of "
            f"{theirs[0]}, so the two sides answer different questions and the held-out test's null (the two "
            f"exchangeable) fails. Use a held-out of the same split (rows after the tested ones: "
            f"benchmarks.{reference.name}.offset with sample: first on both), or set methods.{NAME}.name_split: false "
            "to name only the dataset in both"
        )

    def engine_roles_for(self, cfg: DCQConfig) -> tuple[str, ...]:
        return ("target", "judge") if cfg.judge else ("target",)

    # -- per example

    def _instance(self, record: Record, cfg: DCQConfig) -> Instance:
        try:
            return instance(record, cfg)
        except ValueError as err:
            raise ValueError(f"{NAME}: record {record.id!r} of {record.partition!r}: {err}") from None

    def _quiz(self, record: Record, cfg: DCQConfig, outputs: Mapping[str, Output]) -> _Quiz:
        """The instance and its four perturbations; ValueError (with why) when there are none to use."""
        inst = self._instance(record, cfg)
        if cfg.judge:
            key = _key(record.id, "options")
            out = outputs.get(key)
            if out is None or out.error:
                raise ValueError(_failure(key, out))
            options = parse_options(out.text)
            try:
                check_options(options, inst.text)
            except ValueError as err:
                raise ValueError(f"the judge's options are unusable: {err}") from None
            return _Quiz(inst, tuple(o + inst.label_line for o in options), "judge")
        options = synonym_perturbations(inst.text, record.id, cfg.seed, len(POSITIONS), cfg.swap_share)
        return _Quiz(inst, tuple(o + inst.label_line for o in options), "synonyms")

    def requests(self, records: list[Record], cfg: DCQConfig, stage: int, outputs: dict[str, Output]) -> list[Request]:
        got = output_map(outputs or {})
        first = 1 if cfg.judge else 0  # the stage of the BDQ
        if cfg.judge and stage == 0:
            return self._judge_requests(records, cfg)
        if stage == first:
            positions = list(POSITIONS) if cfg.positions == "all" else []
            return self._quiz_requests(records, cfg, got, bdq=True, positions=positions, stage=stage)
        if stage == first + 1 and cfg.positions == "non_preferred":
            answered = [r for r in records if _ok(got.get(_key(r.id, "bdq")))]
            answers = [parse_answer(got[_key(r.id, "bdq")].text) for r in answered]
            positions = non_preferred(letter_counts(answers), len(answered))
            return self._quiz_requests(answered, cfg, got, bdq=False, positions=positions, stage=stage)
        return []

    def _judge_requests(self, records: list[Record], cfg: DCQConfig) -> list[Request]:
        out = []
        for record in records:
            try:
                inst = self._instance(record, cfg)
            except ValueError:
                continue  # an error row from score()
            words = len(inst.text.split())
            max_tokens = cfg.judge_max_tokens or int(min(2048, max(64, 4 * 2 * words + 32)))
            sampling = Sampling(max_tokens=max_tokens, temperature=cfg.judge_temperature, top_p=1.0, seed=cfg.seed)
            out.append(Request(_key(record.id, "options"), (record.id,), "generate",
                               OPTIONS_PROMPT.format(text=inst.text), sampling, engine="judge", stage=0,
                               chat=cfg.chat))  # fmt: skip
        return out

    def _quiz_requests(
        self, records: list[Record], cfg: DCQConfig, got: Mapping[str, Output], bdq: bool, positions: list[str],
        stage: int,
    ) -> list[Request]:  # fmt: skip
        sampling = Sampling(max_tokens=cfg.max_tokens, temperature=0.0, top_p=1.0, seed=cfg.seed)
        out = []
        for record in records:
            try:
                quiz = self._quiz(record, cfg, got)
            except ValueError:
                continue  # an error row from score()
            asks = ([("bdq", None)] if bdq else []) + [(_bcq(p), p) for p in positions]
            for kind, position in asks:
                options = quiz_options(quiz.perturbations, quiz.instance.original, position)
                text = quiz_prompt(options, quiz.instance.dataset, quiz.instance.split if cfg.name_split else None)
                out.append(Request(_key(record.id, kind), (record.id,), "generate", text, sampling, engine="target",
                                   stage=stage, chat=cfg.chat))  # fmt: skip
        return out

    def _score_one(self, record: Record, got: dict[str, Output], cfg: DCQConfig) -> dict[str, Any]:
        row: dict[str, Any] = {
            **unit_columns(record), "instance": "", **{f"perturbation_{i + 1}": "" for i in range(len(POSITIONS))},
            "perturbed_by": "", "bdq_reply": None, "bdq_answer": None, **{_bcq(p): None for p in POSITIONS}, "n_bcq": 0,
            "n_original": 0, "score": None, "filtered": "", "error": "",
        }  # fmt: skip
        quiz = built(row, lambda: self._quiz(record, cfg, got))
        if quiz is None:
            return row
        row.update(instance=quiz.instance.original, perturbed_by=quiz.perturbed_by,
                   **{f"perturbation_{i + 1}": o for i, o in enumerate(quiz.perturbations)})  # fmt: skip
        errors = []
        bdq = got.get(_key(record.id, "bdq"))
        if _ok(bdq):
            row["bdq_reply"], row["bdq_answer"] = bdq.text, parse_answer(bdq.text)
        else:
            errors.append(_failure(_key(record.id, "bdq"), bdq))
        asked = [p for p in POSITIONS if _key(record.id, _bcq(p)) in got]
        expected = list(POSITIONS) if cfg.positions == "all" else asked
        if not expected:
            errors.append("no bias-compensator quiz was answered")
        for position in expected:
            key = _key(record.id, _bcq(position))
            out = got.get(key)
            if _ok(out):
                row[_bcq(position)] = parse_answer(out.text)
            else:
                errors.append(_failure(key, out))
        if errors:
            row["error"] = "; ".join(errors)
            return row
        chosen = [row[_bcq(p)] == p for p in expected]
        row.update(n_bcq=len(chosen), n_original=sum(chosen), score=sum(chosen) / len(chosen))
        return row

    # -- the partition

    def reduce(self, table: Any, cfg: DCQConfig) -> Verdict:
        """The held-out test on ``score`` (``HeldoutTest``), with the paper's range of the partition (and of
        its reference) in ``details`` and the upper estimate as ``rate``."""
        rows = rows_of(table)
        verdict = super().reduce(rows, cfg)
        own = [r for r in rows if not truthy(r.get("is_reference"))]
        ref = [r for r in rows if truthy(r.get("is_reference"))]
        mine = quiz_summary(own, cfg)
        verdict.details["dcq"] = mine
        verdict.details["reference_dcq"] = quiz_summary(ref, cfg) if ref else None
        verdict.details["n_filtered"] = sum(bool(r.get("filtered")) for r in own)
        verdict.details["perturbed_by"] = sorted({str(r.get("perturbed_by")) for r in own if r.get("perturbed_by")})
        verdict.details["self_judged"] = bool(cfg.judge and cfg.self_judge)
        verdict.rate = mine["upper"]
        if mine["upper"] is None:
            line = "no scored rows"
        else:
            line = (f"original chosen in {mine['original_choice_rate']:.0%} of bias-compensator quizzes, "
                    f"paper's range [{mine['lower']:.0%}, {mine['upper']:.0%}] of {mine['n']}")  # fmt: skip
            theirs = verdict.details["reference_dcq"]
            if theirs and theirs["upper"] is not None:
                line += (f" vs {theirs['original_choice_rate']:.0%}, [{theirs['lower']:.0%}, {theirs['upper']:.0%}]"
                         f" of {theirs['n']} held-out")  # fmt: skip
        verdict.details["summary"] = f"{line}; " + verdict.details.get("summary", "")
        return verdict


def quiz_summary(rows: list[dict[str, Any]], cfg: DCQConfig) -> dict[str, Any]:
    """The paper's numbers of one partition's rows: BDQ letter counts, non-preferred positions, BCQ counts
    (per quizzed position, each letter chosen), the contamination range, and the mean ``score``."""
    scored = [r for r in rows if not row_failed(r) and finite(r.get("score")) is not None]
    n = len(scored)
    bdq = letter_counts(str(r.get("bdq_answer") or "") for r in scored)
    quizzed = [p for p in POSITIONS if any(not missing(r.get(_bcq(p))) for r in scored)]
    bcq = {p: letter_counts(str(r.get(_bcq(p)) or "") for r in scored) for p in quizzed}
    positions = non_preferred(bdq, n) if cfg.positions == "all" else quizzed
    positions = [p for p in positions if p in bcq]
    estimate = contamination_range({p: bcq[p][p] for p in positions}, bdq, n)
    unparsed = sum(not r.get("bdq_answer") for r in scored) + sum(
        not missing(r.get(_bcq(p))) and not r.get(_bcq(p)) for r in scored for p in quizzed
    )
    return {
        **estimate,
        "original_choice_rate": float(np.mean([float(r["score"]) for r in scored])) if scored else None,
        "bdq_counts": bdq,
        "non_preferred": positions,
        "bcq_counts": bcq,
        "original_counts": {p: bcq[p][p] for p in quizzed},
        "n_unparsed": int(unparsed),
    }


def _ok(output: Output | None) -> bool:
    """An answer to read: present, no error, and the whole prompt read (no tokens cut by the context)."""
    return output is not None and not output.error and not output.truncated


def _failure(key: str, output: Output | None) -> str:
    if output is None:
        return f"request {key!r} failed: no output"
    if output.error:
        return f"request {key!r} failed: {output.error}"
    return (
        f"request {key!r}: the quiz prompt is longer than the model's context ({output.truncated} tokens cut), so "
        "the model did not see every option"
    )
