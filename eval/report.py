"""Write the artifacts of an evaluation run: ``summary.json``, ``report.md``, ``report.html``, plots.

Files written into the output folder by :func:`write_report`:

- ``summary.json``: the machine-readable result (schema in :mod:`eval.summary`);
- ``per_query.json``: ``{"<mode>": {"<query id>": {metric: value, "latency_ms": ms}}}``;
- ``queries.json``: the per-query view (:func:`eval.per_query.per_query_view`): each query's
  text, metric per mode, retrieved ids, relevant ids with their rank per mode and per channel;
  the worst queries and those where hybrid lost to a single channel;
- ``quality.png``: nDCG@10 / Recall@100 per mode with the published numbers as lines;
- ``latency.png``: per-query latency distribution per mode;
- ``report.md``: our modes and the published reference numbers side by side, the plots embedded,
  ANN vs exact, the per-query summary, the run's environment and (``quarry eval --answers``) the
  answers section;
- ``report.html``: all of it and the full per-query view in one self-contained page (:mod:`eval.html`);
- with a baseline run: ``compare.json`` and ``compare.html`` (:mod:`eval.compare`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.answers_report import render_answers_md
from eval.compare import Comparison, write_comparison
from eval.per_query import hybrid_losses, per_query_view, query_rows, worst_mode, worst_queries
from eval.reference import References
from eval.summary import Summary
from quarry.errors import missing_extra

SUMMARY_JSON = "summary.json"
PER_QUERY_JSON = "per_query.json"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
QUERIES_JSON = "queries.json"
QUALITY_PNG = "quality.png"
LATENCY_PNG = "latency.png"
_WORST_MD = 10


ARTIFACTS = (SUMMARY_JSON, PER_QUERY_JSON, QUERIES_JSON, REPORT_MD, REPORT_HTML, QUALITY_PNG, LATENCY_PNG)


def require_plots() -> None:
    """Check that the plots, the HTML report and the statistics can be made before a run spends time searching.

    Raises:
        ConfigError: matplotlib, jinja2 or scipy is not installed; the message names the extra
            (``pip install 'quarry[eval]'``).
    """
    try:
        import jinja2  # noqa: F401  (report.html)
        import scipy.stats  # noqa: F401  (the run comparison's tests)

        import eval.plots  # noqa: F401  (matplotlib: the `eval` extra)
    except ImportError as exc:
        raise missing_extra(exc.name or "matplotlib", "eval") from exc


@dataclass(frozen=True)
class ReportFiles:
    """Paths of the files :func:`write_report` wrote."""

    summary_json: Path
    per_query_json: Path
    report_md: Path
    quality_png: Path
    latency_png: Path
    report_html: Path
    queries_json: Path
    compare_json: Path | None = None
    compare_html: Path | None = None


def _md(text: str) -> str:
    """Escape a table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _ours_table(summary: Summary) -> list[str]:
    lines = [
        "| mode | nDCG@10 | Recall@10 | Recall@100 | MRR@10 | p50 ms | p95 ms | queries |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in summary.modes.items():
        m = r.metrics
        lines.append(
            f"| {_md(name)} | {m['ndcg@10']:.4f} | {m['recall@10']:.4f} | {m['recall@100']:.4f} "
            f"| {m['mrr@10']:.4f} | {r.p50_ms:.2f} | {r.p95_ms:.2f} | {len(r.per_query)} |"
        )
    return lines


def _side_by_side(summary: Summary, refs: References) -> list[str]:
    split = summary.config.get("split", "")
    lines = ["| system (model) | nDCG@10 | R@100 | source |", "|---|---|---|---|"]
    for name, r in summary.modes.items():
        lines.append(
            f"| **Quarry `{_md(name)}`** | **{r.metrics['ndcg@10']:.4f}** "
            f"| **{r.metrics['recall@100']:.4f}** | this run ({_md(str(split))} split) |"
        )
    for row in refs.rows:
        status = f" ({_md(row.status)})" if row.status else ""
        lines.append(
            f"| {_md(row.system)} | {_md(row.ndcg_text)} | {_md(row.recall_text)} "
            f"| {_md(row.source)}{status} |"
        )
    return lines


def _reference_note(summary: Summary, refs: References) -> list[str]:
    if refs.heading is None:
        return ["_No published numbers found for this dataset in REFERENCE_SCORES.md._", ""]
    note = [
        f"Published numbers: REFERENCE_SCORES.md, section *{_md(refs.heading)}*. They are references "
        "for orientation, each with its own system and model, not targets."
    ]
    if summary.config.get("split") != "test":
        note.append("They are for the **test** split unless the source says otherwise.")
    lines = [" ".join(note), ""]
    if refs.notes and not refs.rows:  # why a section has no numbers; the curator's other prose stays in the file
        lines += [f"> {refs.notes}", ""]
    return lines


def render_report_md(summary: Summary, refs: References, images: dict[str, str]) -> str:
    """Render ``report.md``.

    Args:
        summary: The run.
        refs: Published numbers of the dataset (may be empty).
        images: Caption -> image path relative to the report.

    Returns:
        The Markdown text.
    """
    cfg = summary.config
    lines = [f"# Evaluation: {cfg.get('dataset', '?')} ({cfg.get('split', '?')} split)", ""]
    lines += ["## Our modes", "", *_ours_table(summary), ""]
    lines += ["## Side by side with published reference numbers", "", *_reference_note(summary, refs)]
    lines += [*_side_by_side(summary, refs), ""]
    lines += _ann_md(summary.ann_vs_exact)
    lines += _per_query_md(summary)
    if summary.answers is not None:
        lines += render_answers_md(summary.answers)
    lines += ["## Plots", ""]
    lines += [f"![{caption}]({target})\n" for caption, target in images.items()]
    lines += _environment_md(cfg.get("environment"))
    lines += ["## Config", "", "```json", json.dumps(cfg, indent=2, sort_keys=True, default=str)]
    lines += ["```", ""]
    return "\n".join(lines)


def _ann_md(ann: dict[str, Any] | None) -> list[str]:
    if ann is None:
        return []
    spec = ann.get("index")
    index = "none (the store searches exactly)" if not spec else f"{spec['kind']} {spec.get('params') or ''}".strip()
    index += " (an exact scan)" if spec and spec["kind"] == "FLAT" else ""
    lines = ["## ANN vs exact search", "", f"Index: {_md(index)}; exact search: {ann.get('exact')}.", ""]
    if "skipped" in ann:
        return [*lines, f"_Skipped: {_md(str(ann['skipped']))}._", ""]
    ks = list(ann["recall"])
    lines += ["| " + " | ".join(f"recall@{k}" for k in ks) + " | index ms/query | exact ms/query |"]
    lines += ["|" + "---|" * (len(ks) + 2)]
    ms = ann["ms_per_query"]
    cells = [f"{ann['recall'][k]:.4f}" for k in ks] + [f"{ms['index']:.3f}", f"{ms['exact']:.3f}"]
    return [*lines, "| " + " | ".join(cells) + " |", "", f"{ann['vectors']} vectors, {ann['queries']} queries.", ""]


def _per_query_md(summary: Summary) -> list[str]:
    if not summary.qrels or not summary.modes:
        return []
    rows = query_rows(summary)
    mode = worst_mode(summary)
    lines = ["## Per query (nDCG@10)", "", f"The full view is in report.html and {QUERIES_JSON}.", ""]
    losses = hybrid_losses(rows)
    if "hybrid" in summary.modes:
        lines += [f"Hybrid scored below a single channel on {len(losses)} of {len(rows)} queries.", ""]
    lines += [f"Worst {_WORST_MD} queries of {_md(mode)}:", "", "| query | text | " + " | ".join(summary.modes) + " |"]
    lines += ["|" + "---|" * (len(summary.modes) + 2)]
    for row in worst_queries(rows, mode, _WORST_MD):
        scores = " | ".join(f"{row.scores[m]:.4f}" for m in summary.modes)
        lines.append(f"| {_md(row.qid)} | {_md(row.text[:80])} | {scores} |")
    return [*lines, ""]


def _environment_md(env: dict[str, Any] | None) -> list[str]:
    if not env:
        return []
    git = env.get("git")
    commit = f", commit `{git['commit']}`{' (uncommitted changes)' if git.get('dirty') else ''}" if git else ""
    hw = env.get("hardware", {})
    gpus = ", ".join(hw.get("gpus") or []) or "none"
    return [
        "## Environment",
        "",
        f"- Quarry {env.get('quarry_version')}{commit}",
        f"- {hw.get('cpu')}, {hw.get('cores')} cores ({hw.get('cores_usable')} usable), "
        f"{hw.get('memory_gib')} GiB memory, GPU: {gpus}",
        f"- Latency: {env.get('latency_method')}",
        "",
    ]


def _per_query(summary: Summary) -> dict[str, Any]:
    return {
        name: {
            qid: {**scores, "latency_ms": r.latencies_ms.get(qid)}
            for qid, scores in r.per_query.items()
        }
        for name, r in summary.modes.items()
    }


def write_report(
    summary: Summary, refs: References, out_dir: Path, comparison: Comparison | None = None
) -> ReportFiles:
    """Write all artifacts of a run into ``out_dir`` (created if needed; files overwritten).

    Args:
        summary: The run.
        refs: Published numbers of the dataset (may be empty).
        out_dir: The output folder.
        comparison: This run against a baseline: also written as ``compare.json``/``compare.html``.

    Returns:
        The paths written.

    Raises:
        ConfigError: matplotlib, jinja2 or scipy is not installed (the ``eval`` extra).
        OSError: ``out_dir`` cannot be created or written.
    """
    require_plots()
    from eval.html import render_report_html
    from eval.plots import plot_latency, plot_quality

    out_dir.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(
        summary_json=out_dir / SUMMARY_JSON,
        per_query_json=out_dir / PER_QUERY_JSON,
        report_md=out_dir / REPORT_MD,
        quality_png=out_dir / QUALITY_PNG,
        latency_png=out_dir / LATENCY_PNG,
        report_html=out_dir / REPORT_HTML,
        queries_json=out_dir / QUERIES_JSON,
    )
    dump = json.dumps(summary.to_dict(), indent=2, default=str)
    files.summary_json.write_text(dump + "\n", encoding="utf-8")
    files.per_query_json.write_text(json.dumps(_per_query(summary)) + "\n", encoding="utf-8")
    plot_quality(summary, refs, files.quality_png)
    plot_latency(summary, files.latency_png)
    images = {"nDCG@10 and Recall@100 per mode": QUALITY_PNG, "Latency per query": LATENCY_PNG}
    files.report_md.write_text(render_report_md(summary, refs, images), encoding="utf-8")
    files.queries_json.write_text(json.dumps(per_query_view(summary)) + "\n", encoding="utf-8")
    pngs = {caption: out_dir / name for caption, name in images.items()}
    files.report_html.write_text(render_report_html(summary, refs, pngs, comparison), encoding="utf-8")
    if comparison is not None:
        compare_json, compare_html = write_comparison(comparison, out_dir)
        files = dataclasses.replace(files, compare_json=compare_json, compare_html=compare_html)
    return files
