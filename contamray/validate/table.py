"""The canary table: each method's verdict on each partition, against the known truth.

One table per family and model (closed-data: the injected model; open-data: the scanned corpus).
Columns are partitions, contaminated ones first, each headed by its truth (``injected ×10
verbatim/input_and_label/canonical``, ``in corpus ×1 verbatim`` or ``clean``); rows are methods; a
cell is the verdict (``yes`` / ``no``) marked ✓ when it matches the truth and ✗ when it does not,
with the p-value or rate behind it.
The last column counts the correct verdicts; a method's own reference partition (the known-unseen
rows its test compares against) shows ``(reference)`` and is not counted.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from contamray.report.runs import decision_of
from contamray.validate.truth import LabelledRun, label_run

TRUTH_FILE = "truth.md"


def _evidence(row: pd.Series) -> str:
    p = row.get("p_value")
    if p is not None and not (isinstance(p, float) and math.isnan(p)):
        return f"p={float(p):.2g}"
    rate = row.get("rate")
    if rate is not None and not (isinstance(rate, float) and math.isnan(rate)):
        return f"{100 * float(rate):.0f} %"
    return ""


def _cell(row: pd.Series) -> str:
    if row.get("role") == "reference":
        return "(reference)"
    if str(row.get("error") or ""):
        return "error"
    decision = decision_of(row.get("decision"), row.get("contaminated"), "")
    if decision == "not_applicable":
        return "n/a (does not apply)"
    if decision == "inconclusive" or (row.get("n_examples") and row.get("n_failed", 0) >= row["n_examples"]):
        return f"? inconclusive {_evidence(row)}".strip()
    flagged = bool(row["contaminated"])
    word = "yes" if flagged else "no"
    if row["truth"] is None or pd.isna(row["truth"]):
        return f"{word} {_evidence(row)}".strip()
    mark = "✓" if flagged == bool(row["truth"]) else "✗"
    return f"{mark} {word} {_evidence(row)}".strip()


def _header(partition: str, group: pd.DataFrame) -> str:
    judged = group[group.get("role", pd.Series("", index=group.index)) != "reference"]
    first = (judged if len(judged) else group).iloc[0]
    if first["truth"] is None or pd.isna(first["truth"]):
        return f"`{partition}`<br>truth unknown"
    if not bool(first["truth"]):
        return f"`{partition}`<br>clean"
    where = "injected" if first.get("family") == "closed" else "in corpus"
    return f"`{partition}`<br>{where} ×{int(first['duplication'])} {first['kind']}"


def model_table(parts: pd.DataFrame) -> str:
    """The Markdown table of one model's (or corpus's) verdicts."""
    truth_of = {}
    for partition, group in parts.groupby("partition"):
        known = group["truth"].dropna()
        truth_of[partition] = bool(known.iloc[0]) if len(known) else None
    order = (
        parts.assign(_t=parts["partition"].map(lambda p: {True: 0, False: 1}.get(truth_of[p], 2)))
        .sort_values(["_t", "partition"])["partition"]
        .drop_duplicates()
        .tolist()
    )
    heads = [_header(p, parts[parts["partition"] == p]) for p in order]
    lines = ["| method | " + " | ".join(heads) + " | correct |", "|---|" + "---|" * (len(order) + 1)]
    for method, group in parts.groupby("method", sort=True):
        by_partition = {str(r["partition"]): r for _, r in group.iterrows()}
        cells, right, known = [], 0, 0
        for p in order:
            row = by_partition.get(p)
            if row is None:
                cells.append("")
                continue
            shown = _cell(row)
            cells.append(shown)
            if shown.startswith(("✓", "✗")):
                known += 1
                right += int(bool(row["contaminated"]) == bool(row["truth"]))
        lines.append(f"| `{method}` | " + " | ".join(cells) + f" | {right}/{known} |")
    return "\n".join(lines)


def truth_tables(run: LabelledRun) -> str:
    """All tables of a labelled run, closed-data models first, with a one-line summary each."""
    parts = run.partitions
    out = []
    for family in ("closed", "open"):
        for model, group in parts[parts["family"] == family].groupby("model", sort=True):
            what = "Closed-data methods on model" if family == "closed" else "Open-data methods on"
            title = f"{what} `{model}`"
            out += [f"### {title}", "", model_table(group), ""]
    out.append(
        "✓ = verdict matches the truth, ✗ = it does not; ? = the method could not tell (counted in neither). "
        "\"clean\" means not injected: only synthetic_facts is clean "
        "by construction; the base model may have seen public benchmarks in pre-training."
    )
    return "\n".join(out) + "\n"


def write_truth_table(output_dir: str | Path) -> Path:
    """Label a finished run and write its canary table to ``<output_dir>/truth.md``; returns the path."""
    run = label_run(output_dir)
    path = Path(output_dir) / TRUTH_FILE
    path.write_text("## Verdicts against the truth\n\n" + truth_tables(run))
    return path
