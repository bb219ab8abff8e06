"""Summarisation tasks of Golchin & Surdeanu's "Time Travel in LLMs" (2023): SAMSum and XSum.

The model is shown the dialogue / article (``input``); the gold output is the summary (``label``).
Guided prompting asks the model to reproduce the summary (``reference`` = summary, ``prefix`` = ""),
which the method splits at a random point as the paper does for these datasets. SAMSum is
"summarization", XSum (one-sentence summaries) "one_sentence_summary": the task picks the instruction.
"""

from __future__ import annotations

from collections.abc import Callable

from contamray.benchmarks.base import Adapter, RowContext, append
from contamray.records import Record


def _summary_of(source_field: str) -> Callable[[RowContext], Record]:
    def convert(ctx: RowContext) -> Record:
        source = ctx.text(source_field)
        summary = ctx.text("summary")
        return ctx.record(
            input=source,
            label=summary,
            reference=summary,
            prefix="",
            verbalized=append(source, summary),
        )

    convert.__name__ = f"summary_of_{source_field}"
    return convert


ADAPTERS = (
    Adapter(
        name="samsum",
        hub_id="knkarthick/samsum",
        config="default",
        splits=("train", "validation", "test"),
        default_split="test",
        task="summarization",
        convert=_summary_of("dialogue"),
        id_field="id",
    ),
    Adapter(
        name="xsum",
        hub_id="EdinburghNLP/xsum",
        config="default",
        splits=("train", "validation", "test"),
        default_split="test",
        task="one_sentence_summary",
        convert=_summary_of("document"),
        id_field="id",
    ),
)
