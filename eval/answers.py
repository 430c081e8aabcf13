"""The answers section of an evaluation: ask the answer path each judged query, score its citations.

``quarry eval --answers`` runs, after the retrieval modes, up to ``--answers-queries`` judged
queries of the split through the answer service that ``POST /v1/collections/{name}/answer`` calls
(:class:`quarry.services.answer.AnswerService`: retrieval, the prompt within the context budget,
the configured LLM, citations; in process, not over HTTP, without the answer cache) and reports, over those queries:

- ``citation_validity``: markers that resolved to a source that was sent / all markers the
  answers wrote (resolved + dropped); ``None`` when no answer wrote a marker;
- ``cited_relevant``: cited (query, document) pairs whose document the qrels judge relevant
  (grade > 0) / all cited (query, document) pairs; ``None`` when nothing was cited;
- ``no_citation``: answers (``answer`` not null) without one resolved citation / answers;
- ``supported``: citations whose cited chunk backs the sentence (``supported: true``) / citations;
- ``ttft_ms`` and ``total_ms``: p50/p95 of the server-side ``timings_ms`` (from the request's
  arrival to the first text token, and to the end);
- ``answered``, ``failed`` (the LLM failed or missed a deadline: ``answer`` null, the reason in
  ``errors``), ``queries``.

Every ratio is in [0, 1]. The LLM is ``QUARRY_LLM__URL``; without one there is nothing to
measure, so :func:`answer_queries` raises :class:`~quarry.errors.LLMNotConfigured`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from eval.summary import percentile_ms
from quarry.errors import LLMNotConfigured

if TYPE_CHECKING:
    from quarry.service import Quarry
    from quarry.services.answer import AnswerService


@dataclass
class AnswerRecord:
    """What one query's answer gave (the ``done`` event's fields the section needs)."""

    query_id: str
    answer: str | None
    citations: list[dict[str, Any]]
    dropped: int
    ttft_ms: float | None
    total_ms: float
    error: str | None = None


@dataclass
class AnswersSection:
    """The answers section (see the module docstring); ``records`` are kept for ``per_query``."""

    config: dict[str, Any]
    records: list[AnswerRecord] = field(default_factory=list)

    def to_dict(self, qrels: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
        """The section as ``summary.json["answers"]``."""
        answered = [r for r in self.records if r.answer is not None]
        resolved = sum(len(r.citations) for r in self.records)
        markers = resolved + sum(r.dropped for r in self.records)
        pairs = {(r.query_id, c["document_id"]) for r in self.records for c in r.citations}
        relevant = sum(1 for qid, doc in pairs if qrels.get(qid, {}).get(doc, 0) > 0)
        supported = sum(1 for r in self.records for c in r.citations if c.get("supported"))
        ttfts = [r.ttft_ms for r in answered if r.ttft_ms is not None]
        totals = [r.total_ms for r in self.records]
        return {
            "config": self.config,
            "queries": len(self.records),
            "answered": len(answered),
            "failed": len(self.records) - len(answered),
            "citations": resolved,
            "dropped_citations": markers - resolved,
            "citation_validity": _ratio(resolved, markers),
            "cited_documents": len(pairs),
            "cited_relevant": _ratio(relevant, len(pairs)),
            "no_citation": _ratio(sum(1 for r in answered if not r.citations), len(answered)),
            "supported": _ratio(supported, resolved),
            "ttft_ms": {"p50": percentile_ms(ttfts, 50), "p95": percentile_ms(ttfts, 95), "n": len(ttfts)},
            "total_ms": {"p50": percentile_ms(totals, 50), "p95": percentile_ms(totals, 95), "n": len(totals)},
            "errors": sorted({r.error for r in self.records if r.error}),
            "per_query": [
                {"query_id": r.query_id, "answered": r.answer is not None, "citations": len(r.citations),
                 "dropped": r.dropped, "supported": sum(1 for c in r.citations if c.get("supported")),
                 "cited": sorted({c["document_id"] for c in r.citations}), "ttft_ms": r.ttft_ms,
                 "total_ms": r.total_ms}
                for r in self.records
            ],
        }


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def answer_queries(
    quarry: Quarry,
    collection: str,
    queries: Mapping[str, str],
    *,
    limit: int,
    top_k: int = 5,
    mode: Literal["bm25", "dense", "hybrid"] = "hybrid",
    max_tokens: int | None = None,
    seed: int | None = 7,
) -> AnswersSection:
    """Answer the first ``limit`` non-blank queries (split order) at temperature 0.

    Args:
        quarry: The service; its ``settings.llm`` names the LLM.
        collection: The evaluated collection.
        queries: Query id -> text (the split's judged queries).
        limit: How many queries to answer (``>= 1``).
        top_k: Chunks retrieved for each prompt.
        mode: Retrieval mode.
        max_tokens: Answer length cap; default ``QUARRY_LLM__MAX_TOKENS``.
        seed: Sampling seed sent to the LLM.

    Returns:
        The section (its records, one per query asked).

    Raises:
        LLMNotConfigured: ``QUARRY_LLM__URL`` is empty.
        InvalidRequest: ``limit < 1``.
        ConfigError: The LLM URL is malformed.
    """
    from generation.factory import open_generator
    from quarry.errors import InvalidRequest

    if not quarry.settings.llm.url.strip():
        raise LLMNotConfigured("quarry eval --answers needs an LLM: set QUARRY_LLM__URL (openai+http://host:port/v1?model=NAME)")
    if limit < 1:
        raise InvalidRequest(f"--answers-queries must be >= 1, got {limit}")
    asked = [(qid, text) for qid, text in queries.items() if text.strip()][:limit]
    cfg = quarry.settings.llm
    config = {
        "llm_url": cfg.url, "top_k": top_k, "mode": mode, "max_tokens": max_tokens or cfg.max_tokens,
        "context_tokens": cfg.context_tokens, "temperature": 0.0, "seed": seed,
        "support_threshold": cfg.support_threshold,
    }

    async def run() -> AnswersSection:
        from quarry.services.answer import AnswerService

        generator = open_generator(cfg)
        assert generator is not None  # the URL is set
        answers = AnswerService(generator, None)  # no cache: eval measures the LLM
        section = AnswersSection(config)
        try:
            for qid, text in asked:
                section.records.append(
                    await _answer_one(quarry, answers, collection, qid, text, top_k, mode, max_tokens, seed)
                )
        finally:
            await answers.aclose()
        return section

    return asyncio.run(run())


async def _answer_one(  # noqa: PLR0913 - the request's fields
    quarry: Quarry, answers: AnswerService, collection: str, qid: str, text: str, top_k: int,
    mode: Literal["bm25", "dense", "hybrid"], max_tokens: int | None, seed: int | None,
) -> AnswerRecord:
    """One answer through the answer service, its ``done`` (or ``error``) event recorded."""
    from quarry.services.answer import AnswerRequest

    req = AnswerRequest(query=text, top_k=top_k, mode=mode, max_tokens=max_tokens, temperature=0.0, seed=seed)
    events = await answers.events(quarry.view, collection, req)
    record = AnswerRecord(qid, None, [], 0, None, 0.0)
    async for event in events:
        if event.kind == "done":
            data = event.data
            record.answer, record.citations = data["answer"], list(data["citations"])
            record.dropped = int(data["dropped_citations"])
        elif event.kind == "error":
            data = event.data
            record.error = str(data["error"]["message"])
        else:
            continue
        timings = data["timings_ms"]
        record.ttft_ms, record.total_ms = timings.get("ttft"), float(timings.get("total", 0.0))
    return record


def render_answers_md(section: Mapping[str, Any]) -> list[str]:
    """The report's ``## Answers`` section (Markdown lines) from ``summary.json["answers"]``."""

    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{100 * value:.1f}%"

    s = section
    lines = [
        "## Answers",
        "",
        f"{s['queries']} judged queries answered by `{s['config']['llm_url']}` "
        f"(top_k {s['config']['top_k']}, {s['config']['mode']}, max_tokens {s['config']['max_tokens']}, "
        f"temperature 0): {s['answered']} answered, {s['failed']} failed.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| citation validity (markers resolved / all) | {pct(s['citation_validity'])} "
        f"({s['citations']} / {s['citations'] + s['dropped_citations']}) |",
        f"| cited documents relevant per qrels | {pct(s['cited_relevant'])} ({s['cited_documents']} cited) |",
        f"| answers with no citation | {pct(s['no_citation'])} |",
        f"| citations `supported` | {pct(s['supported'])} |",
        f"| TTFT p50 / p95 ms | {s['ttft_ms']['p50']:.0f} / {s['ttft_ms']['p95']:.0f} |",
        f"| total p50 / p95 ms | {s['total_ms']['p50']:.0f} / {s['total_ms']['p95']:.0f} |",
        "",
    ]
    if s["errors"]:
        lines += ["Errors: " + "; ".join(f"`{e}`" for e in s["errors"]), ""]
    return lines
