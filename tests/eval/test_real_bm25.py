"""A real BM25 (bm25s) evaluated end to end on SciFact lands on the published local sanity line.

REFERENCE_SCORES.md lists "local sanity (not published): naive BM25 k1=0.9 b=0.4" (lowercase
alphanumeric tokens, no stemming, title + text) at nDCG@10 0.659 / R@100 0.889. The same
recipe with bm25s' Robertson BM25 must land within 0.01 of both, and every per-query value that
pytrec_eval gives must equal the textbook formulas computed directly from the run.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import bm25s
import pytest

from eval.beir import iter_corpus, load_split
from eval.reference import load_references
from eval.runner import evaluate


def tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def textbook(relevant: set[str], ranking: list[str]) -> dict[str, float]:
    """Binary-relevance nDCG@10, Recall@10/100, MRR@10 written out from their definitions."""
    dcg = sum(1 / math.log2(r + 2) for r, d in enumerate(ranking[:10]) if d in relevant)
    idcg = sum(1 / math.log2(r + 2) for r in range(min(10, len(relevant))))
    first = next((r + 1 for r, d in enumerate(ranking[:10]) if d in relevant), None)
    return {
        "ndcg@10": dcg / idcg,
        "recall@10": len(relevant & set(ranking[:10])) / len(relevant),
        "recall@100": len(relevant & set(ranking[:100])) / len(relevant),
        "mrr@10": 1 / first if first else 0.0,
    }


@pytest.mark.slow
def test_bm25s_on_scifact_matches_the_sanity_line(shared_data: Path, tmp_path: Path) -> None:
    beir = shared_data / "scifact"
    docs = list(iter_corpus(beir))
    ids = [doc["_id"] for doc in docs]
    retriever = bm25s.BM25(method="robertson", k1=0.9, b=0.4)
    retriever.index([tokens(f"{d['title']} {d['text']}") for d in docs], show_progress=False)
    rankings: dict[str, list[str]] = {}

    def search(text: str, mode: str, top_k: int) -> list[tuple[str, float]]:
        found, scores = retriever.retrieve(
            [tokens(text)], k=top_k, show_progress=False, n_threads=1
        )
        hits = [(ids[int(i)], float(s)) for i, s in zip(found[0], scores[0], strict=True)]
        rankings[text] = [doc_id for doc_id, _ in hits]
        return hits

    summary = evaluate(search, beir, "test", ["bm25"], tmp_path, {"bm25": "bm25s robertson"})
    result = summary.modes["bm25"]
    sanity = next(
        row
        for row in load_references(shared_data / "REFERENCE_SCORES.md", "scifact").rows
        if row.system.startswith("local sanity")
    )
    assert sanity.ndcg_at_10 is not None and sanity.recall_at_100 is not None
    assert result.metrics["ndcg@10"] == pytest.approx(sanity.ndcg_at_10, abs=0.01)
    assert result.metrics["recall@100"] == pytest.approx(sanity.recall_at_100, abs=0.01)

    split = load_split(beir, "test")
    for qid, text in split.queries.items():
        expected = textbook(set(split.qrels[qid]), rankings[text])
        assert result.per_query[qid] == pytest.approx(expected, abs=1e-9), qid
