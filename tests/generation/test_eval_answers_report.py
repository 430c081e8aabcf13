"""The answers section of ``quarry eval --answers``: figures worked by hand, the written reports, a stub LLM.

The known answers: nine questions (five judged, four out of corpus) whose outcomes cover every
case (cited, uncited, declined, failed, the LLM's own ``not_answerable``); each figure of
:mod:`eval.answers` is worked out below and checked in ``summary.json``, ``report.md`` and
``report.html``. Then the real answer service over ten SciFact documents and a scripted LLM:
a declined question costs no LLM request and is not counted as an answer without a citation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from embedding.sentence_transformers import SentenceTransformerEmbedder
from eval.answers import UNANSWERABLE_TEST, AnswerRecord, AnswersSection, answer_queries, load_unanswerable
from eval.runner import evaluate
from indexing.document_rules import SourceDocument
from quarry.service import Quarry
from quarry.services.answer import ABSTAINED
from quarry.settings import CacheSettings, LLMSettings, Settings
from tests.core.conftest import write_jsonl
from tests.generation.stub import Reply, StubLLM

REPO = Path(__file__).resolve().parents[2]
QRELS = {f"q{i}": {f"d{i}": 1} for i in range(1, 6)}
CONFIG = {"llm_url": "openai+http://127.0.0.1:1/v1?model=stub", "top_k": 5, "mode": "hybrid", "max_tokens": 64,
          "context_tokens": 1500, "min_score": 0.33, "min_score_from": "--answers-min-score"}


def _cite(doc: str, supported: bool) -> dict[str, Any]:
    return {"document_id": doc, "chunk_id": f"{doc}#0", "supported": supported}


def _declined(qid: str, best: float, total: float, answerable: bool) -> AnswerRecord:
    return AnswerRecord(qid, ABSTAINED, [], 0, None, total, answerable=answerable, declined=True, best_score=best,
                        text=f"question {qid}")


def known_section() -> AnswersSection:
    """The nine questions of the module docstring."""
    records = [
        AnswerRecord("q1", "A [1]. B [2].", [_cite("d1", True), _cite("d9", False)], 1, 100.0, 300.0, text="one"),
        AnswerRecord("q2", "C [1].", [_cite("d2", True)], 0, 200.0, 500.0, text="two"),
        AnswerRecord("q3", "No marker.", [], 0, 300.0, 700.0, text="three"),
        _declined("q4", 0.2, 20.0, True),
        AnswerRecord("q5", None, [], 0, None, 1000.0, error="the LLM missed its first-token deadline", text="five"),
        _declined("u1", 0.1, 10.0, False),
        _declined("u2", 0.25, 30.0, False),
        AnswerRecord("u3", "Wrong [1].", [_cite("d5", False)], 0, 400.0, 900.0, answerable=False, text="u three"),
        AnswerRecord("u4", ABSTAINED, [], 0, 150.0, 250.0, answerable=False, llm_abstained=True, text="u four"),
    ]
    return AnswersSection(dict(CONFIG), records)


def test_the_figures_worked_by_hand() -> None:
    s = known_section().to_dict(QRELS)
    assert (s["model"], s["queries"], s["unanswerable_queries"], s["answered"], s["failed"]) == ("stub", 5, 4, 4, 1)
    # the LLM answered q1, q2, q3 (q4 was declined: not an answer without a citation; q5 failed)
    assert (s["answered_by_llm"], s["with_citation"]) == (3, 2)
    assert s["cite_rate"] == pytest.approx(2 / 3) and s["no_citation"] == pytest.approx(1 / 3)
    # judged queries only: 3 citations resolved, 1 dropped; (q1,d1), (q1,d9), (q2,d2): 2 relevant; 2 supported
    assert (s["citations"], s["dropped_citations"], s["citation_validity"]) == (3, 1, 0.75)
    assert s["cited_relevant"] == pytest.approx(2 / 3) and s["supported"] == pytest.approx(2 / 3)
    ab = s["abstention"]
    assert (ab["declined_answerable"], ab["declined_unanswerable"]) == (1, 2)
    assert (ab["answerable"], ab["unanswerable"]) == (5, 4)
    assert ab["precision"] == pytest.approx(2 / 3) and ab["recall"] == 0.5
    assert ab["llm_not_answerable"] == {"answerable": 0, "unanswerable": 1} and "skipped" not in ab
    # TTFT and total over the six questions that asked the LLM (q5 has no first token)
    assert s["ttft_ms"] == {"p50": 200.0, "p95": pytest.approx(380.0), "n": 5}
    assert s["total_ms"] == {"p50": 600.0, "p95": pytest.approx(975.0), "n": 6}
    assert s["declined_total_ms"]["p50"] == 20.0
    outcomes = {r["query_id"]: r["outcome"] for r in s["per_query"]}
    assert outcomes == {"q1": "answered", "q2": "answered", "q3": "answered", "q4": "declined", "q5": "failed",
                        "u1": "declined", "u2": "declined", "u3": "answered", "u4": "llm_not_answerable"}


def test_no_threshold_is_said_and_ratios_without_a_denominator_are_null() -> None:
    s = AnswersSection({**CONFIG, "min_score": None, "min_score_from": None}, []).to_dict({})
    ab = s["abstention"]
    assert ab["precision"] is None and ab["recall"] is None and "no abstention threshold" in ab["skipped"]
    assert s["cite_rate"] is None and s["citation_validity"] is None and s["supported"] is None


ROW = ["stub", "5 answerable + 4 unanswerable", "66.7 % (2 / 3)", "75.0 % (3 / 4)", "66.7 % (2 / 3)",
       "66.7 % (2 / 3)", "50.0 % (2 / 4)", "200 / 380", "600 / 975"]


class _Tables(HTMLParser):
    """The cell texts of each ``<table id=...>`` of a page, row by row."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._table: str | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._table = dict(attrs).get("id") or "?"
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._table is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _toy_beir(folder: Path) -> Path:
    folder.mkdir()
    write_jsonl(folder / "corpus.jsonl", [{"_id": f"d{i}", "title": "", "text": f"text {i}"} for i in range(1, 10)])
    write_jsonl(folder / "queries.jsonl", [{"_id": q, "text": f"query {q}"} for q in QRELS])
    (folder / "qrels").mkdir()
    rows = "".join(f"{q}\t{d}\t1\n" for q, docs in QRELS.items() for d in docs)
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + rows, encoding="utf-8")
    return folder


def test_the_answers_table_and_per_query_rows_are_in_every_report(tmp_path: Path) -> None:
    beir, out = _toy_beir(tmp_path / "toy"), tmp_path / "out"

    def search(text: str, mode: str, top_k: int) -> list[tuple[str, float]]:
        return [(f"d{text[-1]}", 1.0)]

    evaluate(search, beir, "test", ["bm25"], out, {}, top_k=10, show_progress=False,
             answers=lambda split: known_section().to_dict(split.qrels))
    summary = json.loads((out / "summary.json").read_text())["answers"]
    assert summary["abstention"]["precision"] == pytest.approx(2 / 3) and summary["abstention"]["recall"] == 0.5
    assert len(summary["per_query"]) == 9

    md = (out / "report.md").read_text()
    assert "| " + " | ".join(ROW) + " |" in md, md
    assert "| abstention recall (declined unanswerable / unanswerable) | 50.0 % (2 / 4) |" in md
    assert "| answers with no citation | 33.3 % (1 / 3) |" in md  # q4 (declined) is not one
    per_query = md.split("### Answers per query", 1)[1]
    assert "| q4 | answerable | declined | 0 (0) | 0 | 0 | 0.2000 | – | 20 |" in per_query
    assert "| u4 | unanswerable | llm_not_answerable |" in per_query
    assert "error: the LLM missed its first-token deadline" in per_query

    parser = _Tables()
    parser.feed((out / "report.html").read_text())
    table = parser.tables["answers-table"]
    assert table[0][:3] == ["model", "questions", "cite rate"] and table[1] == ROW
    detail = {measure: value for measure, value in parser.tables["answers-detail"]}
    assert detail["abstention threshold (evidence score)"] == "0.3300 (from --answers-min-score)"
    rows = {r[0]: r for r in parser.tables["answers-per-query-table"][1:]}
    assert set(rows) == {r["query_id"] for r in summary["per_query"]}
    assert rows["u1"][1:3] == ["unanswerable", "declined"] and rows["q1"][3] == "2 (1)"


def test_the_held_out_unanswerable_set_was_never_tuned_on() -> None:
    """eval/data's 50 questions are bench/data/unanswerable.json's ``test`` half, none of its ``tune`` half."""
    held = load_unanswerable(UNANSWERABLE_TEST, 1000)
    bench = json.loads((REPO / "bench" / "data" / "unanswerable.json").read_text())
    assert list(held.values()) == bench["test"] and len(held) == 50
    assert not set(held.values()) & set(bench["tune"])
    assert load_unanswerable(UNANSWERABLE_TEST, 0) == {} and len(load_unanswerable(UNANSWERABLE_TEST, 3)) == 3


@pytest.fixture(scope="module")
def stub() -> Iterator[StubLLM]:
    server = StubLLM().start()
    yield server
    server.stop()


def test_declined_questions_cost_no_llm_call_and_are_not_uncited_answers(
    tmp_path: Path, minilm: SentenceTransformerEmbedder, stub: StubLLM, scifact_sample: list[SourceDocument]
) -> None:
    llm = LLMSettings(url=stub.url, structured="off", retry_after_s=0)
    quarry = Quarry(Settings(data_dir=tmp_path / "data", llm=llm, cache=CacheSettings(enabled=False)), embedder=minilm)
    try:
        quarry.create_collection("sample", language="en")
        docs = scifact_sample[:10]
        quarry.upsert("sample", docs)
        judged = {f"q{i}": d.title for i, d in enumerate(docs[:2])}
        qrels = {f"q{i}": {d.id: 1} for i, d in enumerate(docs[:2])}
        out_of_corpus = {"u1": "What is the capital of Mongolia?", "u2": "Who won the 2014 Wimbledon men's final?"}
        stub.replies.extend([Reply(pieces=["Claim [1]."]), Reply(pieces=["Claim [1]."])])
        asked = len(stub.requests)
        section = answer_queries(quarry, "sample", judged, limit=2, unanswerable=out_of_corpus, min_score=0.5,
                                 mode="dense", max_tokens=16).to_dict(qrels)
    finally:
        quarry.close()
    assert len(stub.requests) == asked + 2 and not stub.replies  # the two judged ones only
    outcomes = {r["query_id"]: r["outcome"] for r in section["per_query"]}
    assert outcomes == {"q0": "answered", "q1": "answered", "u1": "declined", "u2": "declined"}, section["per_query"]
    ab = section["abstention"]
    assert (ab["precision"], ab["recall"], ab["min_score"], ab["min_score_from"]) == (1.0, 1.0, 0.5,
                                                                                     "--answers-min-score")
    assert section["cite_rate"] == 1.0 and section["citation_validity"] == 1.0
    assert all(r["best_score"] < 0.5 and r["ttft_ms"] is None for r in section["per_query"] if r["set"] != "answerable")
    assert section["ttft_ms"]["n"] == 2 and section["declined_total_ms"]["n"] == 2


def test_without_a_threshold_the_unanswerable_questions_are_not_asked(
    tmp_path: Path, minilm: SentenceTransformerEmbedder, stub: StubLLM, scifact_sample: list[SourceDocument]
) -> None:
    llm = LLMSettings(url=stub.url, structured="off", retry_after_s=0)
    quarry = Quarry(Settings(data_dir=tmp_path / "data", llm=llm, cache=CacheSettings(enabled=False)), embedder=minilm)
    try:
        quarry.create_collection("sample", language="en")
        quarry.upsert("sample", scifact_sample[:3])
        stub.replies.append(Reply(pieces=["Claim [1]."]))
        section = answer_queries(quarry, "sample", {"q0": scifact_sample[0].title}, limit=1,
                                 unanswerable={"u1": "What is the capital of Mongolia?"}, max_tokens=16).to_dict({})
    finally:
        quarry.close()
    assert section["unanswerable_queries"] == 0 and section["abstention"]["min_score"] is None
    assert "skipped" in section["abstention"] and not stub.replies
