"""The per-query view and the HTML report on a run worked by hand (no search engine)."""

from __future__ import annotations

import re

import pytest

import eval.html as html_module
from eval.html import render_report_html
from eval.metrics import per_query_metrics
from eval.per_query import hybrid_losses, per_query_view, query_rows, worst_queries
from eval.reference import References
from eval.summary import ModeResult, Summary

QRELS = {"q1": {"d1": 1}, "q2": {"d2": 1, "d9": 1}, "q3": {"d3": 2, "d0": 0}}
QUERIES = {"q1": "what is <b>bold</b>", "q2": "second query", "q3": "third query"}
RANKINGS = {
    "bm25": {"q1": ["d1", "x"], "q2": ["x", "d2"], "q3": ["x", "y"]},
    "dense": {"q1": ["x", "d1"], "q2": ["d2", "x"], "q3": ["d3"]},
    "hybrid": {"q1": ["d1", "x"], "q2": ["x", "d2"], "q3": ["x", "d3"]},
}
CHANNELS = {  # the hybrid search's explain: channel ranks of each hit
    "q1": {"d1": {"bm25": 1, "dense": 2}, "x": {"bm25": 2, "dense": 1}},
    "q2": {"x": {"bm25": 1, "dense": 2}, "d2": {"bm25": 2, "dense": 1}},
    "q3": {"x": {"bm25": 1}, "d3": {"dense": 1}},
}


def summary() -> Summary:
    modes = {}
    for mode, rankings in RANKINGS.items():
        per_query = per_query_metrics(QRELS, rankings)
        means = {m: sum(row[m] for row in per_query.values()) / 3 for m in next(iter(per_query.values()))}
        ranks = CHANNELS if mode == "hybrid" else {}
        modes[mode] = ModeResult(mode, means, per_query, {q: 1.0 for q in QRELS}, rankings, ranks)
    return Summary(config={"dataset": "toy", "split": "test"}, modes=modes, queries=QUERIES, qrels=QRELS)


def test_rows_worst_and_hybrid_losses() -> None:
    rows = {row.qid: row for row in query_rows(summary())}
    q2 = rows["q2"]
    assert [d.doc_id for d in q2.relevant] == ["d2", "d9"]
    assert q2.relevant[0].ranks == {"bm25": 2, "dense": 1, "hybrid": 2} and q2.relevant[0].channels == {
        "bm25": 2, "dense": 1,
    }
    assert q2.relevant[1].ranks == {"bm25": None, "dense": None, "hybrid": None} and q2.relevant[1].channels == {}
    assert [d.doc_id for d in rows["q3"].relevant] == ["d3"]  # grade 0 is not relevant
    assert rows["q3"].relevant[0].channels == {"dense": 1}
    # hybrid put the relevant document second where dense had it first: lost on q2 and q3, not q1
    losses = hybrid_losses(list(rows.values()))
    assert [(r.qid, channel) for r, channel, _ in losses] == [("q3", "dense"), ("q2", "dense")]
    assert losses[0][2] > losses[1][2] > 0
    assert [r.qid for r in worst_queries(list(rows.values()), "hybrid", 2)] == ["q2", "q3"]
    view = per_query_view(summary())
    assert view["worst_mode"] == "hybrid" and [x["qid"] for x in view["hybrid_losses"]] == ["q3", "q2"]


def test_html_escapes_and_shows_the_view() -> None:
    html = render_report_html(summary(), References(), {})
    assert "what is &lt;b&gt;bold&lt;/b&gt;" in html and "<b>bold</b>" not in html
    assert 'id="hybrid-losses"' in html and 'id="worst-queries"' in html and 'id="all-queries-table"' in html
    assert "Queries where hybrid lost to a single channel (2)" in html
    assert "bm25#2 dense#1" in html and "Not measured in this run" in html
    assert '<span class="rel">d2</span>' in html
    assert not re.search(r"https?://", html) and "All 3 queries" in html


def test_the_page_shows_the_first_queries_of_a_large_split(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(html_module, "ALL_SHOWN", 2)
    html = render_report_html(summary(), References(), {})
    assert "The first 2 of 3 queries (all of them: queries.json)" in html
