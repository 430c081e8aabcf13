import json
from pathlib import Path

import numpy as np
import pytest
from rank_bm25 import BM25Okapi

from indexing.sources import iter_jsonl
from quarry.settings import BM25Settings
from indexing.bm25 import BM25Index
from indexing.text import tokenize


@pytest.fixture(scope="module")
def scifact_tokens(shared_data: Path) -> list[list[str]]:
    docs = list(iter_jsonl(shared_data / "scifact" / "corpus.jsonl"))[:1500]
    return [tokenize(f"{d.title}\n{d.text}", "en") for d in docs]


def _index(tokens: list[list[str]], params: BM25Settings, version: int = 1) -> BM25Index:
    rows = [(f"c{i}", f"d{i}", t, {"n": i}) for i, t in enumerate(tokens)]
    return BM25Index.build(rows, params, version)


def test_scores_agree_with_rank_bm25_okapi(scifact_tokens: list[list[str]]) -> None:
    index = _index(scifact_tokens, BM25Settings(method="robertson", k1=1.5, b=0.75))
    okapi = BM25Okapi(scifact_tokens, k1=1.5, b=0.75)
    n = len(scifact_tokens)
    for query in ["vitamin d deficiency cancer risk", "insulin resistance obese mice", "gene expression t cells"]:
        terms = tokenize(query, "en")
        # rank-bm25 floors negative idf at eps * mean idf; compare on terms of positive idf (df < N/2)
        terms = [t for t in terms if sum(t in set(doc) for doc in scifact_tokens) < n / 2]
        assert terms
        ours = index.scores(terms)
        theirs = np.asarray(okapi.get_scores(terms), dtype=np.float32)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_statistics_stay_exact_after_delete(scifact_tokens: list[list[str]]) -> None:
    params = BM25Settings(method="lucene")
    full = _index(scifact_tokens[:1000], params)
    # "delete" the second half: the snapshot rebuilt from the live rows equals a fresh index of them
    rebuilt = _index(scifact_tokens[:500], params, version=2)
    fresh = _index(scifact_tokens[:500], params)
    terms = tokenize("vitamin d deficiency", "en")
    np.testing.assert_allclose(rebuilt.scores(terms), fresh.scores(terms))
    assert not np.allclose(full.scores(terms)[:500], fresh.scores(terms))  # N, avgdl, df changed


def test_search_filters_orders_and_persists(tmp_path: Path, scifact_tokens: list[list[str]]) -> None:
    index = _index(scifact_tokens[:300], BM25Settings())
    terms = tokenize("cancer", "en")
    hits = index.search(terms, 10)
    assert hits and all(a.score >= b.score for a, b in zip(hits, hits[1:], strict=False))
    even = index.search(terms, 10, keep=lambda p: p["n"] % 2 == 0)
    assert even and all(int(h.chunk_id[1:]) % 2 == 0 for h in even)
    assert index.search(tokenize("zzzunknownterm", "en"), 10) == []
    index.save(tmp_path / "bm25")
    loaded = BM25Index.load(tmp_path / "bm25")
    assert loaded is not None and loaded.version == 1
    assert [h.chunk_id for h in loaded.search(terms, 10)] == [h.chunk_id for h in hits]
    assert json.loads((tmp_path / "bm25" / "rows.json").read_text())["chunk_ids"][0] == "c0"


def test_top_gives_the_rows_search_gives_and_documents_share_a_code(scifact_tokens: list[list[str]]) -> None:
    # three chunks per document: rows 3d, 3d+1, 3d+2 belong to document d
    rows = [(f"c{i}", f"d{i // 3}", t, {"n": i}) for i, t in enumerate(scifact_tokens[:300])]
    index = BM25Index.build(rows, BM25Settings(), 1)
    terms = tokenize("cancer cells", "en")
    top_rows, top_scores = index.top(terms, 25)
    assert top_rows.dtype == np.int64 and top_scores.dtype == np.float32 and len(top_rows) == 25
    assert [(h.row, h.score) for h in index.search(terms, 25)] == list(
        zip(top_rows.tolist(), top_scores.tolist(), strict=True)
    )
    codes = index.document_codes
    assert codes.shape == (300,) and len(set(codes.tolist())) == 100
    assert all(codes[i] == codes[i - i % 3] for i in range(300))
    empty = BM25Index.build([], BM25Settings(), 1)
    assert len(empty.top(terms, 5)[0]) == 0 and empty.document_codes.shape == (0,)


def test_chinese_two_character_term_in_one_document_ranks_first() -> None:
    docs = [
        "北京是中华人民共和国的首都，也是全国的政治中心。",
        "上海是中国的经济中心，位于长江入海口。",
        "熊猫主要生活在四川的山区，以竹子为食。",
        "广州的早茶文化历史悠久，点心种类繁多。",
    ]
    tokens = [tokenize(d, "zh") for d in docs]
    index = BM25Index.build([(f"c{i}", f"d{i}", t, {}) for i, t in enumerate(tokens)], BM25Settings(), 1)
    for term, expected in [("熊猫", "d2"), ("早茶", "d3"), ("首都", "d0")]:
        hits = index.search(tokenize(term, "zh"), 4)
        assert hits[0].document_id == expected and hits[0].score > 0
        assert len(hits) == 1


def test_tokenize_languages() -> None:
    assert tokenize("The running Foxes", "en") == ["run", "fox"]
    assert tokenize("The running Foxes", "zh") == ["the", "running", "foxes"]
    assert "人工智能" in tokenize("人工智能的应用", "zh")
    assert tokenize("机器 running", "auto") == ["机器", "#机器", "run"]
    assert tokenize("", "auto") == []
