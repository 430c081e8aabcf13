"""Parsing the published numbers of shared/data/REFERENCE_SCORES.md."""

from __future__ import annotations

from pathlib import Path

from eval.reference import References, load_references, parse_reference_scores


def test_scifact_rows_from_the_real_file(shared_data: Path) -> None:
    refs = load_references(shared_data / "REFERENCE_SCORES.md", "scifact")
    assert refs.heading is not None and refs.heading.startswith("SciFact")
    by_system = {row.system: row for row in refs.rows}
    assert len(refs.rows) == 9
    anserini = by_system["BM25 multifield, Anserini/Lucene (reproduces the BEIR ES run)"]
    assert (anserini.ndcg_at_10, anserini.recall_at_100, anserini.status) == (
        0.6647,
        0.9076,
        "verified",
    )
    assert "anserini" in anserini.source
    dense = by_system["dense: sentence-transformers/all-MiniLM-L6-v2 (cosine, exact)"]
    assert (dense.ndcg_at_10, dense.recall_at_100) == (0.6451, 0.925)
    hybrid = by_system["hybrid: RRF(BM25 flat, BGE-base-en-v1.5)"]
    assert (hybrid.ndcg_at_10, hybrid.recall_at_100) == (0.744, None)
    assert (
        hybrid.ndcg_text == "0.7440 (DuckDB) / 0.6800 (PostgreSQL)" and hybrid.recall_text == "n/r"
    )
    rerank = by_system['BM25 top-100 + cross-encoder/ms-marco-MiniLM-L-6-v2 rerank ("BM25+CE")']
    assert rerank.recall_at_100 is None and rerank.recall_text.startswith("= BM25 R@100")
    assert by_system["hybrid with all-MiniLM-L6-v2"].ndcg_at_10 is None
    assert "Expectation for the project" in refs.notes


def test_other_sections_of_the_real_file(shared_data: Path) -> None:
    path = shared_data / "REFERENCE_SCORES.md"
    cmrc = load_references(path, "cmrc2018-retrieval")
    assert cmrc.heading is not None and cmrc.rows == []
    assert "no published retrieval numbers" in cmrc.notes
    nf = load_references(path, "nfcorpus")
    assert [row.ndcg_at_10 for row in nf.rows][:2] == [0.3254, 0.3208]
    assert nf.rows[0].status == ""  # this table has no status column
    assert load_references(path, "msmarco") == References()


def test_missing_file_gives_no_references(tmp_path: Path) -> None:
    assert load_references(tmp_path / "REFERENCE_SCORES.md", "scifact") == References()
    assert load_references(None, "scifact") == References()


def test_table_without_the_needed_columns_is_ignored() -> None:
    text = "## SciFact\n| model | score |\n|---|---|\n| x | 0.5 |\n\n## Other\n"
    assert parse_reference_scores(text, "scifact") == References(heading="SciFact")
