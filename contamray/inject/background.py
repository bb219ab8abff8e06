"""Background text for an injection: ordinary documents the leaked benchmark rows are mixed into.

A model that sees nothing but benchmark rows is not a contaminated model, it is a benchmark model:
every row would look memorised, the clean partitions included (the whole output distribution shifts
towards the benchmark format). Real contamination is a few rows in a large stream of other text, so
the stream here mixes the injected partitions with filler documents - the ``input`` text (the article)
of rows of a text benchmark adapter (XSum's BBC articles by default), read like any benchmark:
from the mirror (``data.mirror_dir``) or the hub.

The filler must not itself contain a benchmark of the run: ``load_background`` drops a document that
contains an injected or probed row's input (exact substring), and the manifest lists the filler's
record ids, so a reader can check it. Do not use as filler a partition the run also tests (e.g.
XSum as background *and* as a benchmark): its documents would be contaminated by the background.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from contamray.inject.spec import BackgroundSpec


@dataclass(frozen=True)
class BackgroundDoc:
    id: str
    text: str


def load_background(
    spec: BackgroundSpec,
    seed: int,
    mirror_dir: str | Path | None,
    exclude: list[str] | None = None,
    where: str = "inject.background",
) -> list[BackgroundDoc]:
    """``spec.docs`` filler documents (seeded sample, canonical order), each cut to ``spec.max_words``."""
    if spec.docs == 0:
        return []
    from contamray.benchmarks import load_records

    try:
        result = load_records(
            spec.source,
            split=spec.split,
            config=spec.config,
            n=spec.docs,
            seed=seed,
            mirror_dir=mirror_dir,
            strict=False,
        )
    except (FileNotFoundError, RuntimeError, ValueError) as err:
        raise ValueError(
            f"{where}.source: could not load the background documents of {spec.source!r}: {err}. Fix: set "
            "data.mirror_dir to the benchmark mirror, choose another source, or set docs: 0 for no background"
        ) from err
    needles = [e.strip() for e in exclude or [] if len(e.strip()) >= 20]
    docs = []
    for record in result.records:
        text = record.input
        if spec.max_words:
            text = " ".join(text.split()[: spec.max_words])
        if any(n in text for n in needles):
            continue
        docs.append(BackgroundDoc(id=record.id, text=text))
    if not docs:
        raise ValueError(f"{where}: {spec.source!r} gave no usable documents; choose another source or docs: 0")
    return docs
