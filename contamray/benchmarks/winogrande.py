"""Winogrande (Sakaguchi et al. 2020; Open LLM Leaderboard v1): a sentence with a blank ``_``, two options.

``input``/``reference`` is the sentence with its blank, ``choices`` = (option1, option2), ``answer``
the stored key ("1"/"2"), ``label`` the right option, ``verbalized`` the sentence with the blank
filled by the right option (Li et al. 2023). Where a sentence has several ``_`` the first is the blank,
as in lm-evaluation-harness.

Twins: Winogrande was written in pairs of near-identical sentences whose trigger word flips the answer.
The hub files keep a pair on adjacent rows, so a twin is cheap to find: rows i and i+1 with the same
(option1, option2) and different answers (answers not compared on the unlabelled test split) form a
pair, taken greedily from the top. ``meta["group"]`` is the id of the pair's first row (a lone row is
its own group) and ``meta["twin"]`` the other row's id ("" for a lone row). On the validation split this
pairs 568 of 1267 rows (284 pairs, every one with opposite answers); the rest lost their twin when the
dataset was filtered. The grouping is computed over the whole split, so it is the same whichever rows
are sampled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contamray.benchmarks.base import Adapter, RowContext
from contamray.records import Record

CONFIGS = tuple(f"winogrande_{size}" for size in ("xs", "s", "m", "l", "xl", "debiased"))


def winogrande(ctx: RowContext) -> Record:
    sentence = ctx.text("sentence")
    if "_" not in sentence:
        ctx.fail("sentence", "has no blank '_'", "give the sentence with '_' where an option goes")
    options = (ctx.text("option1"), ctx.text("option2"))
    key = ctx.index("answer", 2, base=1)
    label = "" if key is None else options[key]
    return ctx.record(
        input=sentence,
        label=label,
        reference=sentence,
        prefix="",
        choices=options,
        answer="" if key is None else str(key + 1),
        verbalized=sentence.replace("_", label, 1) if label else sentence,
    )


def twin_groups(columns: Mapping[str, list[Any]], partition: str) -> list[dict[str, Any]]:
    """Pair adjacent rows sharing (option1, option2) with different answers; see the module doc."""
    first, second, answers = columns["option1"], columns["option2"], columns["answer"]
    n = len(first)
    out: list[dict[str, Any]] = []
    i = 0
    while i < n:
        pair = (
            i + 1 < n
            and first[i] is not None
            and second[i] is not None
            and (first[i], second[i]) == (first[i + 1], second[i + 1])
            and (not answers[i] or not answers[i + 1] or answers[i] != answers[i + 1])
        )
        if pair:
            group = f"{partition}#{i}"
            out.append({"group": group, "twin": f"{partition}#{i + 1}"})
            out.append({"group": group, "twin": group})
            i += 2
        else:
            out.append({"group": f"{partition}#{i}", "twin": ""})
            i += 1
    return out


ADAPTERS = (
    Adapter(
        name="winogrande",
        hub_id="allenai/winogrande",
        config="winogrande_xl",
        configs=CONFIGS,
        splits=("train", "validation", "test"),
        default_split="validation",
        task="multiple_choice",
        convert=winogrande,
        unlabeled_splits=("test",),
        group_columns=("option1", "option2", "answer"),
        groups=twin_groups,
        group_rows=2,
    ),
)
