"""Held-out accuracy gap: does the model answer a partition's questions better than a held-out of the same benchmark?

Paper: Zhang et al. 2024, "A Careful Examination of Large Language Model Performance on Grade School Arithmetic"
(arXiv:2405.00332, NeurIPS 2024 Datasets and Benchmarks). They wrote GSM1k, a held-out set drawn like GSM8K, and
read contamination (overfitting) in the gap between a model's accuracy on the public benchmark and on the held-out
one: a model that learned the benchmark's items does better on them than on unseen items of the same kind (up to
13 points for some families). Li et al. 2023's clean-vs-dirty evaluation (``clean_dirty_eval``) reads the same
gap between the parts of one split that an open-data scan found and did not find; here the unseen side is a
held-out partition of the same benchmark (``reference``), so no corpus is needed.

The gap shows in the format the model learned the answers in, and is small on a small model. Measured
(2026-11-28) on the embedded model fine-tuned as a chat model on ARC-Challenge rows 0-59 (its chat template, the
question with lettered options and an instruction, the reply "C. <option>", the prompt masked from the loss, 3
epochs among 90 other instructions), against rows 200-259 (8 vs 8 blocks of consecutive rows): the default (the
harness's prompt, options as continuations) gave accuracy 0.35 vs 0.25, p = 0.22, and ``chat: true`` with that
prompt 0.25 vs 0.17, p = 0.32 - missed; ``chat: true`` with ``template: "{input}\n{choices}"`` and ``answer:
letter_option`` (the model's own format, no instruction) 0.57 vs 0.30, p = 7.8e-5 (the accuracy test p = 0.0022):
contaminated, while rows 300-359 against 400-459 stayed clean (0.17 vs 0.27, p = 0.98). Min-K% flagged that model (p =
0.0035), the other membership scores did not. When the training format is not known - a run's default
(``conf/method/heldout_accuracy.yaml``; this Config's own default, for a caller of the library, is the harness's raw
prompt) -, ``chat: both`` asks the raw and the chat form and decides by one joint test of the two (``prompt_forms``):
on the embedded model fine-tuned on 16 ARC rows written as conversations in its chat template
(``tests/test_heldout_accuracy.py``), the raw form missed them (p = 0.17) and the chat form found them (p = 2.2e-5;
combined 4.3e-5), an unseen pair staying clean.

Per example, as lm-evaluation-harness scores multiple choice (and ``clean_dirty_eval``): each option is scored as a
continuation of the prompt (``template``, default ``"Question: {input}\\nAnswer:"``, the option after a space); its
log-likelihood per token is the mean log-probability of its tokens given the prompt; the prediction is the option
with the highest (the lowest perplexity). Other formats: ``{choices}`` in the template lists the options as
``A. <option>`` lines, ``answer`` writes each continuation as the option (``option``), its letter (``letter``, the
harness's MMLU form) or both (``letter_option``), after ``separator`` (default a space). An instruct model's
format is ``chat: true``: the filled template is one user turn in the model's own chat template with the
assistant's generation prompt, rendered by the engine (``Request.chat``; over HTTP by the server's ``/tokenize``),
and each answer is the assistant's reply right after it (no separator by default) - lm-evaluation-harness's
``--apply_chat_template``. (The markup may also be written into the template by hand: the engines read special
tokens in text.) Columns: ``correct`` (1/0), ``gold_margin`` = the gold option's mean
token log-probability minus the best other option's (> 0 exactly when the prediction is correct: the accuracy's
per-example form, with the model's confidence kept), ``perplexities``, ``prediction`` and ``gold``.

Partition decision (``heldout_test.HeldoutTest``, as the membership scores): ``gold_margin`` of the partition
against that of a held-out partition of the same benchmark known unseen, one-sided Mann-Whitney U over sampling
units (H1: the partition's answers are surer). **Null**: the partition and the held-out are exchangeable draws of
one benchmark, neither seen by the model; it holds for a random held-out of the same split however easy the
benchmark is, and fails for another benchmark (``mode: distribution`` labels such a comparison). The paper
compares accuracies; the decision here ranks the margins, whose sign is correctness, so a 0/1 score's ties do
not waste the rows (the accuracy test is reported beside: ``details.by_column.correct``; the accuracies are the
verdict's ``rate`` and ``details.reference_rate``). ``inconclusive`` as every held-out test (too few rows or
units, no reference, every margin tied). Applies to multiple-choice benchmarks (``applies.needs_choices``).

Parameters (``conf/method/heldout_accuracy.yaml``): ``template``, ``answer``, ``separator`` and ``chat`` (the format);
``reference``, ``mode``, ``alpha``, ``units`` and ``block_rows`` of the held-out test (``HeldoutConfig``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from contamray.methods.base import Applies, Output, Outputs, Request, register
from contamray.methods.closed.clean_dirty_eval import answered, option_requests
from contamray.methods.closed.heldout_test import MIN_ROWS, HeldoutConfig, HeldoutTest, unit_columns
from contamray.methods.closed.prompt_forms import BOTH, TwoPromptForms, chat_column, chat_option, prompt_forms
from contamray.records import Record

NAME = "heldout_accuracy"
ANSWERS = {"option": "{option}", "letter": "{letter}", "letter_option": "{letter}. {option}"}


@dataclass
class HeldoutAccuracyConfig(HeldoutConfig):
    """How each option is asked (``template`` with ``{input}``, the question, and optionally ``{choices}``, the options
    one per line as ``A. <option>``; each answer written as ``answer`` after ``separator``: by default a space, or
    nothing with ``chat``, where the prompt is a user turn in the model's chat template and the answer its reply;
    ``chat: both`` asks both forms, ``prompt_forms``) and the held-out test's parameters."""

    template: str = "Question: {input}\nAnswer:"
    answer: str = "option"
    separator: str | None = None
    chat: bool | str = False  # a run's default is both (conf/method/heldout_accuracy.yaml)
    method_name: ClassVar[str] = NAME

    def __post_init__(self) -> None:
        where = f"methods.{NAME}"
        self.chat = chat_option(self.chat, where)
        if "{input}" not in self.template:
            raise ValueError(f"{where}.template={self.template!r} has no {{input}} placeholder for the question")
        if self.answer not in ANSWERS:
            raise ValueError(
                f"{where}.answer: {self.answer!r} is not one of {', '.join(ANSWERS)} (option: the option's text; "
                "letter: its letter, with the options listed by {choices} in the template; letter_option: 'C. <text>')"
            )
        super().__post_init__()


def letters(record: Record) -> list[str]:
    """The options' letters: the dataset's own (``meta.choice_labels``, e.g. ARC's), else A, B, C..."""
    own = [str(x) for x in record.meta.get("choice_labels") or []]
    return own if len(own) == len(record.choices) else [chr(ord("A") + k) for k in range(len(record.choices))]


def prompt_and_answers(record: Record, cfg: HeldoutAccuracyConfig, chat: bool) -> tuple[str, list[str]]:
    """The prompt (``template`` filled) and each option's continuation (``separator`` + ``answer`` filled) in one
    prompt form (``chat``: the answer is the reply to a chat turn, after no separator by default)."""
    marks = letters(record)
    listed = "\n".join(f"{m}. {c}" for m, c in zip(marks, record.choices, strict=True))
    text = cfg.template.replace("{choices}", listed).replace("{input}", record.input)
    form = ANSWERS[cfg.answer]
    before = cfg.separator if cfg.separator is not None else ("" if chat else " ")
    return text, [before + form.replace("{letter}", m).replace("{option}", c)
                  for m, c in zip(marks, record.choices, strict=True)]  # fmt: skip


def gold_margin(perplexities: list[float], gold: int) -> float:
    """The gold option's mean token log-probability minus the best other option's (from their perplexities)."""
    logp = [-math.log(p) for p in perplexities]
    return logp[gold] - max(v for k, v in enumerate(logp) if k != gold)


@register
class HeldoutAccuracy(TwoPromptForms, HeldoutTest):
    """Registered as ``heldout_accuracy`` (family ``closed``; multiple choice; needs a held-out ``reference``)."""

    name = NAME
    Config = HeldoutAccuracyConfig
    engine_roles: ClassVar[tuple[str, ...]] = ("target",)
    scores_text: ClassVar[bool] = True
    applies: ClassVar[Applies] = Applies(needs_choices=True, min_rows=MIN_ROWS)
    outputs = Outputs(
        score="gold_margin",
        score_label="gold option's mean token log-probability minus the best other option's (> 0: answered right)",
        membership="gold_margin",
    )
    tie_hint: ClassVar[str] = "one margin for every unit"
    rate_column: ClassVar[str | None] = "correct"  # the accuracies: the verdict's rate and details.reference_rate

    def requests(
        self, records: list[Record], cfg: HeldoutAccuracyConfig, stage: int, outputs: dict[str, Output]
    ) -> list[Request]:
        """Stage 0: the prompt (raw form only), and the prompt followed by each option, in each prompt form
        (multiple-choice records only)."""
        if stage > 0:
            return []
        return [
            r
            for record in records
            if len(record.choices) >= 2
            for tag, chat in prompt_forms(cfg.chat)
            for r in option_requests(record, *prompt_and_answers(record, cfg, chat), chat=chat, tag=tag)
        ]

    def _score_one(self, record: Record, got: dict[str, Output], cfg: HeldoutAccuracyConfig) -> dict[str, Any]:
        row: dict[str, Any] = {**unit_columns(record), "gold_margin": None, "correct": None, "error": ""}
        for tag, chat in prompt_forms(cfg.chat):
            answer = answered(record, got, "the held-out accuracy gap", tag, chat)
            if answer.get("error"):
                return {**row, "error": answer["error"]}
            margin = gold_margin(answer["perplexities"], answer["gold"])
            answer.update(correct=float(answer["correct"]), gold_margin=margin)
            row.update({chat_column(k) if tag and k != "gold" else k: v for k, v in answer.items()})
        return row

    def score_columns(self, cfg: Any) -> list[str]:
        """Tested beside ``gold_margin`` in ``details["by_column"]`` (never deciding alone): the accuracy itself, and
        under ``chat: both`` the chat form's margin and accuracy."""
        return ["correct"] + ([chat_column("gold_margin"), chat_column("correct")] if cfg.chat == BOTH else [])

