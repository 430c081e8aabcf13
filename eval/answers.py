"""The answers section of an evaluation: ask the answer path each judged query, score its citations and abstentions.

``quarry eval --answers`` runs, after the retrieval modes, up to ``--answers-queries`` judged
queries of the split (answerable: the qrels name their documents) and, when an abstention
threshold applies, up to ``--unanswerable-queries`` out-of-corpus questions (default
:data:`UNANSWERABLE_TEST`: 50 general-knowledge questions SciFact does not answer, held out: the
threshold was tuned on other ones) through the answer service that
``POST /v1/collections/{name}/answer`` calls (:class:`quarry.services.answer.AnswerService`:
retrieval, the abstention check, the prompt within the context budget, the configured LLM,
citations; in process, not over HTTP, without the answer cache) and reports:

- ``cite_rate``: answerable queries the LLM answered with at least one resolved citation /
  answerable queries the LLM answered (an abstention, the service's or the LLM's
  ``not_answerable``, is not an answer without a citation); ``no_citation`` is ``1 - cite_rate``;
- ``citation_validity``: markers that resolved to a source that was sent / all markers the
  answers wrote (resolved + dropped); ``None`` when no answer wrote a marker;
- ``cited_relevant``: cited (query, document) pairs whose document the qrels judge relevant
  (grade > 0) / all cited (query, document) pairs; ``None`` when nothing was cited;
- ``supported`` (the support rate): citations whose cited chunk backs the sentence
  (``supported: true``) / citations;
- ``abstention``: the threshold and where it came from, and over answerable + unanswerable
  questions, with *declined* meaning the service answered "not in the corpus" without calling
  the LLM (``abstention.reason == "below_min_score"``): ``precision`` = declined unanswerable /
  declined, ``recall`` = declined unanswerable / unanswerable (``None`` when the denominator is 0);
  the LLM's own ``not_answerable`` replies are counted apart (``llm_not_answerable``);
- ``ttft_ms`` and ``total_ms``: p50/p95 of the server-side ``timings_ms`` (from the request's
  arrival to the first text token, and to the end) of the questions that asked the LLM;
  ``declined_total_ms`` those of the declined ones;
- ``answered``, ``failed`` (the LLM failed or missed a deadline: ``answer`` null, the reason in
  ``errors``), ``queries`` (answerable), ``unanswerable_queries``.

The citation figures are over the answerable queries only. Every ratio is in [0, 1]. The LLM is
``QUARRY_LLM__URL``; without one there is nothing to measure, so :func:`answer_queries` raises
:class:`~quarry.errors.LLMNotConfigured`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qs, urlsplit

from eval.summary import percentile_ms
from quarry.errors import LLMNotConfigured

if TYPE_CHECKING:
    from quarry.service import Quarry
    from quarry.services.answer import AnswerService

UNANSWERABLE_TEST = Path(__file__).resolve().parent / "data" / "unanswerable_test.jsonl"
"""50 out-of-corpus questions (BEIR queries form), the held-out half of ``bench/data/unanswerable.json``."""

DECLINED = "below_min_score"
"""The abstention reason of a question the service declined without calling the LLM."""

Outcome = Literal["declined", "llm_not_answerable", "answered", "failed"]


@dataclass
class AnswerRecord:
    """What one question's answer gave (the ``done`` or ``error`` event's fields the section needs).

    ``answerable``: a judged query of the split (else an out-of-corpus question); ``declined``:
    the service abstained without an LLM call; ``llm_abstained``: the LLM replied
    ``not_answerable``; ``best_score``: the evidence score of a declined question.
    """

    query_id: str
    answer: str | None
    citations: list[dict[str, Any]]
    dropped: int
    ttft_ms: float | None
    total_ms: float
    error: str | None = None
    answerable: bool = True
    declined: bool = False
    llm_abstained: bool = False
    best_score: float | None = None
    text: str = ""

    @property
    def outcome(self) -> Outcome:
        """``declined``, ``llm_not_answerable``, ``answered`` or ``failed``."""
        if self.declined:
            return "declined"
        if self.answer is None:
            return "failed"
        return "llm_not_answerable" if self.llm_abstained else "answered"


@dataclass
class AnswersSection:
    """The answers section (see the module docstring); ``records`` are kept for ``per_query``."""

    config: dict[str, Any]
    records: list[AnswerRecord] = field(default_factory=list)

    def to_dict(self, qrels: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
        """The section as ``summary.json["answers"]``."""
        judged = [r for r in self.records if r.answerable]
        answered = [r for r in judged if r.answer is not None]
        by_llm = [r for r in answered if r.outcome == "answered"]
        resolved = sum(len(r.citations) for r in judged)
        markers = resolved + sum(r.dropped for r in judged)
        pairs = {(r.query_id, c["document_id"]) for r in judged for c in r.citations}
        relevant = sum(1 for qid, doc in pairs if qrels.get(qid, {}).get(doc, 0) > 0)
        supported = sum(1 for r in judged for c in r.citations if c.get("supported"))
        asked = [r for r in self.records if not r.declined]
        ttfts = [r.ttft_ms for r in asked if r.ttft_ms is not None]
        cited = sum(1 for r in by_llm if r.citations)
        return {
            "config": self.config,
            "model": model_label(str(self.config.get("llm_url", ""))),
            "queries": len(judged),
            "unanswerable_queries": len(self.records) - len(judged),
            "answered": len(answered),
            "failed": len(judged) - len(answered),
            "answered_by_llm": len(by_llm),
            "with_citation": cited,
            "cite_rate": _ratio(cited, len(by_llm)),
            "no_citation": _ratio(len(by_llm) - cited, len(by_llm)),
            "citations": resolved,
            "dropped_citations": markers - resolved,
            "citation_validity": _ratio(resolved, markers),
            "cited_documents": len(pairs),
            "cited_relevant": _ratio(relevant, len(pairs)),
            "supported_citations": supported,
            "supported": _ratio(supported, resolved),
            "abstention": self._abstention(),
            "ttft_ms": _percentiles(ttfts),
            "total_ms": _percentiles([r.total_ms for r in asked]),
            "declined_total_ms": _percentiles([r.total_ms for r in self.records if r.declined]),
            "errors": sorted({r.error for r in self.records if r.error}),
            "per_query": [_row(r, qrels) for r in self.records],
        }

    def _abstention(self) -> dict[str, Any]:
        judged = [r for r in self.records if r.answerable]
        unanswerable = [r for r in self.records if not r.answerable]
        declined_a = sum(1 for r in judged if r.declined)
        declined_u = sum(1 for r in unanswerable if r.declined)
        out: dict[str, Any] = {
            "min_score": self.config.get("min_score"), "min_score_from": self.config.get("min_score_from"),
            "answerable": len(judged), "unanswerable": len(unanswerable),
            "declined_answerable": declined_a, "declined_unanswerable": declined_u,
            "precision": _ratio(declined_u, declined_a + declined_u),
            "recall": _ratio(declined_u, len(unanswerable)),
            "llm_not_answerable": {"answerable": sum(1 for r in judged if r.outcome == "llm_not_answerable"),
                                   "unanswerable": sum(1 for r in unanswerable if r.outcome == "llm_not_answerable")},
        }
        if self.config.get("min_score") is None:
            out["skipped"] = ("no abstention threshold for this collection (--answers-min-score or "
                              "QUARRY_LLM__MIN_SCORES): the unanswerable questions were not asked")
        return out


def _row(r: AnswerRecord, qrels: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    cited = sorted({c["document_id"] for c in r.citations})
    return {
        "query_id": r.query_id, "set": "answerable" if r.answerable else "unanswerable", "text": r.text,
        "outcome": r.outcome, "answered": r.answer is not None, "answer": r.answer,
        "citations": len(r.citations), "dropped": r.dropped,
        "supported": sum(1 for c in r.citations if c.get("supported")), "cited": cited,
        "cited_relevant": sum(1 for d in cited if qrels.get(r.query_id, {}).get(d, 0) > 0),
        "best_score": r.best_score, "ttft_ms": r.ttft_ms, "total_ms": r.total_ms, "error": r.error,
    }


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _percentiles(values: list[float]) -> dict[str, float | int]:
    return {"p50": percentile_ms(values, 50), "p95": percentile_ms(values, 95), "n": len(values)}


def model_label(llm_url: str) -> str:
    """The model an LLM URL names (its ``model=`` parameter), else its host and port."""
    parts = urlsplit(llm_url)
    named = parse_qs(parts.query).get("model")
    return named[0] if named else (parts.netloc or llm_url or "?")


def load_unanswerable(path: Path, limit: int) -> dict[str, str]:
    """The first ``limit`` out-of-corpus questions of a BEIR-form queries file (``limit`` 0: none).

    Raises:
        InvalidRequest: ``path`` does not exist.
        InvalidDocument: A line is malformed or repeats an id.
    """
    from eval.beir import read_queries

    return dict(list(read_queries(path).items())[:limit]) if limit > 0 else {}


def answer_queries(  # noqa: PLR0913 - the run's knobs
    quarry: Quarry,
    collection: str,
    queries: Mapping[str, str],
    *,
    limit: int,
    unanswerable: Mapping[str, str] | None = None,
    min_score: float | None = None,
    top_k: int = 5,
    mode: Literal["bm25", "dense", "hybrid"] = "hybrid",
    max_tokens: int | None = None,
    seed: int | None = 7,
) -> AnswersSection:
    """Answer the first ``limit`` non-blank judged queries (split order), then the unanswerable ones, at temperature 0.

    Args:
        quarry: The service; its ``settings.llm`` names the LLM.
        collection: The evaluated collection.
        queries: Query id -> text (the split's judged queries).
        limit: How many judged queries to answer (``>= 1``).
        unanswerable: Out-of-corpus question id -> text, asked after them when an abstention
            threshold applies (else not asked: without one the service never declines).
        min_score: The abstention threshold (the evidence score's scale:
            :mod:`quarry.services.abstention`); ``None``: the collection's
            ``QUARRY_LLM__MIN_SCORES`` entry, else none.
        top_k: Chunks retrieved for each prompt.
        mode: Retrieval mode.
        max_tokens: Answer length cap; default ``QUARRY_LLM__MAX_TOKENS``.
        seed: Sampling seed sent to the LLM.

    Returns:
        The section (its records, one per question asked: judged first).

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
    cfg = quarry.settings.llm
    floor = min_score if min_score is not None else cfg.min_scores.get(collection)
    source = "--answers-min-score" if min_score is not None else "QUARRY_LLM__MIN_SCORES" if floor is not None else None
    asked = [(qid, text, True) for qid, text in queries.items() if text.strip()][:limit]
    if floor is not None:
        asked += [(qid, text, False) for qid, text in (unanswerable or {}).items() if text.strip()]
    config = {
        "llm_url": cfg.url, "top_k": top_k, "mode": mode, "max_tokens": max_tokens or cfg.max_tokens,
        "context_tokens": cfg.context_tokens, "temperature": 0.0, "seed": seed,
        "support_threshold": cfg.support_threshold, "structured": cfg.structured, "answer_style": cfg.answer_style,
        "min_score": floor, "min_score_from": source,
    }

    async def run() -> AnswersSection:
        from quarry.services.answer import AnswerRequest, AnswerService

        generator = open_generator(cfg)
        assert generator is not None  # the URL is set
        answers = AnswerService(generator, None)  # no cache: eval measures the LLM
        section = AnswersSection(config)
        try:
            for qid, text, answerable in asked:
                req = AnswerRequest(query=text, top_k=top_k, mode=mode, max_tokens=max_tokens, temperature=0.0,
                                    seed=seed, min_score=floor)
                record = await _answer_one(quarry, answers, collection, qid, req)
                record.answerable, record.text = answerable, text
                section.records.append(record)
        finally:
            await answers.aclose()
        return section

    return asyncio.run(run())


async def _answer_one(quarry: Quarry, answers: AnswerService, collection: str, qid: str, req: Any) -> AnswerRecord:
    """One answer through the answer service, its ``done`` (or ``error``) event recorded."""
    events = await answers.events(quarry.view, collection, req)
    record = AnswerRecord(qid, None, [], 0, None, 0.0)
    async for event in events:
        if event.kind == "done":
            data = event.data
            record.answer, record.citations = data["answer"], list(data["citations"])
            record.dropped = int(data["dropped_citations"])
            why = data.get("abstention") or {}
            record.declined = bool(data.get("abstained")) and why.get("reason") == DECLINED
            record.llm_abstained = bool(data.get("abstained")) and not record.declined
            record.best_score = why.get("best_score")
        elif event.kind == "error":
            data = event.data
            record.error = str(data["error"]["message"])
        else:
            continue
        timings = data["timings_ms"]
        record.ttft_ms, record.total_ms = timings.get("ttft"), float(timings.get("total", 0.0))
    return record

