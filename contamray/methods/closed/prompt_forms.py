"""Both prompt forms at once: ``chat: both`` of the held-out tests that ask a model (membership scores, CDD, the
held-out accuracy gap).

A model reacts to what it was trained on in the form it was trained in: rows leaked as raw text show in raw prompts,
rows leaked as conversations (supervised fine-tuning) in the model's chat template - and the tool cannot know how a
model was contaminated. ``chat: both`` asks every example in both forms: the raw form keeps the requests and columns of
``chat: false``, the chat form's request keys carry the tag ``chat`` and its columns the suffix ``_chat``. Each form's
held-out test is made, and the partition is decided by one test of both (``combine_forms``): when both forms were tested
on the same units (the same rows scored, so the same groups and blocks), the joint Mann-Whitney over those units
(``stats.tests.joint_mann_whitney_greater``: the larger of the two standardised rank sums, under the permutation null
that moves each unit's pair of scores together) - valid whatever the dependence between the forms, and as sharp as one
test when they agree: when both forms rank the same units highest (a partition both find surer) its smallest p is one
test's 1 / C(n, n_x), where Bonferroni's is twice that (a 20-row slice of 3 or 4 units a side - Winogrande's twins,
HellaSwag's runs - can then reach 1 / 35 = 0.029, never Bonferroni's 0.025 per form); when they rank different units
highest, it is 2 / C(n, n_x) (0.057 there). Where that is above alpha, the statistic is the sum of the two standardised
rank sums instead (equal sums ordered by the larger) when it can go lower (mostly to one test's 1 / C(n, n_x) again):
chosen from the pooled units alone, so the test stays exact (``joint_mann_whitney_greater``'s ``alpha``). When the
forms' units differ (a row failed in one form only), ``p = min(1, 2 min(p_raw, p_chat))`` (Bonferroni: each test is
valid, P(min p <= alpha / 2) <= alpha). Inconclusive when neither form could reach alpha (alpha / 2 for Bonferroni), or
the joint test's smallest possible p (with either statistic) is above alpha. A model without a chat template gets the
raw text in both forms (the engines warn), so both forms repeat one test: the summary says so when the two forms scored
alike on every row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from contamray.methods.closed.cell_rows import finite, row_failed
from contamray.stats.tests import joint_mann_whitney_greater

BOTH = "both"
CHAT_TAG = "chat"  # the chat form's request-key tag and (as "_chat") column suffix under chat: both
FORM_NAMES = ("raw prompt", "chat template")


def chat_option(value: Any, where: str) -> bool | str:
    """``chat`` checked: false (raw prompt), true (the model's chat template) or ``"both"``."""
    if isinstance(value, str) and value.strip().lower() == BOTH:
        return BOTH
    if not isinstance(value, bool):
        raise ValueError(f"{where}.chat must be false (raw prompt), true (the model's chat template) or both "
                         f"(both forms, tested together), got {value!r}")  # fmt: skip
    return value


def prompt_forms(chat: bool | str) -> tuple[tuple[str, bool], ...]:
    """(request-key and column tag, chat) of each form asked: the raw form keeps ``chat: false``'s keys."""
    if chat == BOTH:
        return (("", False), (CHAT_TAG, True))
    return (("", bool(chat)),)


def chat_column(column: str) -> str:
    """The chat form's copy of ``column`` under ``chat: both``."""
    return f"{column}_{CHAT_TAG}"


def combine_forms(
    name: str,
    cfg: Any,
    rows: list[dict],
    results: dict[str, dict[str, Any]],
    reason_of: Callable[[str, Any], str],
    score: str,
    unit_scores: Mapping[str, Any] | None = None,
) -> tuple[float | None, float | None, str, str, float | None]:
    """The raw and chat forms' held-out tests of ``score`` (and ``chat_column(score)``) combined: (p-value, statistic,
    inconclusive reason, summary, the smallest p the combination could give) for ``HeldoutTest.combine`` (see the
    module docstring). ``unit_scores``: each column's ``heldout_test.UnitScores``; when both forms were tested on the
    same units, the joint test over them, else Bonferroni."""
    forms = dict(zip((score, chat_column(score)), FORM_NAMES, strict=True))
    scored = [r for r in rows if not row_failed(r)]
    alike = bool(scored) and all(finite(r.get(score)) == finite(r.get(chat_column(score))) for r in scored)
    units = [(unit_scores or {}).get(c) for c in forms]
    joint = all(u is not None for u in units) and units[0].units == units[1].units
    level = cfg.alpha if joint else cfg.alpha / len(forms)  # what each form's test must be able to reach
    reasons = {c: reason_of(c, replace(cfg, alpha=level)) for c in forms}
    p_values = {c: results[c]["p_value"] for c in forms if results[c].get("p_value") is not None}
    parts = []
    shared = len(set(reasons.values())) == 1  # the same reason for every form: said once, as the reason
    for column in forms:
        test = results[column]
        part = f"{forms[column]}: " + (
            f"AUC {test['auc_vs_reference']:.3f}, p = {test['p_value']:.3g}"
            if test.get("p_value") is not None else "not tested"
        )  # fmt: skip
        parts.append(part + (f" ({reasons[column]})" if reasons[column] and not shared else ""))
    best = min(p_values, key=p_values.__getitem__) if p_values else score
    reason = ""
    if all(reasons.values()):
        reason = (f"both prompt forms: {reasons[score]}" if shared
                  else "; ".join(f"{forms[c]}: {reasons[c]}" for c in forms))  # fmt: skip
    if joint and p_values:
        test = joint_mann_whitney_greater([(u.x, u.y) for u in units], alpha=cfg.alpha)
        p_value = test.p_value
        sizes = f"{len(units[0].x)} + {len(units[0].y)}"
        statistic = ("the larger standardised rank sum" if test.detail["statistic"] == "max"
                     else f"the sum of the standardised rank sums, equal sums ordered by the larger, as the larger "
                          f"alone could not go below {test.detail['min_p_max']:.3g}")  # fmt: skip
        how = (f"joint test of the 2 prompt forms over the same {sizes} units ({statistic}; "
               f"null: {test.detail['null']}): p = {p_value:.3g}")  # fmt: skip
        floor = test.detail.get("min_p")
        if not reason and floor is not None and floor > cfg.alpha:
            reason = (f"the joint test of the 2 prompt forms cannot reach alpha = {cfg.alpha} (its smallest possible "
                      f"p is {floor:.3g}): draw more rows, or sample: random (independent rows, each a unit)")
    else:
        p_value = min(1.0, len(forms) * p_values[best]) if p_values else None
        floors = [results[c].get("min_p_value") for c in p_values]
        floor = min(1.0, len(forms) * min(floors)) if p_values and None not in floors else None  # type: ignore[type-var]
        how = (f"Bonferroni over the 2 prompt forms: p = min(1, 2 x {p_values[best]:.3g}) = {p_value:.3g}"
               if p_value is not None else "neither prompt form tested")  # fmt: skip
    if alike:  # what a model without a chat template gives: the engines send the raw prompt in both forms
        how += ("; both forms scored alike on every row - if the model has no chat template, chat: false makes "
                "the same test with half the work")  # fmt: skip
    n1 = results[score]["partition"]["n"]
    summary = f"{name}: {n1} rows in both prompt forms; {'; '.join(parts)}; {how} (alpha {cfg.alpha})"
    return p_value, results[best].get("auc_vs_reference"), reason, summary, floor if p_value is not None else None


class TwoPromptForms:
    """What a held-out test that offers ``chat: both`` adds (a base before ``HeldoutTest``): its ``combine`` decides
    by both forms of its declared score column (``combine_forms``); under any other ``chat`` that column decides."""

    name: str
    outputs: Any

    def combine(self, cfg: Any, rows: list[dict], results: dict[str, dict[str, Any]],
                reason_of: Callable[[str, Any], str], unit_scores: Mapping[str, Any],
                ) -> tuple[float | None, float | None, str, str, float | None] | None:  # fmt: skip
        if cfg.chat != BOTH:
            return None
        return combine_forms(self.name, cfg, rows, results, reason_of, self.outputs.score, unit_scores)
