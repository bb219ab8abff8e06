"""``report.html``: the cross-model report a person opens in a browser, no Python needed.

``write_html_report(run_dirs, out_dir, correction, alpha)`` merges the runs (``runs.load_runs``),
corrects the grid's p-values (``correction``), builds one table per method (``tables``), draws the
heatmaps and score distributions (``plots``) and writes into ``out_dir``:

- ``report.html``: one self-contained file (CSS inline, every PNG embedded as base64, no script, no
  external link), so it can be mailed or opened from an object store as it is;
- ``tables.md``: the same tables in Markdown; ``cells.csv``: every cell with raw and adjusted p-values;
- ``plots/heatmap_<method>.png`` and ``plots/scores_<method>_<partition>.png``: the figures.

In the HTML every table cell carries ``data-model``, ``data-partition`` and ``data-method`` attributes
and a class (``flagged``, ``not-flagged``, ``missing``, ``error``), so the page can be checked by a
machine as well as read.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from contamray.report import plots
from contamray.report.correction import TITLES, check_correction
from contamray.report.runs import RunSet, load_runs
from contamray.report.scores import declared_score, example_scores, filled_columns, score_spec
from contamray.report.tables import (
    NOT_FLAGGED,
    MethodTable,
    annotate,
    describe,
    method_tables,
    out_of_reach,
    render_markdown,
)

log = logging.getLogger("contamray")

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px 32px; color: #1a1a1a;
       max-width: 1500px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 36px; border-bottom: 1px solid #ccc; }
h3 { font-size: 15px; }
p.meta, p.note { color: #444; font-size: 13px; }
table { border-collapse: collapse; margin: 10px 0 16px; font-size: 13px; }
th, td { border: 1px solid #bbb; padding: 4px 9px; text-align: center; }
th { background: #f2f2f2; font-weight: 600; }
td.model { text-align: left; font-weight: 600; background: #fafafa; }
td.flagged { font-weight: 700; }
td.not-flagged { color: #777; }
td.missing, td.error, td.inconclusive, td.not-applicable { color: #999; font-style: italic; }
table.long td { text-align: left; font-size: 12px; }
figure { margin: 8px 0 20px; }
figcaption { font-size: 12px; color: #555; }
div.dists { display: flex; flex-wrap: wrap; gap: 12px; }
a { color: #222; }
"""


@dataclass
class ReportFiles:
    html: Path
    markdown: Path
    cells_csv: Path
    pngs: list[Path] = field(default_factory=list)


def write_html_report(run_dirs: list[Path], out_dir: Path, correction: str = "holm", alpha: float = 0.05) -> Path:
    """Merge ``run_dirs`` into ``out_dir``/report.html (plus tables.md, cells.csv, plots/); returns its path."""
    return build_report(run_dirs, out_dir, correction, alpha).html


def build_report(
    run_dirs: Sequence[str | Path], out_dir: str | Path, correction: str = "holm", alpha: float = 0.05
) -> ReportFiles:
    """Everything ``write_html_report`` writes, with the paths of every file."""
    correction, alpha = check_correction(correction, alpha)
    runs = load_runs(run_dirs)
    out = Path(out_dir)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    annotated = annotate(runs.partitions, correction, alpha)
    tables = method_tables(annotated) if len(annotated) else []
    files = ReportFiles(out / "report.html", out / "tables.md", out / "cells.csv")
    files.markdown.write_text(render_markdown(tables, annotated, runs.notes))
    _long_table(annotated).to_csv(files.cells_csv, index=False)

    sections = []
    notes = list(runs.notes)
    for table in tables:
        heat = plots.heatmap_png(table, alpha, correction)
        heat_path = out / "plots" / f"heatmap_{_slug(table.method)}.png"
        heat_path.write_bytes(heat)
        files.pngs.append(heat_path)
        dists, note = _distributions(runs, table, out, files)
        if note:
            notes.append(note)
        sections.append(_section(table, heat, dists, correction, alpha, int(annotated.attrs["n_tests"])))
    page = _page(runs, annotated, tables, sections, notes, correction, alpha)
    files.html.write_text(page, encoding="utf-8")
    log.info("report: %s", files.html)
    return files


# ---------------------------------------------------------------------------------------------


def _distributions(
    runs: RunSet, table: MethodTable, out: Path, files: ReportFiles
) -> tuple[list[tuple[str, bytes]], str]:
    """(partition, PNG) per partition of ``table`` with scored examples, and a note when there are none."""
    columns = runs.example_columns(table.method)
    if not columns:
        return [], f"{table.method}: no examples.parquet in the runs; no score distributions"
    declared = declared_score(table.method_name)
    if declared is None:
        return [], f"{table.method}: {table.method_name} declares no per-example score; no score distributions"
    frame = runs.examples(table.method, declared.columns)
    spec = score_spec(table.method_name, filled_columns(frame))
    if spec is None or frame.empty:
        return [], f"{table.method}: the examples have no values in {declared.column}; no score distributions"
    scores = example_scores(frame, spec)
    frame = frame.loc[scores.index, ["model", "partition"]].assign(score=scores.to_numpy())
    out_list = []
    for partition in table.partitions:
        part = frame[frame["partition"] == partition]
        if part.empty:
            continue
        png = plots.distribution_png(part, f"{table.method} · {partition}", spec.label)
        path = out / "plots" / f"scores_{_slug(table.method)}_{_slug(partition)}.png"
        path.write_bytes(png)
        files.pngs.append(path)
        out_list.append((partition, png))
    return out_list, ""


def _section(
    table: MethodTable, heat: bytes, dists: list[tuple[str, bytes]], correction: str, alpha: float, n_tests: int
) -> str:
    e = html.escape
    anchor = _slug(table.method)
    head = "".join(f"<th>{e(p)}</th>" for p in table.partitions)
    rows = []
    for model in table.models:
        tds = [f'<td class="model">{e(model)}</td>']
        for partition in table.partitions:
            cell = table.cells.get((model, partition))
            if cell is None:
                tds.append(f'<td class="missing" data-model="{e(model)}" data-partition="{e(partition)}"></td>')
                continue
            css = cell.status.replace("_", "-")
            tds.append(
                f'<td class="{css}" data-model="{e(model)}" data-partition="{e(partition)}" '
                f'data-method="{e(table.method)}" title="{e(cell.tooltip)}">{e(cell.text)}</td>'
            )
        rows.append("<tr>" + "".join(tds) + "</tr>")
    parts = [
        f'<section id="method-{anchor}">',
        f"<h2>{e(table.method)} <small>({e(table.method_name)})</small></h2>",
        f'<p class="note">{e(describe(table, correction, alpha, n_tests))} Hover a cell for the raw p-value, '
        "statistic and counts.</p>",
        f'<table class="grid" id="table-{anchor}"><thead><tr><th>model</th>{head}</tr></thead>',
        "<tbody>" + "".join(rows) + "</tbody></table>",
        f'<figure><img id="heatmap-{anchor}" alt="heatmap of {e(table.method)}" src="{_data_uri(heat)}">',
        f"<figcaption>Heatmap of {e(table.method)}: {_heat_caption(table, correction)}</figcaption></figure>",
    ]
    if dists:
        parts.append(f"<h3>Per-example scores of {e(table.method)}, per partition</h3><div class=\"dists\">")
        for partition, png in dists:
            parts.append(
                f'<figure><img class="scores" alt="scores of {e(table.method)} on {e(partition)}" '
                f'src="{_data_uri(png)}"><figcaption>{e(partition)}</figcaption></figure>'
            )
        parts.append("</div>")
    parts.append("</section>")
    return "\n".join(parts)


def _heat_caption(table: MethodTable, correction: str) -> str:
    if table.kind == "p_value":
        what = "−log10 of the adjusted p-value" if correction != "none" else "−log10 of the p-value"
        return f"colour = {what} (darker = stronger evidence of contamination); {NOT_FLAGGED} = not significant."
    return f"colour = contamination rate; {NOT_FLAGGED} = the method's decision was 'clean'."


def _page(
    runs: RunSet,
    annotated: pd.DataFrame,
    tables: list[MethodTable],
    sections: list[str],
    notes: list[str],
    correction: str,
    alpha: float,
) -> str:
    e = html.escape
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    runs_list = "".join(f"<li><code>{e(str(d))}</code></li>" for d in runs.run_dirs)
    nav = " · ".join(f'<a href="#method-{_slug(t.method)}">{e(t.method)}</a>' for t in tables)
    n_models = annotated["model"].nunique() if len(annotated) else 0
    n_parts = annotated["partition"].nunique() if len(annotated) else 0
    body = [
        "<h1>contamray: benchmark contamination report</h1>",
        f'<p class="meta">{len(annotated)} cells: {n_models} models/corpora × {n_parts} partitions × '
        f"{len(tables)} methods. Multiple-testing correction: {e(TITLES[correction])}, α = {alpha:g}, "
        f"{int(annotated.attrs.get('n_tests', 0))} tests in the grid. Generated {now}.</p>",
        f'<p class="meta">Runs merged (a cell present in several runs is taken from the last):</p><ul>{runs_list}</ul>',
        f'<p class="meta">Methods: {nav}</p>' if nav else "<p>No cells in these runs.</p>",
        *sections,
    ]
    unreachable = out_of_reach(annotated)
    if unreachable:
        items = "".join(f"<li>{e(m)} / {e(p)} / {e(meth)}: {e(why)}</li>" for m, p, meth, why in unreachable)
        title = "Out of reach after the correction (shown as inconclusive)"
        body.append(f'<h2 id="out-of-reach">{title}</h2><ul>{items}</ul>')
    if len(annotated):
        body.append('<h2 id="cells">All cells</h2>' + _long_table(annotated).pipe(_html_long_table))
    errors = annotated[annotated["error"] != ""] if len(annotated) else annotated
    if len(errors):
        items = "".join(
            f"<li>{e(r.model)} / {e(r.partition)} / {e(r.method)}: {e(r.error)}</li>" for r in errors.itertuples()
        )
        body.append(f'<h2 id="errors">Failed cells</h2><ul>{items}</ul>')
    if notes:
        body.append('<h2 id="notes">Notes</h2><ul>' + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<title>contamray report</title>"
        f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


LONG_COLUMNS = [
    "model", "partition", "method", "method_name", "decision", "reason", "p_value", "p_adjusted", "flagged", "rate",
    "statistic", "n_examples", "n_failed", "error", "min_p", "p_reachable", "out_of_reach", "reach_reason", "run",
]


def _long_table(annotated: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in LONG_COLUMNS if c in annotated.columns]
    return annotated[cols].sort_values(["method", "model", "partition"]).reset_index(drop=True)


def _html_long_table(frame: pd.DataFrame) -> str:
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in frame.columns)
    rows = []
    for _, row in frame.iterrows():
        rows.append("<tr>" + "".join(f"<td>{e(_plain(row[c]))}</td>" for c in frame.columns) + "</tr>")
    return f'<table class="long" id="cells-table"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _plain(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if value != value:  # NaN
            return ""
        return f"{value:.4g}"
    return str(value)


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"
