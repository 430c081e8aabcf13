"""Answer quality on SciFact: abstention calibrated on the train half, citations of the local LLM.

Three steps, each reproducible on its own (the SciFact collection is built once in ``--data-dir``):

``index``
    SciFact's 5,183 documents into collection ``scifact`` (the default embedder, Milvus Lite).
``abstention``
    The best retrieved score (``abstention_score``: the best hit's dense cosine, see
    :func:`quarry.services.abstention.evidence_score`) of every SciFact **train** query and of
    the out-of-corpus questions in ``bench/data/unanswerable.json``'s ``tune`` half; the threshold that
    maximises the abstention F1 on them (positive: an unanswerable question) is printed. Then,
    with that threshold fixed, abstention precision and recall on SciFact **test** queries
    (answerable) and the ``test`` half of the out-of-corpus questions (unanswerable). The test
    halves are never used to choose it.
``answers``
    ``--queries`` SciFact test queries through the answer service (as ``POST /answer``), with the
    LLM of ``--llm-url``: answers with at least one citation, citations naming a sent source,
    citations ``supported``, abstentions, TTFT.

    python bench/answer_quality.py index
    python bench/answer_quality.py abstention [--json FILE]
    python bench/answer_quality.py answers --queries 50 [--llm-url URL] [--structured auto] [--json FILE]
    python bench/answer_quality.py answers --offset 25 --queries 25 ...   # a slice (two servers at once)
    python bench/answer_quality.py merge A.json B.json [--json FILE]       # the figures of slices together
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eval.beir import iter_corpus, load_split  # noqa: E402
from indexing.document_rules import SourceDocument  # noqa: E402
from quarry.service import Quarry  # noqa: E402
from quarry.settings import CacheSettings, LLMSettings, Settings  # noqa: E402

SCIFACT = REPO.parent / "shared" / "data" / "scifact"
UNANSWERABLE = REPO / "bench" / "data" / "unanswerable.json"
COLLECTION = "scifact"
LOCAL_LLM = "openai+http://127.0.0.1:8090/v1?model=smollm2"


def open_quarry(data_dir: Path, llm: LLMSettings | None = None) -> Quarry:
    """The service over ``data_dir`` (no answer cache: every answer is generated)."""
    settings = Settings(data_dir=data_dir, llm=llm or LLMSettings(), cache=CacheSettings(enabled=False))
    return Quarry(settings)


def index(data_dir: Path) -> None:
    """Build collection ``scifact`` (skipped when it holds every document already)."""
    q = open_quarry(data_dir)
    try:
        q.create_collection(COLLECTION, language="en", exist_ok=True)
        docs = [SourceDocument(d["_id"], d["text"], d.get("title", "")) for d in iter_corpus(SCIFACT / "corpus.jsonl")]
        started = time.perf_counter()
        report = q.upsert(COLLECTION, docs)
        print(f"indexed {len(docs)} documents in {time.perf_counter() - started:.0f} s: {report}")
    finally:
        q.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["index", "abstention", "answers", "merge"])
    parser.add_argument("files", nargs="*", type=Path, help="merge: the answers JSON files of slices")
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/quarry-answer-quality"))
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--llm-url", default=LOCAL_LLM)
    parser.add_argument("--structured", default="auto", choices=["auto", "json_schema", "json_object", "off"])
    parser.add_argument("--style", default="abstractive", choices=["abstractive", "extractive"])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.step == "index":
        index(args.data_dir)
        return
    out: dict[str, Any]
    if args.step == "abstention":
        out = abstention(args.data_dir)
    elif args.step == "merge":
        parts = [json.loads(f.read_text()) for f in args.files]
        out = summarize(parts[0]["llm_url"], parts[0]["structured"], [r for p in parts for r in p["per_query"]])
        out["style"] = parts[0].get("style", "abstractive")
    else:
        out = answers(args.data_dir, args.queries, args.llm_url, args.structured, args.offset, args.style)
    print(json.dumps({k: v for k, v in out.items() if k not in ("per_query", "scores")}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


def _scores(q: Quarry, texts: list[str]) -> list[float | None]:
    """The evidence score of each question (hybrid search, top 5: what an answer retrieves)."""
    from quarry.services.abstention import evidence_score

    return [evidence_score(q.search(COLLECTION, t, top_k=5, mode="hybrid").hits, "hybrid") for t in texts]


def _abstention_figures(
    answerable: list[float | None], unanswerable: list[float | None], floor: float
) -> dict[str, Any]:
    """Abstention precision/recall at ``floor`` (positive: abstained; right when the question is unanswerable)."""
    abstain_a = sum(1 for s in answerable if s is None or s < floor)
    abstain_u = sum(1 for s in unanswerable if s is None or s < floor)
    abstained = abstain_a + abstain_u
    return {
        "threshold": round(floor, 4), "answerable": len(answerable), "unanswerable": len(unanswerable),
        "abstained_answerable": abstain_a, "abstained_unanswerable": abstain_u,
        "precision": round(abstain_u / abstained, 4) if abstained else None,
        "recall": round(abstain_u / len(unanswerable), 4) if unanswerable else None,
        "answered_answerable": round(1 - abstain_a / len(answerable), 4) if answerable else None,
    }


def abstention(data_dir: Path) -> dict[str, Any]:
    """Tune the threshold on train + the tune half; measure on test + the test half."""
    unanswerable = json.loads(UNANSWERABLE.read_text())
    q = open_quarry(data_dir)
    try:
        train = list(load_split(SCIFACT, "train").queries.values())
        test = list(load_split(SCIFACT, "test").queries.values())
        s_train, s_tune = _scores(q, train), _scores(q, unanswerable["tune"])
        s_test, s_held = _scores(q, test), _scores(q, unanswerable["test"])
    finally:
        q.close()
    # the threshold with the best abstention F1 on the tuning data (ties: the lowest, fewest refusals)
    known = sorted({s for s in s_train + s_tune if s is not None})
    candidates = [(a + b) / 2 for a, b in zip(known, known[1:], strict=False)]

    def f1(floor: float) -> float:
        f = _abstention_figures(s_train, s_tune, floor)
        p, r = f["precision"] or 0.0, f["recall"] or 0.0
        return 2 * p * r / (p + r) if p + r else 0.0

    floor = max(candidates, key=f1)
    return {
        "collection": COLLECTION, "score": "best dense cosine of the hybrid top 5 (MiniLM, int8 ONNX)",
        "tuned_on": _abstention_figures(s_train, s_tune, floor),
        "measured_on": _abstention_figures(s_test, s_held, floor),
        "scores": {"train": s_train, "tune": s_tune, "test": s_test, "unanswerable_test": s_held},
        "score_quantiles": {
            "train": _quantiles(s_train), "tune": _quantiles(s_tune), "test": _quantiles(s_test),
            "unanswerable_test": _quantiles(s_held),
        },
    }


def _quantiles(scores: list[float | None]) -> dict[str, float]:
    known = sorted(s for s in scores if s is not None)
    return {f"p{p}": round(known[min(len(known) - 1, int(p / 100 * len(known)))], 4) for p in (5, 50, 95)}


def answers(  # noqa: PLR0913 - the run's knobs
    data_dir: Path, limit: int, llm_url: str, structured: str, offset: int = 0, style: str = "abstractive"
) -> dict[str, Any]:
    """Answer ``limit`` SciFact test queries (from the ``offset``-th) through the answer service; the figures."""
    rows = asyncio.run(_answers(data_dir, limit, llm_url, structured, offset, style))
    return {**summarize(llm_url, structured, rows), "style": style}


async def _answers(  # noqa: PLR0913 - the run's knobs
    data_dir: Path, limit: int, llm_url: str, structured: str, offset: int, style: str
) -> list[dict[str, Any]]:
    from generation.factory import open_generator
    from quarry.services.answer import AnswerRequest, AnswerService

    llm = LLMSettings(url=llm_url, structured=structured, answer_style=style,
                      first_token_timeout_s=300, stall_timeout_s=60, total_timeout_s=600)
    q = open_quarry(data_dir, llm)
    split = load_split(SCIFACT, "test")
    asked = list(split.queries.items())[offset : offset + limit]
    service = AnswerService(open_generator(llm), None)
    rows: list[dict[str, Any]] = []
    try:
        for qid, text in asked:
            req = AnswerRequest(query=text, top_k=5, temperature=0.0, seed=7)
            sent: list[dict[str, Any]] = []
            done: dict[str, Any] = {}
            async for event in await service.events(q.view, COLLECTION, req):
                if event.kind == "sources":
                    sent = event.data["sources"]
                elif event.kind in ("done", "error"):
                    done = event.data
            chunks = {s["chunk_id"] for s in sent}
            cites = done.get("citations", [])
            rows.append({
                "query_id": qid, "answer": done.get("answer"), "format": done.get("format"),
                "abstained": bool(done.get("abstained")), "citations": len(cites),
                "citations_to_sent": sum(1 for c in cites if c["chunk_id"] in chunks),
                "dropped": done.get("dropped_citations", 0), "supported": sum(1 for c in cites if c["supported"]),
                "reasons": [c.get("reason") for c in cites if not c["supported"]],
                "titled_sources": sum(1 for s in sent if s.get("title")), "sources": len(sent),
                "relevant_cited": sum(1 for c in {c["document_id"] for c in cites} if split.qrels.get(qid, {}).get(c)),
                "ttft_ms": (done.get("timings_ms") or {}).get("ttft"),
                "error": (done.get("error") or {}).get("message"),
            })
            print(json.dumps({k: rows[-1][k] for k in ("query_id", "citations", "supported", "abstained", "format")}),
                  flush=True)
    finally:
        await service.aclose()
        q.close()
    return rows


def summarize(llm_url: str, structured: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of answered queries' rows (see :func:`_answers`)."""
    answered = [r for r in rows if r["answer"] is not None]
    cited = sum(1 for r in answered if r["citations"])
    total = sum(r["citations"] for r in rows)
    ttfts = sorted(r["ttft_ms"] for r in rows if r["ttft_ms"] is not None)
    return {
        "llm_url": llm_url, "structured": structured, "queries": len(rows), "answered": len(answered),
        "abstained_by_llm": sum(1 for r in rows if r["abstained"]),
        "formats": {f: sum(1 for r in rows if r["format"] == f) for f in {r["format"] for r in rows}},
        "answers_with_citation": round(cited / len(answered), 4) if answered else None,
        "answers_with_citation_of_all_queries": round(cited / len(rows), 4) if rows else None,
        "citations": total, "dropped_citations": sum(r["dropped"] for r in rows),
        "citations_naming_a_sent_source": (
            round(sum(r["citations_to_sent"] for r in rows) / total, 4) if total else None
        ),
        "support_rate": round(sum(r["supported"] for r in rows) / total, 4) if total else None,
        "cited_documents_relevant": sum(r["relevant_cited"] for r in rows),
        "sources_with_title": f"{sum(r['titled_sources'] for r in rows)}/{sum(r['sources'] for r in rows)}",
        "ttft_ms_p50": ttfts[len(ttfts) // 2] if ttfts else None,
        "per_query": rows,
    }


if __name__ == "__main__":
    main()
