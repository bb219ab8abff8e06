"""PNG figures of the report: a heatmap per method, score distributions per partition.

Drawn with matplotlib's object API on the Agg canvas (``Figure`` + ``FigureCanvasAgg``), never
``pyplot``: no GUI backend is needed or touched, nothing global changes in the caller's process (a
Ray driver, a test), and figures are freed when they go out of scope.

- ``heatmap_png``: rows models, columns partitions, the same cells as the method's table. Tested
  methods are coloured by −log10(adjusted p) (darker = stronger evidence; the colour bar marks α), rate
  methods by the contamination rate; every cell is annotated with its table text (``†`` = not flagged).
- ``distribution_png``: one partition, one box per model with the examples drawn over it, of the
  method's per-example score (``contamray.report.scores``).
"""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from contamray.report.tables import MethodTable

CMAP = "YlOrRd"
MAX_LOG_P = 4.0  # colour saturates at p = 1e-4
DPI = 100


def heatmap_png(table: MethodTable, alpha: float, correction: str) -> bytes:
    """The method's table as a heatmap (PNG bytes)."""
    values = table.value_frame()
    n_rows, n_cols = values.shape
    fig = Figure(figsize=(3.2 + 1.25 * max(n_cols, 1), max(2.8, 1.7 + 0.5 * n_rows)), dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if table.kind == "p_value":
        shown = -np.log10(np.clip(values.to_numpy(dtype=float), 10 ** -MAX_LOG_P, 1.0))
        norm = Normalize(0.0, MAX_LOG_P)
        bar_label = "−log10 adjusted p" if correction != "none" else "−log10 p"
    else:
        shown = values.to_numpy(dtype=float)
        norm = Normalize(0.0, 1.0)
        bar_label = "contamination rate"
    image = ax.imshow(np.ma.masked_invalid(shown), cmap=_cmap(), norm=norm, aspect="auto")
    for i, model in enumerate(table.models):
        for j, partition in enumerate(table.partitions):
            cell = table.cells.get((model, partition))
            text = cell.text if cell else ""
            level = shown[i, j]
            dark = not math.isnan(level) and norm(level) > 0.6
            ax.text(j, i, text, ha="center", va="center", fontsize=9, color="white" if dark else "black")
    ax.set_xticks(range(n_cols), labels=table.partitions, rotation=25, ha="right", fontsize=8)
    ax.set_yticks(range(n_rows), labels=table.models, fontsize=9)
    ax.set_title(f"{table.method} ({table.method_name})", fontsize=10)
    bar = fig.colorbar(image, ax=ax, fraction=0.06, pad=0.03, aspect=12)
    bar.ax.tick_params(labelsize=7)
    if table.kind == "p_value":
        bar.ax.axhline(-math.log10(alpha), color="black", linewidth=1.5)
        bar_label += f" (line: α = {alpha:g})"
    bar.set_label(bar_label, fontsize=8)
    fig.tight_layout()
    return _png(fig)


def distribution_png(scores: pd.DataFrame, title: str, xlabel: str, max_points: int = 400) -> bytes:
    """Box plot per model of ``scores`` (columns ``model``, ``score``) with the examples over it."""
    models = sorted(scores["model"].unique(), key=lambda m: (m.startswith("corpus:"), m))
    fig = Figure(figsize=(6.4, 1.3 + 0.55 * len(models)), dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    data = [scores.loc[scores["model"] == m, "score"].to_numpy(dtype=float) for m in models]
    ax.boxplot(data, orientation="horizontal", widths=0.6, showfliers=False)
    rng = np.random.default_rng(0)  # jitter only; fixed so the same data draws the same figure
    for k, values in enumerate(data, start=1):
        shown = values if len(values) <= max_points else rng.choice(values, max_points, replace=False)
        ax.scatter(shown, k + rng.uniform(-0.18, 0.18, len(shown)), s=8, alpha=0.5, color="tab:red", linewidths=0)
    ax.set_yticks(range(1, len(models) + 1), labels=[f"{m} (n={len(v)})" for m, v in zip(models, data)], fontsize=8)
    ax.invert_yaxis()  # first model on top, as in the tables
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def _cmap():  # noqa: ANN202 - a matplotlib Colormap
    from matplotlib import colormaps

    return colormaps[CMAP].with_extremes(bad="#dddddd")


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()
