"""PNG plots of an evaluation run, drawn with matplotlib's object API on the Agg canvas.

No ``pyplot``: each plot builds its own :class:`~matplotlib.figure.Figure` on a
:class:`~matplotlib.backends.backend_agg.FigureCanvasAgg`, so nothing touches the global
backend state and plotting works headless and from threads.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from eval.reference import ReferenceRow, References
from eval.summary import Summary

_LABEL_WIDTH = 52  # characters per line of a legend label (wrapped, never cut)
_SAME_LINE = 0.002  # published numbers closer than this share one dashed line (and one legend entry)
_LOG_SCALE_RATIO = 50.0


def _wrap(text: str) -> str:
    return "\n".join(textwrap.wrap(text, _LABEL_WIDTH)) or text


def reference_lines(refs: References, metric: str) -> list[tuple[float, list[str]]]:
    """The dashed lines of one metric: each value with the systems that published it, lowest first.

    Values within :data:`_SAME_LINE` of each other are one line (two systems at 0.925 and 0.9253
    would otherwise draw over each other); its value is the first system's.
    """
    points = sorted((v, row.system) for row in refs.rows if (v := _reference_value(row, metric)) is not None)
    lines: list[tuple[float, list[str]]] = []
    for value, system in points:
        if lines and value - lines[-1][0] < _SAME_LINE:
            lines[-1][1].append(system)
        else:
            lines.append((value, [system]))
    return lines


def _reference_value(row: ReferenceRow, metric: str) -> float | None:
    return row.ndcg_at_10 if metric == "ndcg@10" else row.recall_at_100


def _quality_axis(ax: Axes, summary: Summary, refs: References, metric: str, title: str) -> None:
    """Draw one metric's bars per mode plus one dashed line per published number."""
    names = list(summary.modes)
    values = [summary.modes[name].metrics[metric] for name in names]
    bars = ax.bar(names, values, color="#4C72B0", width=0.6, zorder=2)
    labels = [f"{v:.3f}" for v in values]
    ax.bar_label(bars, labels=labels, label_type="center", color="white", fontweight="bold", zorder=4,
                 bbox={"facecolor": "#4C72B0", "edgecolor": "none", "pad": 2})  # a line never crosses the value
    shown = list(values)
    styles = ("--", "-.", ":")
    for i, (value, systems) in enumerate(reference_lines(refs, metric)):
        shown.append(value)
        label = _wrap(f"{value:.3f}: " + "; ".join(systems))
        ax.axhline(value, color=f"C{i % 10}", linestyle=styles[i % len(styles)], linewidth=1.2, label=label,
                   zorder=3)
    # Zoom on the range that holds the numbers: differences of 0.01 matter here.
    bottom = max(0.0, math.floor((min(shown) - 0.05) * 10) / 10)
    ax.set_ylim(bottom, 1.02)
    ax.set_title(title + (f" (y axis from {bottom:.1f})" if bottom > 0 else ""))
    ax.grid(axis="y", alpha=0.3, zorder=0)
    if ax.get_legend_handles_labels()[0]:  # below the plot, labels whole (wrapped), highest value first
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles[::-1], labels[::-1], loc="upper center", bbox_to_anchor=(0.5, -0.06), fontsize=8,
                  frameon=False, handlelength=3)


def plot_quality(summary: Summary, refs: References, path: Path) -> Path:
    """Bar chart of nDCG@10 and Recall@100 per mode with the published numbers as lines.

    Args:
        summary: The run.
        refs: Published numbers of the dataset (may be empty).
        path: Where to write the PNG.

    Returns:
        ``path``.
    """
    fig = Figure(figsize=(14, 10), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    _quality_axis(left, summary, refs, "ndcg@10", "nDCG@10")
    _quality_axis(right, summary, refs, "recall@100", "Recall@100")
    split = summary.config.get("split", "?")
    fig.suptitle(
        f"{summary.config.get('dataset', '')} ({split}): ours (bars); published references, not targets (dashed)"
    )
    fig.savefig(path, format="png", dpi=110)
    return path


def plot_latency(summary: Summary, path: Path) -> Path:
    """Box plot of per-query search latency per mode (whiskers at p5/p95), p50/p95 annotated.

    Args:
        summary: The run; each mode's ``latencies_ms`` are plotted.
        path: Where to write the PNG.

    Returns:
        ``path``.
    """
    fig = Figure(figsize=(8, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    names = list(summary.modes)
    data = [list(summary.modes[name].latencies_ms.values()) or [0.0] for name in names]
    ax.boxplot(data, tick_labels=names, whis=(5, 95), flierprops={"markersize": 2})
    for x, name in enumerate(names, start=1):
        result = summary.modes[name]
        ax.annotate(
            f"p50 {result.p50_ms:.2f}\np95 {result.p95_ms:.2f}",
            xy=(x, result.p95_ms),
            xytext=(14, 0),
            textcoords="offset points",
            fontsize=8,
        )
    positive = [v for values in data for v in values if v > 0]
    if positive and max(positive) / min(positive) > _LOG_SCALE_RATIO:
        ax.set_yscale("log")
    ax.set_ylabel("latency per query (ms)")
    ax.set_title("Search latency per query (box: p25-p75, whiskers: p5-p95)")
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, format="png", dpi=110)
    return path
