"""The answers section as the reports show it: one set of cells for ``report.md`` and ``report.html``.

From ``summary.json["answers"]`` (:mod:`eval.answers`):

- :func:`intro`: what was asked of which LLM;
- :func:`answers_row`: the run's row of the answers table, one cell per :data:`ANSWERS_COLUMNS`
  (model, questions, cite rate, citation validity, support rate, abstention precision and
  recall, TTFT and total latency p50 / p95);
- :func:`detail_rows`: ``(measure, value)`` pairs, every figure with its counts;
- :func:`per_query_cells`: one row of :data:`PER_QUERY_COLUMNS` per question asked;
- :func:`render_answers_md`: the ``## Answers`` section of ``report.md``.

``report.html`` shows the same cells (``eval/templates/report.html.j2``, section ``#answers``).
A ratio is shown as a percentage with its counts (``96.0 % (48 / 50)``), ``n/a`` when its
denominator is 0; times in milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ANSWERS_COLUMNS = (
    "model", "questions", "cite rate", "citation validity", "support rate", "abstention precision",
    "abstention recall", "TTFT p50 / p95 ms", "total p50 / p95 ms",
)
PER_QUERY_COLUMNS = (
    "query", "set", "outcome", "citations (supported)", "dropped", "relevant cited", "evidence score",
    "TTFT ms", "total ms", "question", "answer",
)
_TEXT_MD = 80


def _frac(value: float | None, part: int, whole: int) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} % ({part} / {whole})"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def _ms(timing: Mapping[str, Any]) -> str:
    return "n/a" if not timing.get("n") else f"{timing['p50']:.0f} / {timing['p95']:.0f}"


def _opt(value: float | None, fmt: str = "{:.0f}") -> str:
    return "–" if value is None else fmt.format(value)


def intro(s: Mapping[str, Any]) -> str:
    """One sentence: what was asked of which LLM, with which settings, and how many answers came."""
    cfg = s["config"]
    return (
        f"{s['queries']} judged queries and {s['unanswerable_queries']} out-of-corpus questions answered by "
        f"{cfg['llm_url']} (top_k {cfg['top_k']}, {cfg['mode']}, max_tokens {cfg['max_tokens']}, "
        f"context_tokens {cfg['context_tokens']}, temperature 0): {s['answered']} judged answered, "
        f"{s['failed']} failed."
    )


def answers_row(s: Mapping[str, Any]) -> list[str]:
    """The run's row of the answers table (cells in the order of :data:`ANSWERS_COLUMNS`)."""
    ab = s["abstention"]
    declined = ab["declined_answerable"] + ab["declined_unanswerable"]
    return [
        s["model"],
        f"{s['queries']} answerable + {s['unanswerable_queries']} unanswerable",
        _frac(s["cite_rate"], s["with_citation"], s["answered_by_llm"]),
        _frac(s["citation_validity"], s["citations"], s["citations"] + s["dropped_citations"]),
        _frac(s["supported"], s["supported_citations"], s["citations"]),
        _frac(ab["precision"], ab["declined_unanswerable"], declined),
        _frac(ab["recall"], ab["declined_unanswerable"], ab["unanswerable"]),
        _ms(s["ttft_ms"]),
        _ms(s["total_ms"]),
    ]


def detail_rows(s: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(measure, value)``: every figure of the section with its counts."""
    ab = s["abstention"]
    floor = ab["min_score"]
    threshold = "none" if floor is None else f"{floor:.4f} (from {ab['min_score_from']})"
    llm_na = ab["llm_not_answerable"]
    return [
        ("answers with >= 1 citation (cite rate; abstentions excluded)",
         _frac(s["cite_rate"], s["with_citation"], s["answered_by_llm"])),
        ("citation validity (markers resolved / all)",
         _frac(s["citation_validity"], s["citations"], s["citations"] + s["dropped_citations"])),
        ("cited documents relevant per qrels", f"{_pct(s['cited_relevant'])} ({s['cited_documents']} cited)"),
        ("answers with no citation", _frac(s["no_citation"], s["answered_by_llm"] - s["with_citation"],
                                           s["answered_by_llm"])),
        ("citations supported (support rate)", _frac(s["supported"], s["supported_citations"], s["citations"])),
        ("abstention threshold (evidence score)", threshold),
        ("declined without an LLM call: answerable / unanswerable",
         f"{ab['declined_answerable']} / {ab['answerable']}, {ab['declined_unanswerable']} / {ab['unanswerable']}"),
        ("abstention precision (declined unanswerable / declined)",
         _frac(ab["precision"], ab["declined_unanswerable"], ab["declined_answerable"] + ab["declined_unanswerable"])),
        ("abstention recall (declined unanswerable / unanswerable)",
         _frac(ab["recall"], ab["declined_unanswerable"], ab["unanswerable"])),
        ("LLM replied not_answerable: answerable / unanswerable", f"{llm_na['answerable']} / {llm_na['unanswerable']}"),
        ("TTFT p50 / p95 ms (questions that asked the LLM)", _ms(s["ttft_ms"])),
        ("total p50 / p95 ms (questions that asked the LLM)", _ms(s["total_ms"])),
        ("total p50 / p95 ms (declined)", _ms(s["declined_total_ms"])),
    ]


def per_query_cells(row: Mapping[str, Any], text_chars: int | None = None) -> list[str]:
    """One question's cells (the order of :data:`PER_QUERY_COLUMNS`); texts cut to ``text_chars``."""

    def cut(text: str | None) -> str:
        text = text or ""
        return text if text_chars is None or len(text) <= text_chars else text[: text_chars - 1] + "…"

    evidence = "–" if row["best_score"] is None else f"{row['best_score']:.4f}"
    return [
        row["query_id"], row["set"], row["outcome"], f"{row['citations']} ({row['supported']})", str(row["dropped"]),
        str(row["cited_relevant"]), evidence, _opt(row["ttft_ms"]), _opt(row["total_ms"]), cut(row["text"]),
        cut(row["answer"] if row["error"] is None else f"error: {row['error']}"),
    ]


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header: tuple[str, ...] | list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(_md(c) for c in row) + " |" for row in rows)]


def render_answers_md(section: Mapping[str, Any]) -> list[str]:
    """The report's ``## Answers`` section (Markdown lines) from ``summary.json["answers"]``."""
    s = section
    lines = [
        "## Answers",
        "",
        intro(s),
        "",
        *_table(ANSWERS_COLUMNS, [answers_row(s)]),
        "",
        *_table(("measure", "value"), [list(pair) for pair in detail_rows(s)]),
        "",
    ]
    if s["abstention"].get("skipped"):
        lines += [f"Abstention not measured: {s['abstention']['skipped']}.", ""]
    if s["errors"]:
        lines += ["Errors: " + "; ".join(f"`{e}`" for e in s["errors"]), ""]
    rows = [per_query_cells(r, _TEXT_MD) for r in s["per_query"]]
    lines += ["### Answers per query", "", *_table(PER_QUERY_COLUMNS, rows), ""]
    return lines
