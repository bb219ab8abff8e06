"""Name cloze: Chang, Cramer, Soni and Bamman, "Speak, Memory: An Archaeology of Books Known to ChatGPT/GPT-4"
(EMNLP 2023, arXiv:2305.00118), for passage-style benchmarks (XSum articles, SAMSum dialogues, IMDB reviews).

Idea: a short passage of the benchmark holds one proper name; the name is replaced by ``[MASK]`` and the model
is asked which name it was. The passage is chosen so that nothing in it gives the name away (it occurs once, so
the answer is nowhere in sight, and a name is arbitrary: grammar and topic do not predict "Knezovich"), so a
model that fills it in exactly has most likely read the passage. Chang et al. built 100 such passages per book
(40-60 tokens, exactly one person name of one word, no other named entity; names found with BookNLP), prompted
chat models to answer "exactly one word long", with two worked examples and the answer between ``<name>`` tags,
and scored exact match of the name; name-cloze accuracy tracked how often a book's passages occur on the web.

Here (``NameCloze``): the passage is the record's ``field`` (``input``: the XSum ``document``, the SAMSum
``dialogue``, the IMDB ``text``); the masked name is chosen by a documented capitalisation heuristic
(``name_words``: no NER model installs offline here) - a capitalised word that is not at a sentence start, not
on the lists of capitalised non-names, occurs exactly once in the passage and is not a dialogue speaker label,
the one with most evidence of being a person's name first (a title, role word, speech verb or apposition next
to it: 2; a full name of two to four capitalised words: 1; a lone word: 0; ``min_evidence`` drops weaker
ones). Long passages are cut to ``window_words`` = 50 whitespace-separated words around the mask (about the
paper's 40-60 tokens; centred, then opened at the first sentence start before the name; 0 keeps the whole
passage). The prompt (``PROMPT``) is this project's wording, modelled on the paper's: it says the passage may
have been seen in training, that one word - a proper name, not a pronoun or any other word - was masked, asks
for a guess even when unsure, and gives one invented example with its answer between ``<name>`` and
``</name>``. Per example: ``exact_match`` (1/0) of the parsed answer with the
name, normalised (case, punctuation, a possessive ``'s``). Records without a maskable name are filtered (no
request, no score: a ``filtered`` reason).

Where this departs from the paper, and why:

- **the name finder is a heuristic, not NER** (``name_words`` docstring lists its weaknesses): it finds proper
  nouns, of which only the evidence-2 ones are mostly people; places, brands and teams that occur once are
  masked too unless ``min_evidence`` is raised (2 keeps the title / role / speech-verb cases: about 70 % of
  mirrored XSum rows, 1 % of SAMSum). The ``evidence`` column says which kind each row masked. The paper's
  prompt also asks for "the proper name", not specifically a person's;
- **other named entities stay in the passage** (the paper keeps only passages with none): the heuristic cannot
  tell them apart reliably, and news and dialogue passages without any other capitalised word are rare; the
  rest of a full name can stay too (``[MASK] Williams`` when "Williams" occurs elsewhere is not masked but
  "Stephen" is). Context can therefore help a guess more than in the paper - which is why the decision
  compares with a held-out partition of the same benchmark rather than reading the accuracy alone;
- one passage per record (the paper: 100 sampled passages per book), the name with most evidence, the first on
  ties: deterministic, no seed; SAMSum speaker labels ("Amanda:") are never masked (turn-taking gives them
  away) but count as occurrences, so only names mentioned in the dialogue are masked: 38 % of mirrored SAMSum
  rows have one (most dialogues name only their speakers);
- one invented example instead of the paper's two taken from novels (a passage of a real text in the prompt
  could itself be a benchmark passage); the prompt goes through the model's chat template when it has one
  (``chat``; the paper prompted ChatGPT and GPT-4); greedy decoding;
- answers are parsed: the text between ``<name>`` and ``</name>`` (or after ``<name>`` when the reply is cut),
  else the reply without an "Answer:" / "The name is" label; its first word that is not an article. Small
  models seldom answer in the format, so ``in_reply`` (the name anywhere in the reply, as a whole word) is
  reported and tested beside exact match (``details["by_column"]``), never deciding. Measured
  (``tests/test_name_cloze.py``, 2026-11-24): the embedded SmolLM2-135M fine-tuned on 20 XSum windows of 50 words
  completes the seen windows' text up to the name with the name for 17 of 20 (unseen: 0 of 20), yet scores
  0 of 20 on the name cloze for seen and unseen alike (``in_reply`` 0 vs 0; with ``chat: false`` too): it
  recites seen passages or answers "The correct answer is:". The protocol needs a model that follows the
  instruction (the paper: ChatGPT, GPT-4); on one that does not, ``clean`` is a false negative.

Partition decision (``reduce``, shared with TS-Guessing and the membership scores: ``heldout_test.HeldoutTest``):
an accuracy means little alone - how guessable a masked name is depends on the benchmark (a famous footballer in
a sports report, an unknown first name in a chat) - so the partition's per-example exact matches are compared
with those of a *held-out partition of the same benchmark known unseen* (``reference``, ``mode: heldout``) by a
one-sided Mann-Whitney U test over sampling units (``units``). Null: the partition and the held-out are
exchangeable draws and neither was seen, so their exact matches are exchangeable. ``rate`` is the partition's
name-cloze accuracy (``details``: the held-out's, ``in_reply`` rates, filtered rows, evidence-2 share).
``inconclusive`` without a reference, with fewer than 10 scored rows a side, or when no ranking of the units
could reach ``alpha``.

Per example: ``exact_match`` (1/0; the score the report plots and the membership score), ``masked`` (the name),
``evidence`` (0-2), ``masked_passage`` (the window shown), ``answer`` (parsed from ``completion``),
``in_reply``, ``filtered``, ``error``. Requests: stage 0, one greedy generation per kept example, key
``"<record id>|name_cloze"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from contamray.methods.base import Applies, Output, Outputs, Verdict, register
from contamray.methods.closed import cell_rows
from contamray.methods.closed.cell_rows import built, finite, rows_of
from contamray.methods.closed.greedy_probe import GreedyProbe
from contamray.methods.closed.heldout_test import MIN_ROWS, HeldoutConfig, split_sides, unit_columns
from contamray.methods.closed.name_words import Cloze, cloze
from contamray.methods.closed.ts_guessing import exact_match, in_reply
from contamray.records import Record

MASK = "[MASK]"
# This project's wording, modelled on Chang et al. (2023, section 3); the example passage is invented.
PROMPT = (
    "The passage below may come from a text you saw during training. One word in it, a proper name, has been "
    "replaced by [MASK]. Which name was it? The name is a single word and a proper name: not a pronoun and not "
    "any other kind of word. Give your best guess even if you are not sure, written as <name>...</name>.\n\n"
    "Example passage: When the last ferry finally docked, [MASK] was already waiting on the pier with two "
    "tickets and a thermos of tea.\n"
    "Example answer: <name>Odile</name>\n\n"
    "Passage: {passage}\n"
    "Answer:"
)
FIELDS = ("input", "label", "reference", "prefix", "verbalized")
# passage-style tasks: articles (XSum), dialogues (SAMSum), reviews and news (IMDB, Yelp, AG News)
PASSAGE_TASKS = ("summarization", "one_sentence_summary", "classification")

_TAG = re.compile(r"<\s*name\s*>\s*(.*?)\s*(?:<\s*/\s*name\s*>|$)", re.IGNORECASE | re.DOTALL)
_LABEL = re.compile(
    r"^\s*(?:(?:example\s+)?(?:output|answer|reply|name)\s*[:\-]|the\s+(?:proper\s+)?name\s+(?:is|was)\b"
    r"|it\s+(?:is|was)\b|it['’]s\b)\s*",
    re.IGNORECASE,
)
_NAME_TOKEN = re.compile(r"[^\W\d_]+(?:['’\-][^\W\d_]+)*")
_SKIP = frozenset({"a", "an", "the", "name", "mask", "proper"})


@dataclass
class NameClozeConfig(HeldoutConfig):
    """Name cloze; defaults follow the paper where it says (module docstring)."""

    seed: int = 0
    chat: bool = True  # the prompt through the model's chat template when it has one (the paper: chat models)
    max_tokens: int = 16  # the reply is one name
    field: str = "input"  # the Record field holding the passage
    window_words: int = 50  # words shown around the mask (the paper: 40-60-token passages); 0 = the whole passage
    min_evidence: int = 0  # person evidence a masked name needs: 0 any proper name, 1 full names, 2 title/role/said
    min_len: int = 2  # letters a maskable name has at least
    method_name: ClassVar[str] = "name_cloze"

    def __post_init__(self) -> None:
        super().__post_init__()
        where = f"methods.{self.method_name}"
        if self.max_tokens < 1:
            raise ValueError(f"{where}.max_tokens must be >= 1, got {self.max_tokens}")
        if self.field not in FIELDS:
            raise ValueError(
                f"{where}.field: {self.field!r} is not a Record text field; use one of {', '.join(FIELDS)}"
            )
        if self.window_words < 0:
            raise ValueError(f"{where}.window_words must be >= 0 (0: the whole passage), got {self.window_words}")
        if self.min_evidence not in (0, 1, 2):
            raise ValueError(
                f"{where}.min_evidence must be 0 (any proper name), 1 (full names) or 2 (a title, role word or "
                f"speech verb next to it), got {self.min_evidence}"
            )
        if self.min_len < 1:
            raise ValueError(f"{where}.min_len must be >= 1, got {self.min_len}")


class Filtered(cell_rows.Filtered):
    """The record has no maskable name (not a failure: no score, no request)."""


# ----------------------------------------------------------------------------- text


def parse_name(reply: str) -> str:
    """The name in ``reply``: inside ``<name>...</name>`` when present, else after an "Answer:" / "The name is"
    label; its first word that is not an article (possessive ``'s`` dropped); "" when none."""
    found = _TAG.search(reply)
    text = found.group(1) if found else reply
    before = None
    while before != text:
        before, text = text, _LABEL.sub("", text, count=1)
    for token in _NAME_TOKEN.findall(text):
        token = re.sub(r"['’][sS]$", "", token)
        if token and token.lower() not in _SKIP:
            return token
    return ""


def probe(record: Record, cfg: NameClozeConfig) -> Cloze:
    """The masked window of the record's passage; Filtered when it has no maskable name."""
    passage = str(getattr(record, cfg.field) or "")
    if not passage.strip():
        raise ValueError(f"field {cfg.field!r} (the passage) is empty; set methods.name_cloze.field or fix the adapter")
    try:
        return cloze(passage, cfg.window_words, cfg.min_len, cfg.min_evidence, MASK)
    except ValueError as err:
        raise Filtered(str(err)) from None


# ----------------------------------------------------------------------------- the method


@register
class NameCloze(GreedyProbe):
    """Name cloze: mask a proper name that occurs once in a passage, ask for it (Chang et al. 2023)."""

    name = "name_cloze"
    family = "closed"
    Config = NameClozeConfig
    engine_roles = ("target",)
    outputs = Outputs(
        score="exact_match", score_label="masked name guessed exactly (1) or not (0)", membership="exact_match"
    )
    applies: ClassVar[Applies] = Applies(tasks=PASSAGE_TASKS, min_rows=MIN_ROWS)
    tie_hint = "no masked name guessed"

    def probe(self, record: Record, cfg: NameClozeConfig) -> Cloze:
        return probe(record, cfg)

    def prompt(self, probe: Cloze, cfg: NameClozeConfig) -> str:
        return PROMPT.format(passage=probe.text)

    def _score_one(self, record: Record, got: dict[str, Output], cfg: NameClozeConfig) -> dict[str, Any]:
        row: dict[str, Any] = {**unit_columns(record), "masked": "", "evidence": None, "masked_passage": "",
                               "completion": "", "answer": "", "exact_match": None, "in_reply": None,
                               "filtered": "", "error": ""}  # fmt: skip
        masked = built(row, lambda: self._probe(record, cfg))
        if masked is None:
            return row
        row.update(masked=masked.name.word, evidence=masked.name.evidence, masked_passage=masked.text)
        output = self.reply(record, got, row)
        if output is None:
            return row
        answer = parse_name(output.text)
        row.update(
            completion=output.text,
            answer=answer,
            exact_match=float(exact_match(answer, masked.name.word)),
            in_reply=float(in_reply(masked.name.word, output.text)),
        )
        return row

    def score_columns(self, cfg: NameClozeConfig) -> list[str]:
        """Tested beside ``exact_match`` in ``details["by_column"]`` (never deciding)."""
        return ["in_reply"]

    rate_label: ClassVar[str] = "name cloze accuracy"

    def reduce(self, table: Any, cfg: NameClozeConfig) -> Verdict:
        """The held-out test on ``exact_match`` (``GreedyProbe``: the name-cloze accuracies as ``rate``), and the
        share of masked names with person evidence."""
        rows = rows_of(table)
        verdict = super().reduce(rows, cfg)
        own, _ = split_sides(rows)
        masked = [finite(r.get("evidence")) for r in own if not r.get("filtered")]
        masked = [e for e in masked if e is not None]
        verdict.details["person_evidence_share"] = (sum(e >= 2 for e in masked) / len(masked)) if masked else None
        return verdict
