"""The cross-model tables: one per method, rows models, columns benchmark partitions.

Shaped like the survey's Table 1 (Ravaut et al. 2024, "How Much are LLMs Contaminated?"): a block per
method, rows models, columns benchmarks, cells p-values. Here a cell holds the p-value adjusted for
multiple testing across the whole grid (``contamray.report.correction``), or — for methods that
measure rather than test (n-gram overlap) — the contamination rate. Cells that are *not* flagged carry
a ``†`` mark: for tested methods, adjusted p > α ("not significant"); for rate methods, the method's
own decision said clean. The raw p-value, statistic and counts go with every cell (the HTML shows them
on hover; the long table lists them all).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd

from contamray.report.correction import TITLES, adjust, check_correction, reachable
from contamray.report.runs import details_summary

NOT_FLAGGED = "†"
MISSING = "–"
UNDECIDED = {"inconclusive": "inconclusive", "not_applicable": "n/a"}


@dataclass
class Cell:
    """One table cell: what it shows and why."""

    text: str  # the value as shown, with the † mark when not flagged
    value: float | None  # adjusted p-value or rate (None: no value)
    flagged: bool | None  # significant / contaminated; None when there is no value
    status: Literal["flagged", "not_flagged", "missing", "error", "inconclusive", "not_applicable"]
    tooltip: str


@dataclass
class MethodTable:
    """The table of one method label (rows models, columns partitions)."""

    method: str  # label in the run config, e.g. "ngram13"
    method_name: str  # registered method, e.g. "ngram_overlap"
    kind: Literal["p_value", "rate"]
    models: list[str]
    partitions: list[str]
    cells: dict[tuple[str, str], Cell]
    n_tests: int  # p-values of this method that entered the correction

    def value_frame(self) -> pd.DataFrame:
        """Numbers only (NaN where no value): rows models, columns partitions."""
        data = {p: [self._get(m, p).value for m in self.models] for p in self.partitions}
        return pd.DataFrame(data, index=self.models, dtype=float)

    def text_frame(self) -> pd.DataFrame:
        data = {p: [self._get(m, p).text for m in self.models] for p in self.partitions}
        return pd.DataFrame(data, index=pd.Index(self.models, name="model"))

    def _get(self, model: str, partition: str) -> Cell:
        return self.cells.get((model, partition)) or Cell("", None, None, "missing", "")


def annotate(partitions: pd.DataFrame, correction: str, alpha: float) -> pd.DataFrame:
    """Add ``kind``, ``p_adjusted`` and ``flagged`` to the merged cells.

    The correction's family is every *decided* cell of the grid with a p-value and no error (an
    inconclusive cell's p-value is evidence, not a test the method stands by). ``kind`` is per cell:
    ``p_value`` where the method decided by a test, ``rate`` where it measured (guided prompting decides
    by Algorithm 2's judged share in some cells, by Algorithm 1's p in others). ``flagged`` is
    ``p_adjusted <= alpha`` for tested cells and the method's own decision for rate cells (None where
    the cell has no value, is undecided or was skipped). ``p_reachable``: the smallest adjusted p a tested
    cell could have got, its p at its ``min_p`` (``correction.reachable``); ``out_of_reach``: not flagged
    and that smallest above alpha - no outcome of the cell could have been flagged in this grid, so it is
    shown as inconclusive (``reach_reason`` says why), not as clean.
    """
    from contamray.report.runs import decision_of

    correction, alpha = check_correction(correction, alpha)
    table = partitions.copy()
    if "decision" not in table.columns:
        table["decision"] = ""
    table["decision"] = [
        decision_of(d, c, str(e or "")) for d, c, e in zip(table["decision"], table["contaminated"], table["error"])
    ]
    ok = (table["error"].fillna("").astype(str) == "") & table["decision"].isin(["contaminated", "clean"])
    table["kind"] = ["p_value" if _number(p) is not None else "rate" for p in table["p_value"]]
    family = [
        _number(p) if good and kind == "p_value" else None for p, good, kind in zip(table["p_value"], ok, table["kind"])
    ]
    table["p_adjusted"] = adjust(family, correction)
    if "min_p" not in table.columns:
        table["min_p"] = math.nan
    n_tests = sum(p is not None for p in family)
    # a cell's best is only asked for where it matters: a test its correction did not flag
    floors = [
        _number(f) if p is not None and (_number(a) or 0.0) > alpha else None
        for f, p, a in zip(table["min_p"], family, table["p_adjusted"])
    ]
    best = reachable(family, floors, correction)
    flagged: list[bool | None] = []
    reach: list[str] = []
    for (_, row), top in zip(table.iterrows(), best):
        why = ""
        if row["error"] or row["decision"] in UNDECIDED:
            flagged.append(None)
        elif row["kind"] == "p_value":
            p = _number(row["p_adjusted"])
            flagged.append(None if p is None else bool(p <= alpha))
            if p is not None and p > alpha and top is not None and top > alpha:
                why = _out_of_reach(row, top, correction, alpha, n_tests)
                flagged[-1] = None
        else:
            flagged.append(None if _number(row["rate"]) is None else bool(row["contaminated"]))
        reach.append(why)
    table["flagged"] = pd.Series(flagged, index=table.index, dtype=object)
    table["p_reachable"] = [math.nan if b is None else b for b in best]
    table["out_of_reach"] = [bool(w) for w in reach]
    table["reach_reason"] = reach
    table.attrs.update(correction=correction, alpha=alpha, n_tests=n_tests)
    return table


def _out_of_reach(row: Any, best: float, correction: str, alpha: float, n_tests: int) -> str:
    """Why a tested cell no outcome could have flagged after the correction is inconclusive, and what to change."""
    floor = format_number(_number(row.get("min_p")), "p_value")
    raw = format_number(_number(row.get("p_value")), "p_value")
    if correction == "none":
        why = f"the smallest p its data allow is {floor} > alpha {alpha:g}"
    else:
        why = (f"the smallest p its data allow is {floor}, which {TITLES[correction]} over the grid's {n_tests} tests "
               f"adjusts to at best {format_number(best, 'p_value')} > alpha {alpha:g}")  # fmt: skip
    return (
        f"out of reach: {why}, so no outcome of this cell could have been flagged (raw p = {raw}; the method's own "
        f"decision at alpha, before the correction: {row['decision']}). To decide it: report it in a smaller grid "
        "(contamray report on fewer runs), or give it more rows, or random draws (independent rows, each a unit)"
    )


def method_tables(annotated: pd.DataFrame) -> list[MethodTable]:
    """One table per method label, in label order; models and partitions sorted."""
    tables = []
    for method in sorted(annotated["method"].unique()):
        rows = annotated[annotated["method"] == method]
        kinds = rows.loc[~rows["decision"].isin(list(UNDECIDED)), "kind"]
        kind = "p_value" if (kinds == "p_value").any() else "rate"
        models = sorted(rows["model"].unique(), key=_model_key)
        partitions = sorted(rows["partition"].unique())
        cells = {(r["model"], r["partition"]): _cell(r) for _, r in rows.iterrows()}
        n_tests = int(rows["p_adjusted"].map(lambda v: _number(v) is not None).sum())
        names = [n for n in rows["method_name"].unique() if n]
        tables.append(MethodTable(method, names[0] if names else method, kind, models, partitions, cells, n_tests))
    return tables


def describe(table: MethodTable, correction: str, alpha: float, n_tests: int) -> str:
    """One sentence saying what the cells of ``table`` are and what † means."""
    if table.kind == "p_value":
        how = (
            "raw p-values"
            if correction == "none"
            else f"p-values adjusted by {TITLES[correction]} over the {n_tests} tests of the grid"
        )
        return (
            f"Cells: {how}; where the method decided by a rate instead, the rate. {NOT_FLAGGED} = not significant "
            f"at α = {alpha:g} (for a rate: the method's own decision was 'clean'). inconclusive = the data could "
            "not tell (reasons in report.md), or no outcome of the cell could have been flagged after the correction "
            "(out of reach: listed below); n/a = the method does not apply."
        )
    return (
        "Cells: contamination rate (share of the partition's examples found contaminated; this method "
        f"measures, it does not test). {NOT_FLAGGED} = the method's own decision was 'clean'. inconclusive = "
        "the data could not tell; n/a = the method does not apply."
    )


def render_markdown(tables: list[MethodTable], annotated: pd.DataFrame, notes: list[str] | None = None) -> str:
    """All method tables as Markdown (``tables.md``), with the correction stated."""
    correction = annotated.attrs.get("correction", "holm")
    alpha = annotated.attrs.get("alpha", 0.05)
    n_tests = annotated.attrs.get("n_tests", 0)
    lines = ["# contamray: cross-model tables", ""]
    lines.append(f"Multiple-testing correction: {TITLES[correction]}, α = {alpha:g}, {n_tests} tests in the grid.")
    lines.append("")
    for t in tables:
        lines += [f"## {t.method} ({t.method_name})", "", describe(t, correction, alpha, n_tests), ""]
        lines.append("| model | " + " | ".join(t.partitions) + " |")
        lines.append("|---|" + "---|" * len(t.partitions))
        for m in t.models:
            texts = [t.cells[(m, p)].text if (m, p) in t.cells else "" for p in t.partitions]
            lines.append(f"| {m} | " + " | ".join(texts) + " |")
        lines.append("")
    hows = []
    if "details" in annotated.columns:
        summaries = ((r.model, r.partition, r.method, details_summary(r.details)) for r in annotated.itertuples())
        hows = [h for h in summaries if h[3]]
    if hows:
        lines += ["## How each p-value was obtained", ""]
        lines += [f"- {m} / {p} / {meth}: {how}" for m, p, meth, how in hows]
        lines.append("")
    unreachable = out_of_reach(annotated)
    if unreachable:
        lines += ["## Out of reach after the correction (shown as inconclusive)", ""]
        lines += [f"- {m} / {p} / {meth}: {why}" for m, p, meth, why in unreachable]
        lines.append("")
    errors = annotated[annotated["error"] != ""]
    if len(errors):
        lines += ["## Failed cells", ""]
        lines += [f"- {r.model} / {r.partition} / {r.method}: {r.error}" for r in errors.itertuples()]
        lines.append("")
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def out_of_reach(annotated: pd.DataFrame) -> list[tuple[str, str, str, str]]:
    """(model, partition, method, why) of each tested cell no outcome could have flagged after the correction."""
    if "out_of_reach" not in annotated.columns:
        return []
    rows = annotated[annotated["out_of_reach"].astype(bool)].sort_values(["method", "model", "partition"])
    return [(r.model, r.partition, r.method, r.reach_reason) for r in rows.itertuples()]


def format_number(value: float | None, kind: str) -> str:
    """p-values with 3 significant digits (scientific below 0.001); rates as percentages."""
    if value is None or math.isnan(value):
        return MISSING
    if kind == "rate":
        return f"{100 * value:.1f}%"
    if value == 0 or value >= 1e-3:
        return f"{value:.3g}"
    return f"{value:.1e}"


def _cell(row: Any) -> Cell:
    kind = row["kind"]
    parts = [f"{row['model']} · {row['partition']} · {row['method']}"]
    if row["error"]:
        return Cell("error", None, None, "error", "\n".join([*parts, f"error: {row['error']}"]))
    if row["decision"] in UNDECIDED:
        parts.append(f"method decision: {row['decision']}: {row.get('reason') or ''}")
        raw = _number(row["p_value"])
        if raw is not None:
            parts.append(f"p = {format_number(raw, 'p_value')} (raw; not a decision)")
        return Cell(UNDECIDED[row["decision"]], None, None, row["decision"], "\n".join(parts))
    raw = _number(row["p_value"])
    if row.get("out_of_reach"):
        parts.append(f"inconclusive: {row['reach_reason']}")
        adjusted = format_number(_number(row["p_adjusted"]), "p_value")
        parts.append(f"p = {format_number(raw, 'p_value')} (raw), {adjusted} (adjusted; not a decision)")
        return Cell("inconclusive", None, None, "inconclusive", "\n".join(parts))
    value = _number(row["p_adjusted"]) if kind == "p_value" else _number(row["rate"])
    if kind == "p_value":
        parts.append(f"p = {format_number(raw, 'p_value')} (raw), {format_number(value, 'p_value')} (adjusted)")
        rate = _number(row["rate"])
        if rate is not None:
            parts.append(f"rate = {format_number(rate, 'rate')}")
    else:
        parts.append(f"rate = {format_number(value, 'rate')}")
    stat = _number(row.get("statistic"))
    parts.append(f"statistic = {stat:.4g}" if stat is not None else "statistic = –")
    parts.append(f"method decision: {row['decision']}")
    how = details_summary(row.get("details"))
    if how:
        parts.append(f"how: {how}")
    n_examples, n_failed = (int(_number(row.get(k)) or 0) for k in ("n_examples", "n_failed"))
    parts.append(f"{n_examples} examples, {n_failed} failed")
    parts.append(f"run: {row['run']}")
    if value is None:
        return Cell(MISSING, None, None, "missing", "\n".join(parts))
    flagged = bool(row["flagged"])
    text = format_number(value, kind) + ("" if flagged else NOT_FLAGGED)
    return Cell(text, value, flagged, "flagged" if flagged else "not_flagged", "\n".join(parts))


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def _model_key(model: str) -> tuple[int, str]:
    """Models first, corpora (open-data rows, ``corpus:<kind>``) after them."""
    return (1 if model.startswith("corpus:") else 0, model)
