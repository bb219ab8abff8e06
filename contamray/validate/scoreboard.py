"""The detector scoreboard: every method's verdicts and scores against the injected truth.

Per method (a method label of the run config), over all labelled runs:

- **partition level**, from ``partitions.parquet`` (one verdict per model x partition): accuracy of
  the decided verdicts (``decision`` contaminated / clean) against ``truth``; false-positive rate on
  clean partitions; true-positive rate on contaminated partitions, overall and at duplication >= 2
  (the issue's goal). ``inconclusive`` verdicts (and cells whose every example failed) are counted
  apart (``n_inconclusive`` and their share of the answered cells), never as clean; cells whose
  reduce failed (``error``), that the plan skipped (``not_applicable``) or whose truth is unknown
  are left out, counted in ``n_skipped``;
- **instance level**, from ``examples.parquet`` (``member``): for each injected partition, its member
  rows against the non-member rows of the same benchmark seen by the same model (the other rows of
  that partition when only a fraction was injected, and clean partitions of the same adapter - e.g.
  ``synthetic_facts/set1`` beside ``synthetic_facts/default``). Comparing within one benchmark keeps
  the AUC about membership, not about how different two datasets' texts are. ROC AUC and TPR at 5 %
  FPR (``metrics``) per injected partition, averaged (macro) over partitions; also at duplication >= 5;
- **cost**: engine tokens and seconds, summed over the method's cells when the run records them
  (``engine_tokens``, ``seconds`` in ``partitions.parquet``).

Breakdowns give the share of contaminated partitions flagged, and the instance-level AUC, per
duplication count and per kind of contamination (``form/content/order``). ``render`` writes it all
as Markdown; ``update_readme`` replaces the text between ``<!-- scoreboard:start -->`` and
``<!-- scoreboard:end -->``, or with ``merge`` (``merge_rows``) only the rows of the methods a run scored -
a method added to the grid, or one whose rule changed, is measured without re-running every other method; the
other rows and the note of the runs they came from are kept, the new run's note appended.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from contamray.records import benchmark_of
from contamray.report.runs import decision_of
from contamray.validate.instance import instance_scores
from contamray.validate.metrics import mean, roc_auc, tpr_at_fpr
from contamray.validate.readme_section import replace_section
from contamray.validate.truth import LabelledRun

START, END = "<!-- scoreboard:start -->", "<!-- scoreboard:end -->"
MERGED, REGENERATED = "The rows of", " regenerated"  # a merge's note: MERGED <rows> REGENERATED (``merged_note``)
COST_COLUMNS = ("engine_tokens", "seconds")


def all_failed(parts: pd.DataFrame) -> pd.Series:
    """Cells whose every example failed (e.g. a multiple-choice method on a QA partition): no verdict."""
    if not {"n_examples", "n_failed"} <= set(parts.columns):
        return pd.Series(False, index=parts.index)
    n, failed = pd.to_numeric(parts["n_examples"], errors="coerce"), pd.to_numeric(parts["n_failed"], errors="coerce")
    return (n > 0) & (failed >= n)


def decisions(parts: pd.DataFrame) -> pd.Series:
    """Each cell's three-valued decision (``error`` for failed cells; runs from before decisions existed
    decided by ``contaminated``)."""
    error = parts["error"].fillna("").astype(str) if "error" in parts.columns else pd.Series("", index=parts.index)
    decision = parts["decision"] if "decision" in parts.columns else pd.Series("", index=parts.index)
    out = [decision_of(d, c, e) for d, c, e in zip(decision, parts["contaminated"], error)]
    return pd.Series(out, index=parts.index, dtype=object).where(~all_failed(parts), "inconclusive")


def _judged(parts: pd.DataFrame) -> pd.Series:
    """Cells with a known truth that the method answered (decided or inconclusive)."""
    return parts["truth"].notna() & decisions(parts).isin(["contaminated", "clean", "inconclusive"])


def _usable(parts: pd.DataFrame) -> pd.Series:
    """Cells with a known truth and a decision (contaminated or clean)."""
    return parts["truth"].notna() & decisions(parts).isin(["contaminated", "clean"])


def _rate(flags: pd.Series) -> float:
    return float(flags.astype(bool).mean()) if len(flags) else float("nan")


def partition_scores(parts: pd.DataFrame) -> pd.DataFrame:
    """One row per method: partition-level accuracy, FPR, TPR (all and duplication >= 2), cost."""
    rows = []
    for method, group in parts.groupby("method", sort=True):
        ok = group[_usable(group)]
        judged = group[_judged(group)]
        truth = ok["truth"].astype(bool)
        flagged = ok["contaminated"].astype(bool)
        positives, negatives = ok[truth], ok[~truth]
        row = {
            "method": method,
            "family": str(group["family"].iloc[0]),
            "n_partitions": len(ok),
            "n_contaminated": int(truth.sum()),
            "n_clean": int((~truth).sum()),
            "n_inconclusive": len(judged) - len(ok),
            "inconclusive": _rate(pd.Series([True] * (len(judged) - len(ok)) + [False] * len(ok))),
            "n_skipped": len(group) - len(judged),
            "accuracy": _rate(flagged == truth),
            "fpr": _rate(negatives["contaminated"]),
            "tpr": _rate(positives["contaminated"]),
            "tpr_dup2": _rate(positives[positives["duplication"] >= 2]["contaminated"]),
        }
        for column in COST_COLUMNS:
            values = pd.to_numeric(group[column], errors="coerce") if column in group.columns else pd.Series([])
            row[column] = float(values.sum()) if values.notna().any() else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def instance_rows(runs: Sequence[LabelledRun], max_fpr: float = 0.05) -> pd.DataFrame:
    """One row per (run, model, method, injected partition): AUC and TPR at ``max_fpr`` FPR."""
    rows = []
    for run in runs:
        ex, parts = run.examples, run.partitions
        if ex.empty or "member" not in ex.columns:
            continue
        names = dict(zip(parts["method"], parts.get("method_name", parts["method"])))
        error = ex["error"].fillna("").astype(str) if "error" in ex.columns else pd.Series("", index=ex.index)
        ex = ex[(error == "") & ex["member"].notna()].copy()
        if ex.empty:
            continue
        ex["benchmark"] = ex["partition"].astype(str).map(benchmark_of)
        meta = parts.set_index(["model", "partition", "method"])[["duplication", "kind"]]
        meta = meta[~meta.index.duplicated()]
        for (model, method), table in ex.groupby(["model", "method"], sort=True):
            scores = instance_scores(table, str(names.get(method, method)))
            if scores is None:
                continue
            table = table.assign(score=scores.values)
            table = table[table["score"].notna()]
            for partition, members in table[table["member"].astype(bool)].groupby("partition"):
                bench = benchmark_of(str(partition))
                others = table[(table["benchmark"] == bench) & ~table["member"].astype(bool)]
                if members.empty or others.empty:
                    continue
                labels = [True] * len(members) + [False] * len(others)
                values = list(members["score"]) + list(others["score"])
                key = (model, partition, method)
                rows.append({
                    "run": run.output_dir.name, "model": model, "method": method, "partition": partition,
                    "duplication": int(meta.loc[key, "duplication"]) if key in meta.index else 0,
                    "kind": str(meta.loc[key, "kind"]) if key in meta.index else "",
                    "n_members": len(members), "n_nonmembers": len(others),
                    "auc": roc_auc(labels, values), "tpr_at_fpr": tpr_at_fpr(labels, values, max_fpr),
                })  # fmt: skip
    return pd.DataFrame(rows)


def scoreboard(runs: Sequence[LabelledRun], max_fpr: float = 0.05) -> pd.DataFrame:
    """The main table: partition scores joined with the macro-averaged instance scores per method."""
    parts = pd.concat([r.partitions for r in runs], ignore_index=True)
    board = partition_scores(parts)
    inst = instance_rows(runs, max_fpr)
    extra = []
    for method in board["method"]:
        mine = inst[inst["method"] == method] if not inst.empty else inst
        high = mine[mine["duplication"] >= 5] if not mine.empty else mine
        extra.append({
            "auc": mean(list(mine["auc"])) if not mine.empty else float("nan"),
            "auc_dup5": mean(list(high["auc"])) if not high.empty else float("nan"),
            "tpr_at_fpr_dup5": mean(list(high["tpr_at_fpr"])) if not high.empty else float("nan"),
            "n_auc": len(mine),
        })  # fmt: skip
    return pd.concat([board, pd.DataFrame(extra)], axis=1)


def breakdown(parts: pd.DataFrame, by: str) -> pd.DataFrame:
    """Share of contaminated partitions flagged, per method (rows) and ``by`` value (columns)."""
    ok = parts[_usable(parts) & parts["truth"].astype(bool)]
    if ok.empty:
        return pd.DataFrame()
    table = ok.assign(flag=ok["contaminated"].astype(float)).pivot_table(
        index="method", columns=by, values="flag", aggfunc="mean"
    )
    return table.sort_index(axis=1)


def _fmt(value: float, kind: str = "pct") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if kind == "pct":
        return f"{100 * value:.0f} %"
    if kind == "auc":
        return f"{value:.2f}"
    if kind == "int":
        return f"{int(value):,}"
    return f"{value:.0f}"


def render(runs: Sequence[LabelledRun], max_fpr: float = 0.05, note: str = "") -> str:
    """The scoreboard as Markdown: the main table, then flagged shares by duplication and by kind."""
    board = scoreboard(runs, max_fpr)
    parts = pd.concat([r.partitions for r in runs], ignore_index=True)
    fpr_pct = f"{100 * max_fpr:g} %"
    lines = [
        f"| method | family | decided (contaminated / clean) | inconclusive | accuracy | FPR clean | TPR | "
        f"TPR dup ≥ 2 | AUC | AUC dup ≥ 5 | TPR@{fpr_pct} FPR dup ≥ 5 | engine tokens | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in board.sort_values(["family", "method"]).iterrows():
        lines.append(
            f"| `{r['method']}` | {r['family']} | {r['n_partitions']} ({r['n_contaminated']} / {r['n_clean']}) | "
            f"{r['n_inconclusive']} ({_fmt(r['inconclusive'])}) | {_fmt(r['accuracy'])} | {_fmt(r['fpr'])} | "
            f"{_fmt(r['tpr'])} | {_fmt(r['tpr_dup2'])} | "
            f"{_fmt(r['auc'], 'auc')} | {_fmt(r['auc_dup5'], 'auc')} | {_fmt(r['tpr_at_fpr_dup5'])} | "
            f"{_fmt(r['engine_tokens'], 'int')} | {_fmt(r['seconds'], 'sec')} |"
        )
    for by, title in (("duplication", "by duplication count (copies seen)"), ("kind", "by kind of contamination")):
        table = breakdown(parts, by)
        if table.empty:
            continue
        cols = list(table.columns)
        lines += ["", f"Share of contaminated partitions flagged, {title}:", "",
                  "| method | " + " | ".join(f"×{c}" if by == "duplication" else f"`{c}`" for c in cols) + " |",
                  "|---|" + "---|" * len(cols)]  # fmt: skip
        for method, row in table.iterrows():
            lines.append(f"| `{method}` | " + " | ".join(_fmt(row[c]) for c in cols) + " |")
    inst = instance_rows(runs, max_fpr)
    for by, title in (("duplication", "by duplication count"), ("kind", "by kind of contamination")):
        if inst.empty:
            break
        table = inst.pivot_table(index="method", columns=by, values="auc", aggfunc="mean").sort_index(axis=1)
        cols = list(table.columns)
        lines += ["", f"Instance-level ROC AUC (members against non-members of the same benchmark), {title}:", "",
                  "| method | " + " | ".join(f"×{c}" if by == "duplication" else f"`{c}`" for c in cols) + " |",
                  "|---|" + "---|" * len(cols)]  # fmt: skip
        for method, row in table.iterrows():
            lines.append(f"| `{method}` | " + " | ".join(_fmt(row[c], "auc") for c in cols) + " |")
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def update_readme(readme: str | Path, markdown: str, merge: bool = False) -> None:
    """Replace the text between the scoreboard markers in ``readme`` (both markers must be there); with
    ``merge``, only the rows of the methods ``markdown`` scores (``merge_rows``)."""
    edit = (lambda old: merge_rows(old, markdown)) if merge else None
    replace_section(readme, START, END, markdown, "scoreboard", edit)


def _blocks(markdown: str) -> list[tuple[str | None, list[str]]]:
    """The Markdown as (title, lines) blocks: each table under the text line before it ("" for a table at the
    top), and each run of other lines as a block of its own (title None)."""
    blocks: list[tuple[str | None, list[str]]] = []
    title = ""
    for line in markdown.strip("\n").splitlines():
        is_row = line.startswith("|")
        if not is_row and line.strip():
            title = line.strip()
        if blocks and (blocks[-1][0] is not None) == is_row:
            blocks[-1][1].append(line)
        else:
            blocks.append((title if is_row else None, [line]))
    return blocks


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _order(row: str, header: list[str]) -> tuple[str, ...]:
    """A row's place as ``render`` orders them: by family (the main table), then method name."""
    cells = _cells(row)
    name = cells[0].strip("`")
    return (cells[1], name) if header[1:2] == ["family"] else (name,)


def merge_rows(old: str, new: str) -> str:
    """``old`` scoreboard Markdown with the rows of ``new``'s methods (those of its first table) replaced by
    ``new``'s, in every table the two share (matched by the line above it), and removed from a table ``new``
    lacks (it has nothing there for them); a table only ``new`` has is added; ``new``'s note (its text after its
    last table) is appended after ``old``'s text, less an earlier merge's note whose rows all go now. Rows are
    matched by their method cell; a column ``new`` has and ``old`` lacks is refused (the tables would no longer
    line up: run the whole grid), one ``old`` has and ``new`` lacks reads "–"."""
    new_blocks = _blocks(new)
    tables = [(title, lines) for title, lines in new_blocks if title is not None]
    if not tables or len(tables[0][1]) < 2:
        raise ValueError("merge: the new scoreboard has no table")
    methods = {_cells(line)[0] for line in tables[0][1][2:]}
    by_title = {title: lines for title, lines in tables}
    merged: list[str] = []
    seen: set[str] = set()
    for title, lines in _blocks(old):
        if title is None:
            merged += [line for line in lines if not _superseded(line, methods)]
            continue
        if title not in by_title:  # the new run has no row here: its methods' old rows go
            merged += lines[:2] + [r for r in lines[2:] if _cells(r)[0] not in methods]
            continue
        seen.add(title)
        header, rows = _cells(lines[0]), lines[2:]
        new_lines = by_title[title]
        new_header = _cells(new_lines[0])
        missing = [c for c in new_header if c not in header]
        if missing:
            raise ValueError(
                f"merge: table {title or 'main'!r} has no column(s) {missing} in the README; run the "
                "whole grid (without --merge) to regenerate it"
            )
        kept = [r for r in rows if _cells(r)[0] not in methods]
        added = []
        for r in new_lines[2:]:
            if _cells(r)[0] not in methods:
                continue  # a table's rows are the scored methods' (as render writes them)
            cells = dict(zip(new_header, _cells(r)))
            added.append("| " + " | ".join(cells.get(c, "–") for c in header) + " |")
        merged += lines[:2] + sorted(kept + added, key=lambda r: _order(r, header))
    for title, lines in tables:
        if title not in seen:
            merged += ["", title, "", *lines] if title else ["", *lines]
    last = max(i for i, (title, _) in enumerate(new_blocks) if title is not None)
    notes = [line for title, lines in new_blocks[last + 1 :] for line in lines]  # the note after the last table
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(merged).rstrip())  # a dropped note leaves no double gap
    return text + "\n\n" + "\n".join(notes).strip() + "\n"


def merged_note(methods: Sequence[str]) -> str:
    """The start of a merge's note: which rows it regenerated (``merge_rows`` drops an earlier such note whose
    rows the next merge replaces)."""
    return f"{MERGED} " + ", ".join(f"`{m}`" for m in sorted(methods)) + REGENERATED


def _superseded(line: str, methods: set[str]) -> bool:
    """Whether ``line`` is an earlier merge's note whose every row ``methods`` now replaces."""
    if not line.startswith(MERGED):
        return False
    named = set(re.findall(r"`[^`]+`", line.split(REGENERATED, 1)[0]))
    return bool(named) and named <= methods
