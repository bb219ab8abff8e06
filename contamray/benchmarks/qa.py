"""Free-answer question answering: GSM8K and TruthfulQA (generation config).

Guided prompting (Golchin & Surdeanu 2023) treats a question as the instance: ``reference`` is the
question text, which the model must reproduce from its start. ``verbalized`` appends the answer to the
question (Li et al. 2023).

GSM8K's ``answer`` field holds the worked solution ending in ``#### <final answer>``. ``label`` is the
whole worked solution (records.py: "the worked answer"), so input-and-label matchers see the solution
text; ``answer`` and ``meta["final_answer"]`` hold the text after ``####`` (e.g. "18").
TruthfulQA's ``label`` is ``best_answer``; the correct / incorrect answer lists go to ``meta``.
"""

from __future__ import annotations

from contamray.benchmarks.base import Adapter, RowContext, append
from contamray.records import Record

GSM8K_MARK = "####"


def gsm8k(ctx: RowContext) -> Record:
    question = ctx.text("question")
    solution = ctx.text("answer")
    if GSM8K_MARK not in solution:
        ctx.fail("answer", f"has no '{GSM8K_MARK} <final answer>' line")
    final = solution.rsplit(GSM8K_MARK, 1)[1].strip()
    if not final:
        ctx.fail("answer", f"has an empty final answer after '{GSM8K_MARK}'")
    return ctx.record(
        input=question,
        label=solution,
        reference=question,
        prefix="",
        answer=final,
        verbalized=append(question, solution),
        meta={"final_answer": final},
    )


def truthfulqa_generation(ctx: RowContext) -> Record:
    question = ctx.text("question")
    best = ctx.text("best_answer")
    correct = ctx.texts("correct_answers")
    incorrect = ctx.texts("incorrect_answers")
    meta = {"correct_answers": list(correct), "incorrect_answers": list(incorrect)}
    for key in ("type", "category", "source"):
        if isinstance(ctx.row.get(key), str):
            meta[key] = ctx.row[key]
    return ctx.record(
        input=question,
        label=best,
        reference=question,
        prefix="",
        verbalized=append(question, best),
        meta=meta,
    )


ADAPTERS = (
    Adapter(
        name="gsm8k",
        hub_id="openai/gsm8k",
        config="main",
        configs=("main", "socratic"),
        splits=("train", "test"),
        default_split="test",
        task="question_answering",
        convert=gsm8k,
    ),
    Adapter(
        name="truthfulqa_gen",
        hub_id="truthfulqa/truthful_qa",
        config="generation",
        splits=("validation",),
        default_split="validation",
        task="question_answering",
        convert=truthfulqa_generation,
    ),
)
