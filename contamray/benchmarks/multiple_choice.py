"""Multiple-choice benchmarks: the Open LLM Leaderboard v1's ARC Challenge, HellaSwag, MMLU and
TruthfulQA MC, and the Chinese C-Eval.

``input`` is the question stem (HellaSwag: the context ``ctx``; the mirror lacks ``ctx_a``/``ctx_b``),
``choices`` the options, ``answer`` the gold key as the dataset stores it (ARC: a letter or digit
from ``choices.label``; MMLU/HellaSwag/TruthfulQA: a 0-based index as text), ``label`` the gold
option's text. Guided prompting's ``reference`` is the question text (the model must reproduce the rest
of the question). ``verbalized`` (Li et al. 2023) is the question followed by the correct option; for
HellaSwag that is the context completed by its correct ending.

HellaSwag's runs: the file keeps the items of one activity together (ActivityNet Captions gives several
consecutive segments of one video), and inside a run a row's context usually goes on from the row before:
on the 4,113 validation rows, 1,182 of the 1,476 adjacent pairs of one ``activity_label`` carry the first
row's correct ending inside the second row's ``ctx``, and none of the 2,636 adjacent pairs of two activities
do. Any model prefers such rows in canonical order, so a run is declared as Winogrande declares its twins:
``meta["group"]`` is the id of the run's first row (``activity_runs``; 2,637 runs, 1.56 rows on average, at
most 8), computed over the whole split so that it is the same whichever rows are sampled. The sharded
likelihood test permutes the runs, not the rows (``methods/closed/order_structure.py``).

C-Eval (Huang et al. 2023, "C-Eval: A Multi-Level Multi-Discipline Chinese Evaluation Suite for
Foundation Models"; hub ``ceval/ceval-exam``): one config per subject (52, e.g.
``computer_network``), splits ``dev`` (5 per subject, with an ``explanation``), ``val`` (labelled, the
default) and ``test`` (published without answers: its ``answer`` is empty, so records have no label).
Columns ``id``, ``question``, ``A`` .. ``D``, ``answer`` (a letter), ``explanation``. The text is
Chinese, written without spaces: the open-data n-gram methods read it a character a word
(``contamray.metrics.ngrams``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contamray.benchmarks.base import Adapter, RowContext, append
from contamray.records import Record

MMLU_SUBJECTS = (
    "abstract_algebra", "anatomy", "astronomy", "business_ethics", "clinical_knowledge",
    "college_biology", "college_chemistry", "college_computer_science", "college_mathematics",
    "college_medicine", "college_physics", "computer_security", "conceptual_physics", "econometrics",
    "electrical_engineering", "elementary_mathematics", "formal_logic", "global_facts",
    "high_school_biology", "high_school_chemistry", "high_school_computer_science",
    "high_school_european_history", "high_school_geography", "high_school_government_and_politics",
    "high_school_macroeconomics", "high_school_mathematics", "high_school_microeconomics",
    "high_school_physics", "high_school_psychology", "high_school_statistics", "high_school_us_history",
    "high_school_world_history", "human_aging", "human_sexuality", "international_law", "jurisprudence",
    "logical_fallacies", "machine_learning", "management", "marketing", "medical_genetics",
    "miscellaneous", "moral_disputes", "moral_scenarios", "nutrition", "philosophy", "prehistory",
    "professional_accounting", "professional_law", "professional_medicine", "professional_psychology",
    "public_relations", "security_studies", "sociology", "us_foreign_policy", "virology",
    "world_religions",
)  # fmt: skip


CEVAL_SUBJECTS = (
    "accountant", "advanced_mathematics", "art_studies", "basic_medicine", "business_administration",
    "chinese_language_and_literature", "civil_servant", "clinical_medicine", "college_chemistry",
    "college_economics", "college_physics", "college_programming", "computer_architecture",
    "computer_network", "discrete_mathematics", "education_science", "electrical_engineer",
    "environmental_impact_assessment_engineer", "fire_engineer", "high_school_biology",
    "high_school_chemistry", "high_school_chinese", "high_school_geography", "high_school_history",
    "high_school_mathematics", "high_school_physics", "high_school_politics",
    "ideological_and_moral_cultivation", "law", "legal_professional", "logic", "mao_zedong_thought",
    "marxism", "metrology_engineer", "middle_school_biology", "middle_school_chemistry",
    "middle_school_geography", "middle_school_history", "middle_school_mathematics",
    "middle_school_physics", "middle_school_politics", "modern_chinese_history", "operating_system",
    "physician", "plant_protection", "probability_and_statistics", "professional_tour_guide",
    "sports_science", "tax_accountant", "teacher_qualification", "urban_and_rural_planner",
    "veterinary_medicine",
)  # fmt: skip
CEVAL_KEYS = ("A", "B", "C", "D")


def _mc_record(
    ctx: RowContext,
    question: str,
    choices: tuple[str, ...],
    key: int | None,
    answer: str,
    meta: dict | None = None,
) -> Record:
    label = "" if key is None else choices[key]
    return ctx.record(
        input=question,
        label=label,
        reference=question,
        prefix="",
        choices=choices,
        answer=answer,
        verbalized=append(question, label),
        meta=meta or {},
    )


def arc(ctx: RowContext) -> Record:
    question = ctx.text("question")
    texts = ctx.texts("choices.text", min_count=2)
    keys = ctx.texts("choices.label", min_count=2)
    if len(keys) != len(texts):
        ctx.fail("choices.label", f"has {len(keys)} keys for {len(texts)} options in choices.text")
    answer = ctx.text("answerKey").strip()
    if answer not in keys:
        ctx.fail("answerKey", f"is {answer!r}, not one of the option keys {list(keys)}")
    return _mc_record(ctx, question, texts, keys.index(answer), answer, {"choice_labels": list(keys)})


def hellaswag(ctx: RowContext) -> Record:
    context = ctx.text("ctx")
    endings = ctx.texts("endings", min_count=2)
    key = ctx.index("label", len(endings))
    meta = {"activity_label": ctx.row["activity_label"]} if ctx.row.get("activity_label") else {}
    return _mc_record(ctx, context, endings, key, "" if key is None else str(key), meta)


def activity_runs(columns: Mapping[str, list[Any]], partition: str) -> list[dict[str, Any]]:
    """HellaSwag: each maximal run of adjacent rows with one ``activity_label`` is a group, its id the run's first
    row (a row without a label is its own group); see the module doc."""
    labels = columns["activity_label"]
    out: list[dict[str, Any]] = []
    group = ""
    for i, label in enumerate(labels):
        if i == 0 or not label or label != labels[i - 1]:
            group = f"{partition}#{i}"
        out.append({"group": group})
    return out


def mmlu(ctx: RowContext) -> Record:
    question = ctx.text("question")
    choices = ctx.texts("choices", min_count=2)
    key = ctx.index("answer", len(choices))
    meta = {"subject": ctx.row["subject"]} if ctx.row.get("subject") else {}
    return _mc_record(ctx, question, choices, key, str(key), meta)


def truthfulqa_mc(ctx: RowContext) -> Record:
    """MC1 (one true option) is the record's choices; MC2's options and 0/1 labels go to ``meta``."""
    question = ctx.text("question")
    choices = ctx.texts("mc1_targets.choices", min_count=2)
    labels = list(ctx.value("mc1_targets.labels"))
    well_formed = all(type(x) is int and x in (0, 1) for x in labels) and labels.count(1) == 1
    if len(labels) != len(choices) or not well_formed:
        ctx.fail("mc1_targets.labels", f"is {labels}; expected one 1 and a 0 per other option")
    meta = {}
    mc2 = ctx.row.get("mc2_targets")
    if isinstance(mc2, dict) and mc2.get("choices"):
        meta = {"mc2_choices": list(mc2["choices"]), "mc2_labels": list(mc2.get("labels") or [])}
    key = labels.index(1)
    return _mc_record(ctx, question, choices, key, str(key), meta)


def ceval(ctx: RowContext) -> Record:
    """Options from the columns ``A`` .. ``D``; ``answer`` is the gold letter (empty in ``test``)."""
    question = ctx.text("question")
    choices = tuple(ctx.text(key) for key in CEVAL_KEYS)
    raw = ctx.row.get("answer")
    if not ctx.labeled and (raw is None or (isinstance(raw, str) and not raw.strip())):
        key, answer = None, ""
    else:
        answer = ctx.text("answer").strip().upper()
        if answer not in CEVAL_KEYS:
            ctx.fail("answer", f"is {raw!r}, not one of the option letters {', '.join(CEVAL_KEYS)}")
        key = CEVAL_KEYS.index(answer)
    meta = {"subject": ctx.config, "choice_labels": list(CEVAL_KEYS)}
    explanation = ctx.row.get("explanation")
    if isinstance(explanation, str) and explanation.strip():
        meta["explanation"] = explanation
    return _mc_record(ctx, question, choices, key, answer, meta)


ADAPTERS = (
    Adapter(
        name="arc_challenge",
        hub_id="allenai/ai2_arc",
        config="ARC-Challenge",
        splits=("train", "validation", "test"),
        default_split="test",
        task="multiple_choice",
        convert=arc,
        id_field="id",
    ),
    Adapter(
        name="hellaswag",
        hub_id="Rowan/hellaswag",
        config="default",
        splits=("train", "validation", "test"),
        default_split="validation",
        task="multiple_choice",
        convert=hellaswag,
        id_field="ind",
        unlabeled_splits=("test",),
        group_columns=("activity_label",),
        groups=activity_runs,
        # a run's rows for plan-time checks: the typical run (sizes in the module docstring), not the longest (8),
        # which would ask a plan for four times the rows it needs
        group_rows=2,
        note="mirror lacks ctx_a/ctx_b: ctx is used",
    ),
    Adapter(
        name="mmlu",
        hub_id="cais/mmlu",
        config="all",
        configs=("all", *MMLU_SUBJECTS),
        splits=("test", "validation", "dev"),
        default_split="test",
        task="multiple_choice",
        convert=mmlu,
    ),
    Adapter(
        name="truthfulqa_mc",
        hub_id="truthfulqa/truthful_qa",
        config="multiple_choice",
        splits=("validation",),
        default_split="validation",
        task="multiple_choice",
        convert=truthfulqa_mc,
    ),
    Adapter(
        name="ceval",
        hub_id="ceval/ceval-exam",
        config="computer_network",
        configs=CEVAL_SUBJECTS,
        splits=("val", "dev", "test"),
        default_split="val",
        task="multiple_choice",
        convert=ceval,
        id_field="id",
        unlabeled_splits=("test",),
        note="Chinese; test answers are not published",
    ),
)
