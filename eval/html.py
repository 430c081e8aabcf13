"""Self-contained HTML of an evaluation run and of a comparison (and the templates), rendered with Jinja2.

The templates live in ``eval/templates`` (autoescaped). A page needs nothing but itself: the CSS is
inline, the plots are ``data:image/png;base64`` URIs, and no script, font or stylesheet is fetched,
so it opens offline and can be mailed or archived as one file.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from eval.answers_report import ANSWERS_COLUMNS, PER_QUERY_COLUMNS, answers_row, detail_rows, intro, per_query_cells
from eval.compare import FLIP_K, Comparison
from eval.metrics import METRICS
from eval.per_query import SHOWN_IDS, hybrid_losses, per_query_view, query_rows, worst_mode, worst_queries
from eval.reference import References
from eval.summary import Summary
from quarry.errors import missing_extra

WORST_SHOWN = 20
ALL_SHOWN = 1000
"""Queries in the page's full per-query table (split order); ``queries.json`` holds every one."""


def _environment() -> Any:
    try:
        import jinja2
    except ImportError as exc:
        raise missing_extra(exc.name or "jinja2", "eval") from exc
    return jinja2.Environment(
        loader=jinja2.PackageLoader("eval", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def template(name: str) -> Any:
    """The autoescaped Jinja2 template ``name`` of ``eval/templates``.

    Raises:
        ConfigError: jinja2 is not installed (the ``eval`` extra).
    """
    return _environment().get_template(name)


def png_data_uri(path: Path) -> str:
    """A PNG file as a ``data:image/png;base64,...`` URI."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def render_report_html(
    summary: Summary, refs: References, images: dict[str, Path], comparison: Comparison | None = None
) -> str:
    """Render ``report.html``: modes, plots, references, ANN vs exact, comparison, per-query view, config.

    Args:
        summary: The run (with its rankings, for the per-query view).
        refs: Published numbers of the dataset (may be empty).
        images: Caption -> PNG file, inlined.
        comparison: This run against a baseline run, when one was given.

    Returns:
        The HTML text.

    Raises:
        ConfigError: jinja2 is not installed (the ``eval`` extra).
    """
    rows = query_rows(summary)
    cfg = summary.config
    env = cfg.get("environment") or {"quarry_version": "unknown", "git": None, "latency_method": "not recorded"}
    hw = env.get("hardware") or {"cpu": "?", "cores": "?", "cores_usable": "?", "memory_gib": "?", "gpus": [],
                                 "platform": "?", "python": "?"}
    template = _environment().get_template("report.html.j2")
    return str(
        template.render(
            summary=summary,
            cfg=_Defaulted(cfg),
            env=env,
            hw=hw,
            metrics=METRICS,
            refs=refs,
            images={caption: png_data_uri(path) for caption, path in images.items()},
            ann=summary.ann_vs_exact,
            comparison=comparison,
            view={"metric": "ndcg@10", "worst_mode": worst_mode(summary)},
            modes=list(summary.modes),
            rows=rows[:ALL_SHOWN],
            total=len(rows),
            worst=worst_queries(rows, worst_mode(summary), WORST_SHOWN),
            losses=hybrid_losses(rows),
            relevant_ids={qid: {d for d, g in docs.items() if g > 0} for qid, docs in summary.qrels.items()},
            shown=SHOWN_IDS,
            answers=_answers_view(summary.answers),
            answers_json=json.dumps(summary.answers, indent=2, default=str),
            config_json=json.dumps(cfg, indent=2, sort_keys=True, default=str),
        )
    )


ANSWER_TEXT_SHOWN = 400
"""Characters of a question or an answer shown in the page's per-query answers table (summary.json: all)."""


def _answers_view(section: dict[str, Any] | None) -> dict[str, Any] | None:
    """The answers section's cells for the template (:mod:`eval.answers_report`), or ``None``."""
    if section is None:
        return None
    return {
        "intro": intro(section), "columns": ANSWERS_COLUMNS, "row": answers_row(section),
        "detail": detail_rows(section),
        "per_query_columns": PER_QUERY_COLUMNS, "skipped": section["abstention"].get("skipped"),
        "rows": [per_query_cells(r, ANSWER_TEXT_SHOWN) for r in section["per_query"]], "errors": section["errors"],
    }


def render_compare_html(comparison: Comparison) -> str:
    """Render ``compare.html``: the comparison table, the flipped queries and the config difference.

    Raises:
        ConfigError: jinja2 is not installed (the ``eval`` extra).
    """
    template = _environment().get_template("compare.html.j2")
    return str(
        template.render(
            comparison=comparison,
            flip_k=FLIP_K,
            config_diff={k: {side: json.dumps(v, default=str) for side, v in pair.items()}
                         for k, pair in comparison.config_diff.items()},
        )
    )


class _Defaulted(dict[str, Any]):
    """A run config whose missing keys read as ``"?"`` in the template (toy runs lack some)."""

    def __getattr__(self, key: str) -> Any:
        return self.get(key, "?")


__all__ = ["per_query_view", "png_data_uri", "render_compare_html", "render_report_html", "template"]
