"""Label-name tasks of Golchin & Surdeanu's "Time Travel in LLMs" (2023): IMDB, AG News, Yelp, RTE, WNLI.

Guided prompting splits the instance a model must reproduce (``reference``) from what it is given
(``prefix``): a single-instance task (IMDB, AG News, Yelp) gives nothing and asks for the whole text,
which the method cuts at a random point; a paired NLI task (RTE, WNLI) gives sentence 1 and asks for
sentence 2. Labels are stored by the hub as ClassLabel integers; ``label`` is the class name,
``answer`` the integer as text, ``choices`` the class names. Splits published without labels (label
-1: IMDB ``unsupervised``, GLUE ``test``) give ``label=""``.
"""

from __future__ import annotations

from contamray.benchmarks.base import Adapter, RowContext, append
from contamray.records import Record

IMDB_LABELS = ("negative", "positive")
AG_NEWS_LABELS = ("World", "Sports", "Business", "Sci/Tech")
YELP_LABELS = ("1 star", "2 stars", "3 stars", "4 stars", "5 stars")
RTE_LABELS = ("entailment", "not_entailment")
WNLI_LABELS = ("not_entailment", "entailment")


def _class_name(ctx: RowContext) -> tuple[str, str]:
    names = ctx.adapter.label_names
    key = ctx.index("label", len(names))
    return ("", "") if key is None else (names[key], str(key))


def single_text(ctx: RowContext) -> Record:
    """``{"text", "label"}`` rows: the text is both the input and the guided-prompting reference."""
    text = ctx.text("text")
    label, answer = _class_name(ctx)
    return ctx.record(
        input=text,
        label=label,
        reference=text,
        prefix="",
        choices=ctx.adapter.label_names,
        answer=answer,
        verbalized=append(text, label),
    )


def sentence_pair(ctx: RowContext) -> Record:
    """GLUE ``{"sentence1", "sentence2", "label", "idx"}`` rows: prefix = sentence 1, reference = 2."""
    first = ctx.text("sentence1")
    second = ctx.text("sentence2")
    label, answer = _class_name(ctx)
    return ctx.record(
        input=f"{first}\n{second}",
        label=label,
        reference=second,
        prefix=first,
        choices=ctx.adapter.label_names,
        answer=answer,
        verbalized=append(first, second, label),
    )


ADAPTERS = (
    Adapter(
        name="imdb",
        hub_id="stanfordnlp/imdb",
        config="plain_text",
        splits=("train", "test", "unsupervised"),
        default_split="test",
        task="classification",
        convert=single_text,
        label_names=IMDB_LABELS,
        unlabeled_splits=("unsupervised",),
    ),
    Adapter(
        name="ag_news",
        hub_id="fancyzhx/ag_news",
        config="default",
        splits=("train", "test"),
        default_split="test",
        task="classification",
        convert=single_text,
        label_names=AG_NEWS_LABELS,
    ),
    Adapter(
        name="yelp",
        hub_id="Yelp/yelp_review_full",
        config="yelp_review_full",
        splits=("train", "test"),
        default_split="test",
        task="classification",
        convert=single_text,
        label_names=YELP_LABELS,
    ),
    Adapter(
        name="rte",
        hub_id="nyu-mll/glue",
        config="rte",
        splits=("train", "validation", "test"),
        default_split="validation",
        task="nli",
        convert=sentence_pair,
        label_names=RTE_LABELS,
        id_field="idx",
        unlabeled_splits=("test",),
    ),
    Adapter(
        name="wnli",
        hub_id="nyu-mll/glue",
        config="wnli",
        splits=("train", "validation", "test"),
        default_split="validation",
        task="nli",
        convert=sentence_pair,
        label_names=WNLI_LABELS,
        id_field="idx",
        unlabeled_splits=("test",),
    ),
)
