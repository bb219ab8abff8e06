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

from contamray.report.runs import details_summary

COLUMNS = (
    "model", "partition", "method", "contaminated", "p_value", "rate", "statistic", "n_examples", "n_failed", "how",
)  # fmt: skip


def render_report(partitions: pd.DataFrame, config_yaml: str, title: str = "contamray run") -> str:
    lines = [f"# {title}", ""]
    if partitions.empty:
        lines += ["No cells were run.", ""]
    else:
        lines += [
            "Each row answers: was this benchmark partition in this model's training data (or, for",
            "open-data methods, in this corpus)? `p_value` is the method's test; `rate` the share of",
            "examples found contaminated; `statistic` the method's own effect size.",
            "",
            "| " + " | ".join(COLUMNS) + " |",
            "|" + "---|" * len(COLUMNS),
        ]
        for _, row in partitions.sort_values(["model", "partition", "method"]).iterrows():
            values = {**row.to_dict(), "how": details_summary(row.get("details")) or None}
            lines.append("| " + " | ".join(_cell(values.get(c)) for c in COLUMNS) + " |")
        errors = [(r["model"], r["partition"], r["method"], r["error"]) for _, r in partitions.iterrows()
                  if isinstance(r.get("error"), str) and r.get("error")]
        if errors:
            lines += ["", "## Failed cells", ""]
            lines += [f"- {m} / {p} / {meth}: {e}" for m, p, meth, e in errors]
        lines.append("")
    lines += ["## Resolved config", "", "```yaml", config_yaml.rstrip(), "```", ""]
    return "\n".join(lines)


def write_report(output_dir: str | Path, partitions: pd.DataFrame, config_yaml: str, title: str) -> Path:
    path = Path(output_dir) / "report.md"
    path.write_text(render_report(partitions, config_yaml, title))
    return path


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
