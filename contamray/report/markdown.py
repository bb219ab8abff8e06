"""``report.md``: the run's verdicts as a table a person reads first, then the resolved config.

One line per model × partition × method with the decision, p-value, contamination rate and how many
examples were scored or failed; failed cells say why. ``how`` is the verdict's own summary where the
method gives one (the sharded likelihood test: which permutation variant produced the p-value and the
order-structure diagnosis of the partition). The resolved config closes the report so the
run can be reproduced from the report alone.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from contamray.report.runs import corpus_note, details_summary
from contamray.report.runs import decision_of as _decide

COLUMNS = (
    "model", "partition", "method", "decision", "p_value", "rate", "statistic", "n_examples", "n_failed", "how",
)  # fmt: skip
DECISION_TEXT = {"contaminated": "**contaminated**", "inconclusive": "_inconclusive_", "not_applicable": "n/a"}


def render_report(
    partitions: pd.DataFrame, config_yaml: str, title: str = "contamray run", corpus: str = ""
) -> str:
    """The report's text; ``corpus``: what the corpus scan could not read (``runs.corpus_note``), if anything."""
    lines = [f"# {title}", ""]
    if partitions.empty:
        lines += ["No cells were run.", ""]
    else:
        lines += [
            "Each row answers: was this benchmark partition in this model's training data (or, for",
            "open-data methods, in this corpus)? `decision` is the method's own: contaminated, clean, or",
            "inconclusive when the data could not tell (the reason is listed below); `p_value` is the",
            "method's test; `rate` the share of examples found contaminated; `statistic` the method's own",
            "effect size; `how` what was compared.",
            "",
            "| " + " | ".join(COLUMNS) + " |",
            "|" + "---|" * len(COLUMNS),
        ]
        for _, row in partitions.sort_values(["model", "partition", "method"]).iterrows():
            values = {**row.to_dict(), "how": details_summary(row.get("details")) or None}
            values["decision"] = DECISION_TEXT.get(decision_of(row), decision_of(row))
            lines.append("| " + " | ".join(_cell(values.get(c)) for c in COLUMNS) + " |")
        reasons = [
            (r["model"], r["partition"], r["method"], decision_of(r), r.get("reason"))
            for _, r in partitions.sort_values(["model", "partition", "method"]).iterrows()
            if decision_of(r) in ("inconclusive", "not_applicable") and isinstance(r.get("reason"), str)
        ]
        if reasons:
            lines += ["", "## Undecided and skipped cells", ""]
            lines += [f"- {m} / {p} / {meth}: {d} - {why}" for m, p, meth, d, why in reasons]
        errors = [(r["model"], r["partition"], r["method"], r["error"]) for _, r in partitions.iterrows()
                  if isinstance(r.get("error"), str) and r.get("error")]
        if errors:
            lines += ["", "## Failed cells", ""]
            lines += [f"- {m} / {p} / {meth}: {e}" for m, p, meth, e in errors]
        if corpus:
            lines += ["", "## Corpus documents not read", "", corpus]
        lines.append("")
    lines += ["## Resolved config", "", "```yaml", config_yaml.rstrip(), "```", ""]
    return "\n".join(lines)


def write_report(output_dir: str | Path, partitions: pd.DataFrame, config_yaml: str, title: str) -> Path:
    path = Path(output_dir) / "report.md"
    path.write_text(render_report(partitions, config_yaml, title, corpus_note(output_dir)))
    return path


def decision_of(row: Any) -> str:
    """The row's decision (``decision`` column; runs from before it existed: ``contaminated``)."""
    error = row.get("error")
    return _decide(row.get("decision"), row.get("contaminated"), error if isinstance(error, str) else "")


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "**yes**" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{value:.3g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"
    return str(value)
