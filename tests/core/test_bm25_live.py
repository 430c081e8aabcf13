"""The incremental BM25 index ranks as a bm25s snapshot of the same rows, after upserts and deletes."""

import random
from pathlib import Path

import numpy as np
import pytest

from indexing.sources import iter_jsonl
from quarry.settings import BM25Settings
from indexing.bm25 import BM25Index
from indexing.bm25_live import WITHIN_KEPT, LiveBM25, Row
from indexing.text import tokenize


@pytest.fixture(scope="module")
def scifact_tokens(shared_data: Path) -> list[list[str]]:
    docs = list(iter_jsonl(shared_data / "scifact" / "corpus.jsonl"))[:1200]
    return [tokenize(f"{d.title}\n{d.text}", "en") for d in docs]


def _same(live: LiveBM25, rows: list[Row], params: BM25Settings, queries: list[list[str]]) -> None:
    snap = BM25Index.build(rows, params, 1)
    view = live.view()
    by_chunk = {c: r for r, c in enumerate(view.chunk_ids) if view.alive[r]}
    assert sorted(by_chunk) == sorted(snap.chunk_ids)
    assert view.n_live == len(snap)
    for q in queries:
        ours = view.scores(q)
        theirs = snap.scores(q)
        mapped = np.array([ours[by_chunk[c]] for c in snap.chunk_ids], dtype=np.float32)
        np.testing.assert_allclose(mapped, theirs, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire", "bm25l", "bm25+"])
def test_scores_equal_a_bm25s_snapshot_after_upserts_and_deletes(scifact_tokens: list[list[str]], method: str) -> None:
    params = BM25Settings(method=method)
    rng = random.Random(7)
    docs = {f"d{i}": [(f"d{i}#0", f"d{i}", t, {"i": i})] for i, t in enumerate(scifact_tokens[:800])}
    live = LiveBM25.build([r for rows in docs.values() for r in rows], params, 1)
    queries = [scifact_tokens[rng.randrange(1200)][:8] for _ in range(15)] + [["zzz-unknown"], []]
    _same(live, [r for rows in docs.values() for r in rows], params, queries)
    for step in range(2, 40):  # upserts with new texts and new documents, deletes
        changed: dict[str, list[Row]] = {}
        for _ in range(rng.randrange(1, 30)):
            d = f"d{rng.randrange(1000)}"
            if rng.random() < 0.3:
                changed[d] = []
            else:
                t = scifact_tokens[rng.randrange(1200)]
                changed[d] = [(f"{d}#{k}", d, t[k * 40 : (k + 1) * 40], {"i": k}) for k in range(rng.randrange(1, 3))]
        for d, rows in changed.items():
            docs[d] = rows
        live.apply(changed, step)
    _same(live, [r for rows in docs.values() for r in rows if r[2]], params, queries)
    live.compact()
    _same(live, [r for rows in docs.values() for r in rows if r[2]], params, queries)


def test_a_view_never_changes_and_a_snapshot_round_trips(tmp_path: Path, scifact_tokens: list[list[str]]) -> None:
    params = BM25Settings()
    live = LiveBM25.build([(f"c{i}", f"d{i}", t, {}) for i, t in enumerate(scifact_tokens[:300])], params, 5)
    before = live.view()
    q = scifact_tokens[3][:6]
    first = before.scores(q).copy()
    live.apply({"d3": [], "d9": [("x", "d9", scifact_tokens[3], {})]}, 6)
    np.testing.assert_array_equal(before.scores(q), first)  # an old view is immutable
    after = live.view()
    assert after.version == 6 and after.n_live == 299  # d3 gone, d9 one row
    live.save(tmp_path / "s")
    loaded = LiveBM25.load(tmp_path / "s", params)
    assert loaded.version == 6 and loaded.live_chunk_ids() == live.live_chunk_ids()
    rows, scores = after.top(q, 5)
    rows2, scores2 = loaded.view().top(q, 5)
    assert [after.chunk_ids[r] for r in rows] == [loaded.view().chunk_ids[r] for r in rows2]
    np.testing.assert_allclose(scores, scores2, rtol=1e-6)


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire", "bm25l", "bm25+"])
def test_the_shared_formulas_are_bm25s_own(method: str) -> None:
    """``indexing.bm25_formulas`` (both indexes' formulas) equals bm25s' per-method scorers, element by element."""
    from bm25s import scoring

    from indexing import bm25_formulas as f

    n, k1, b = 1000.0, 1.5, 0.75
    df = np.array([1.0, 3.0, 40.0, 499.0, 500.0, 501.0, 999.0, 1000.0])  # robertson's idf clips at df > n / 2
    want_idf = [scoring._select_idf_scorer(method)(d, n) for d in df.tolist()]
    np.testing.assert_allclose(f.idf(method, df, n), want_idf, rtol=1e-12)
    tf = np.array([0.0, 1.0, 2.0, 5.0, 1.0, 3.0])
    dl = np.array([10.0, 10.0, 80.0, 200.0, 3.0, 47.0])
    want_tfc = scoring._select_tfc_scorer(method)(tf, dl, 50.0, k1, b, f.DELTA)
    np.testing.assert_allclose(f.tfc(method, tf, 1 - b + b * dl / 50.0, k1), want_tfc, rtol=1e-12)
    absent = float(scoring._select_tfc_scorer(method)(0.0, 1.0, 1.0, k1, b, f.DELTA))  # tf 0, dl = avgdl
    assert f.tfc_absent(method, k1) == pytest.approx(absent if method in ("bm25l", "bm25+") else 0.0)
    assert f.okapi_scale(method, k1) == (k1 + 1 if method == "robertson" else 1.0)


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire", "bm25l", "bm25+"])
def test_scores_within_a_tenant_equal_an_index_of_its_rows_alone(scifact_tokens: list[list[str]], method: str) -> None:
    """``within="a/"`` (a shared collection's tenant) scores as an index of ``a/``'s live rows only.

    Before (found 2026-12-03, h-attack2), N, avgdl and df were every tenant's: tenant a's score for
    its own document fell from 0.298 to 0.093 when tenant b wrote five documents holding the term.
    """
    params = BM25Settings(method=method)
    rng = random.Random(11)
    docs = {f"{t}/d{i}": [(f"{t}/d{i}#0", f"{t}/d{i}", scifact_tokens[i * 2 + (t == "ab")], {})]
            for i in range(300) for t in ("a", "ab")}  # "ab/" ids sort right after "a/" ones
    live = LiveBM25.build([r for rows in docs.values() for r in rows], params, 1)
    changed: dict[str, list[Row]] = {}
    for _ in range(60):  # upserts and deletes of both tenants' documents
        d = f"{rng.choice(['a', 'ab'])}/d{rng.randrange(400)}"
        changed[d] = [] if rng.random() < 0.3 else [(f"{d}#0", d, scifact_tokens[rng.randrange(1200)][:60], {})]
    live.apply(changed, 2)
    docs.update(changed)
    queries = [scifact_tokens[rng.randrange(1200)][:8] for _ in range(15)] + [["zzz-unknown"], []]
    mine = [r for d, rows in docs.items() if d.startswith("a/") for r in rows if r[2]]
    alone = LiveBM25.build(mine, params, 2).view()
    view = live.view()
    row_of = {c: r for r, c in enumerate(alone.chunk_ids)}
    for q in queries:
        ours = view.scores(q, within="a/")
        assert not ours[[not d.startswith("a/") for d in view.document_ids[: view.n_rows]]].any()
        expected = alone.scores(q)
        for r, c in enumerate(view.chunk_ids[: view.n_rows]):
            if view.alive[r] and c.startswith("a/"):
                assert ours[r] == pytest.approx(float(expected[row_of[c]]), rel=2e-5, abs=2e-5), (q, c)
    for i in range(40):  # a mask per tenant asked, a bounded number kept
        view.rows_within(f"t{i}/")
    assert len(view._within) <= WITHIN_KEPT
