import asyncio
import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from indexing.document_rules import SourceDocument
from indexing.sources import read_documents
from quarry.errors import (
    CollectionNotFound,
    InvalidDocument,
    InvalidFilter,
    InvalidQuery,
    ModelMismatch,
    StoreUnavailable,
)
from quarry.service import Quarry
from retrieval.results import Mode
from tests.core.conftest import CountingEmbedder, write_jsonl


def _ids(result: object) -> list[str]:
    return [h.document_id for h in result.hits]  # type: ignore[attr-defined]


def test_reingest_is_idempotent_and_makes_zero_embedding_calls(
    service: Quarry, collection: str, counting: CountingEmbedder, scifact_docs: list[SourceDocument]
) -> None:
    first = service.upsert(collection, scifact_docs)
    assert first.added == len(scifact_docs) and first.embedded >= len(scifact_docs)
    counts = service.describe(collection)
    before = counting.texts
    again = service.upsert(collection, scifact_docs)
    assert counting.texts == before  # zero embedding calls
    assert again.unchanged == len(scifact_docs) and again.embedded == 0 and again.chunks_written == 0
    assert service.describe(collection) == counts
    assert counts["documents"] == len(scifact_docs) and counts["vectors"] == counts["chunks"]


def test_changed_document_replaces_its_chunks_and_delete_removes_both_channels(
    service: Quarry, collection: str, counting: CountingEmbedder
) -> None:
    long_text = " ".join(f"word{i}" for i in range(600))
    service.upsert(
        collection,
        [SourceDocument("doc", long_text, "zebra", {"year": 2001}), SourceDocument("other", "plain text about cats")],
    )
    old = service.docstore.chunk_ids_of(collection, ["doc"])["doc"]
    assert len(old) >= 2
    before = counting.texts
    service.upsert(collection, [SourceDocument("doc", "a short new text about giraffes", "zebra", {"year": 2002})])
    assert counting.texts - before == 1  # only the new chunk is embedded
    new = service.docstore.chunk_ids_of(collection, ["doc"])["doc"]
    assert len(new) == 1 and not set(new) & set(old)
    assert service.store.get(collection, old) == []
    assert service.store.count(collection) == 2
    assert _ids(service.search(collection, "giraffes", mode="bm25")) == ["doc"]
    assert _ids(service.search(collection, "word599", mode="bm25")) == []
    assert _ids(service.search(collection, "giraffes", mode="hybrid", filters={"year": 2002}))[0] == "doc"
    service.delete_documents(collection, ["doc"])
    assert service.store.count(collection) == 1
    assert "doc" not in _ids(service.search(collection, "giraffes", mode="bm25"))
    assert "doc" not in _ids(service.search(collection, "giraffes zebra", mode="dense"))
    assert service.describe(collection)["documents"] == 1


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_grouping_keeps_each_documents_best_chunk_and_pages_slice_one_list(
    service: Quarry, collection: str, mode: Mode
) -> None:
    chunky = " ".join(f"giraffes graze acacia{i}" for i in range(400))  # several distinct chunks
    service.upsert(
        collection,
        [
            SourceDocument("chunky", chunky),
            SourceDocument("one", "giraffes are tall"),
            SourceDocument("two", "a note on giraffes and zebras"),
            SourceDocument("cats", "cats sleep all day"),
        ],
    )
    chunks = service.docstore.chunk_ids_of(collection, ["chunky"])["chunky"]
    assert len(chunks) >= 3
    grouped = service.search(collection, "giraffes graze", mode=mode, top_k=4)
    per_chunk = service.search(collection, "giraffes graze", mode=mode, top_k=10, group=False)
    ids = _ids(grouped)
    assert len(ids) == len(set(ids)) and "chunky" in ids
    assert sorted(h.chunk_id for h in per_chunk.hits if h.document_id == "chunky") == sorted(chunks)
    best = next(h for h in grouped.hits if h.document_id == "chunky")
    if mode != "hybrid":  # one channel: the document's hit is its best-ranked chunk, ranks count documents
        assert best.chunk_id == next(h.chunk_id for h in per_chunk.hits if h.document_id == "chunky")
        assert [h.explain[mode]["rank"] for h in grouped.hits] == list(range(1, len(grouped.hits) + 1))
    else:  # fused: the chunk of the channel that ranks the document best (BM25 on a tie)
        found = [best.explain[c] for c in ("bm25", "dense") if c in best.explain]
        assert best.chunk_id == min(found, key=lambda e: e["rank"])["chunk_id"]
    page = service.search(collection, "giraffes graze", mode=mode, top_k=2, offset=1)
    assert [h.chunk_id for h in page.hits] == [h.chunk_id for h in grouped.hits[1:3]]
    assert page.total == grouped.total


def test_metadata_only_change_reuses_vectors(service: Quarry, collection: str, counting: CountingEmbedder) -> None:
    service.upsert(collection, [SourceDocument("m", "metadata only change", "", {"tag": "a"})])
    before = counting.texts
    service.upsert(collection, [SourceDocument("m", "metadata only change", "", {"tag": "b"})])
    assert counting.texts == before
    assert _ids(service.search(collection, "change", mode="dense", filters={"tag": "b"})) == ["m"]
    assert _ids(service.search(collection, "change", mode="dense", filters={"tag": "a"})) == []


def test_malformed_jsonl_names_the_line_and_stores_nothing(service: Quarry, collection: str, tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "bad.jsonl", [{"id": "1", "text": "ok"}, {"id": "2", "text": "ok"}, '{"id": "3", "text": ']
    )
    with pytest.raises(InvalidDocument, match="line 3"):
        service.upsert(collection, read_documents(path))
    for bad, pattern in [
        ({"text": "no id"}, "line 1.*'id'"),
        ({"id": "x", "text": 5}, "'text' must be a string"),
        ({"id": "x", "text": "t", "metadata": {"nested": {"a": 1}}}, "field 'nested'"),
        ({"id": "x", "title": "\ud800", "text": "t"}, "line 1: document .x.: .title. holds an unpaired UTF-16"),
    ]:
        with pytest.raises(InvalidDocument, match=pattern):
            read_documents(write_jsonl(tmp_path / "b.jsonl", [bad]))
    assert service.describe(collection)["documents"] == 0


def test_metadata_type_conflict_writes_nothing(service: Quarry, collection: str) -> None:
    service.upsert(collection, [SourceDocument("a", "first", "", {"year": 2001})])
    with pytest.raises(InvalidDocument, match="'year' holds int"):
        service.upsert(
            collection, [SourceDocument("b", "second", "", {}), SourceDocument("c", "third", "", {"year": "x"})]
        )
    assert service.describe(collection)["documents"] == 1


def test_search_errors_are_typed(service: Quarry, collection: str) -> None:
    service.upsert(collection, [SourceDocument("a", "alpha beta", "", {"year": 2001, "tag": "x"})])
    with pytest.raises(InvalidQuery, match="empty"):
        service.search(collection, "   ")
    with pytest.raises(InvalidQuery, match="top_k"):
        service.search(collection, "alpha", top_k=0)
    with pytest.raises(InvalidQuery, match="rank_window_size"):
        service.search(collection, "alpha", top_k=10_000)
    with pytest.raises(InvalidFilter, match="unknown filter field 'yeer'"):
        service.search(collection, "alpha", filters={"yeer": 2001})
    with pytest.raises(InvalidFilter, match="holds int"):
        service.search(collection, "alpha", filters={"year": "2001"})
    with pytest.raises(CollectionNotFound):
        service.search("nope", "alpha")


def test_filters_in_both_channels(service: Quarry, collection: str) -> None:
    docs = [
        SourceDocument(
            f"d{i}", f"protein folding study number {i}", "", {"year": 2000 + i, "tag": "even" if i % 2 == 0 else "odd"}
        )
        for i in range(10)
    ]
    service.upsert(collection, docs)
    for mode in ("bm25", "dense", "hybrid"):
        got = _ids(
            service.search(
                collection,
                "protein folding",
                mode=mode,
                top_k=10,
                filters={"year": {"$gte": 2003, "$lt": 2007}, "tag": {"$in": ["even"]}},
            )
        )
        assert sorted(got) == ["d4", "d6"], mode
        ors = _ids(
            service.search(
                collection, "protein folding", mode=mode, top_k=10, filters={"$or": [{"year": 2001}, {"year": 2009}]}
            )
        )
        assert sorted(ors) == ["d1", "d9"], mode


def test_pages_joined_equal_the_top_list(service: Quarry, collection: str, scifact_docs: list[SourceDocument]) -> None:
    service.upsert(collection, scifact_docs[:150])
    for mode in ("bm25", "dense", "hybrid"):
        top = _ids(service.search(collection, "cell differentiation in cancer", mode=mode, top_k=30))
        pages = [
            _ids(service.search(collection, "cell differentiation in cancer", mode=mode, top_k=7, offset=o))
            for o in range(0, 30, 7)
        ]
        joined = [d for page in pages for d in page][:30]
        assert joined == top, mode
        assert len(set(top)) == len(top)


def test_hybrid_explain_has_both_channels(service: Quarry, collection: str, scifact_docs: list[SourceDocument]) -> None:
    service.upsert(collection, scifact_docs[:100])
    result = service.search(collection, scifact_docs[3].title, mode="hybrid", top_k=5)
    top = result.hits[0]
    assert top.document_id == scifact_docs[3].id
    assert set(top.explain) >= {"bm25", "dense", "fusion"}
    assert top.explain["fusion"]["k"] == 60
    assert top.explain["bm25"]["rank"] >= 1 and top.explain["dense"]["score"] > 0


def test_async_search_equals_search_and_raises_the_same_errors(
    service: Quarry, collection: str, scifact_docs: list[SourceDocument]
) -> None:
    service.upsert(collection, scifact_docs[:120])
    query = "cell differentiation in cancer"

    async def both(mode: Mode, **kw: object) -> None:
        sync = service.search(collection, query, mode=mode, top_k=12, **kw)  # type: ignore[arg-type]
        concurrent = await asyncio.gather(
            *(service.search_async(collection, query, mode=mode, top_k=12, **kw) for _ in range(6))  # type: ignore[arg-type]
        )
        for result in concurrent:  # batched with each other: the model's vectors may differ by float noise
            assert [h.chunk_id for h in result.hits] == [h.chunk_id for h in sync.hits]
            assert [{c: e.get("rank") for c, e in h.explain.items()} for h in result.hits] == [
                {c: e.get("rank") for c, e in h.explain.items()} for h in sync.hits
            ]
            assert [h.score for h in result.hits] == pytest.approx([h.score for h in sync.hits], abs=1e-5)
            assert result.total == sync.total and result.degraded == sync.degraded == []

    async def run() -> None:
        for mode in ("bm25", "dense", "hybrid"):
            await both(mode)
            await both(mode, offset=5)
        with pytest.raises(InvalidQuery):
            await service.search_async(collection, " ")
        with pytest.raises(CollectionNotFound):
            await service.search_async("nope", "alpha")

    asyncio.run(run())


def test_documents_without_bm25_tokens_are_stored_and_every_mode_still_searches(
    service: Quarry, collection: str
) -> None:
    # stop words only, punctuation, an emoji: no BM25 token (bm25s cannot index an all-empty corpus)
    blank = [SourceDocument("be", "To be, or not to be"), SourceDocument("dots", "..."), SourceDocument("e", "🙂")]
    assert service.upsert(collection, blank).added == 3
    for mode in ("bm25", "dense", "hybrid"):
        result = service.search(collection, "question", mode=mode)
        assert bool(result.hits) == (mode != "bm25")
    service.upsert(collection, [SourceDocument("q", "a question about giraffes")])
    assert _ids(service.search(collection, "question", mode="bm25")) == ["q"]
    assert _ids(service.search(collection, "question", mode="hybrid"))[0] == "q"
    service.delete_documents(collection, ["q"])
    assert service.search(collection, "question", mode="hybrid").hits
    assert service.describe(collection)["documents"] == 3


def test_concurrent_upserts_of_one_document_leave_one_version(service: Quarry, collection: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    versions = [
        SourceDocument("doc", " ".join(f"{word}{i} one" for i in range(300)), "", {field: 1})
        for word, field in (("alpha", "year"), ("beta", "lang_code"))
    ]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda d: service.upsert(collection, [d]), versions))
    chunks = service.docstore.chunk_ids_of(collection, ["doc"])["doc"]
    assert service.store.count(collection) == len(chunks)  # no chunk of the other version left
    schema = service.get_collection(collection).schema_
    assert {"year", "lang_code"} <= set(schema)  # neither write lost the other's field


def _fail_once(monkeypatch: pytest.MonkeyPatch, obj: object, method: str, error: Exception) -> None:
    """Make ``obj.method`` raise ``error`` on its next call only (fault injection on the real store)."""
    real = getattr(obj, method)
    calls = []

    def flaky(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(obj, method, flaky)


def test_a_failed_stale_vector_delete_is_retried_by_the_next_write(
    service: Quarry, collection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    long_text = " ".join(f"word{i} alpha" for i in range(400))
    service.upsert(collection, [SourceDocument("a", long_text), SourceDocument("b", "bee text")])
    _fail_once(monkeypatch, service.store, "delete", StoreUnavailable("injected"))
    short = SourceDocument("a", "word1 alpha, now short")
    with pytest.raises(StoreUnavailable):
        service.upsert(collection, [short])
    assert service.docstore.pending_deletes(collection)  # the orphans are known
    again = service.upsert(collection, [short])  # the client's retry: unchanged, and it cleans up
    assert again.unchanged == 1 and not service.docstore.pending_deletes(collection)
    assert service.store.count(collection) == service.describe(collection)["chunks"] == 2
    assert _ids(service.search(collection, "word12 alpha", mode="dense"))[:2] == ["a", "b"]


# SQLite's busy timeout or the state store deadline (QUARRY_DOCSTORE__TIMEOUT_S), whichever ends first
BUSY = r"docstore .* is busy|state store .* did not answer within"


@contextlib.contextmanager
def _docstore_write_locked(service: Quarry) -> Iterator[None]:
    """Another process's view: a second SQLite connection holds the docstore's write lock, so the
    next commit fails for real ("database is locked" after the 5 s busy timeout)."""
    other = sqlite3.connect(service.docstore.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()


def test_a_delete_whose_vector_delete_fails_loses_nothing_and_finishes_later(
    service: Quarry, collection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    service.upsert(collection, [SourceDocument("a", "ant text"), SourceDocument("b", "bee text")])
    with _docstore_write_locked(service), pytest.raises(StoreUnavailable, match=BUSY):
        service.delete_documents(collection, ["b"])
    assert service.store.count(collection) == 2  # nothing deleted: the docstore commits first
    assert "b" in _ids(service.search(collection, "bee text", mode="dense"))
    _fail_once(monkeypatch, service.store, "delete", StoreUnavailable("injected"))
    with pytest.raises(StoreUnavailable):
        service.delete_documents(collection, ["b"])
    assert "b" not in _ids(service.search(collection, "bee text", mode="dense"))
    service.delete_documents(collection, ["b"])  # the retry finds "b" gone and deletes its vectors
    assert service.store.count(collection) == 1 and not service.docstore.pending_deletes(collection)


def test_a_failed_commit_puts_back_the_metadata_of_reused_vectors(service: Quarry, collection: str) -> None:
    service.upsert(collection, [SourceDocument("b", "bee text", "", {"k": 1})])
    with _docstore_write_locked(service), pytest.raises(StoreUnavailable, match=BUSY):
        service.upsert(collection, [SourceDocument("b", "bee text", "", {"k": 2})])
    assert _ids(service.search(collection, "bee", mode="dense", filters={"k": 1})) == ["b"]
    assert _ids(service.search(collection, "bee", mode="dense", filters={"k": 2})) == []


@pytest.mark.parametrize("fingerprint", ["sha256:" + "e5" * 32, None], ids=["fingerprinted", "nameonly"])
def test_a_collection_of_another_models_vectors_refuses_to_mix_them(
    service: Quarry, collection: str, fingerprint: str | None
) -> None:
    service.upsert(collection, [SourceDocument("a", "ant text about colonies")])
    raw = service.get_collection(collection).to_json()
    made_with = {"embedding_model": "e5-small", "embedding_fingerprint": fingerprint}
    service.docstore.put_collection(collection, {**raw, **made_with})  # as if made with it
    with pytest.raises(ModelMismatch, match="holds vectors of model 'e5-small'; this server embeds with"):
        service.upsert(collection, [SourceDocument("b", "bee text")])
    assert service.describe(collection)["documents"] == 1
    with pytest.raises(ModelMismatch):
        service.search(collection, "ant colonies", mode="dense")
    hybrid = service.search(collection, "ant colonies", mode="hybrid")
    assert _ids(hybrid) == ["a"] and "e5-small" in hybrid.degraded[0]
    assert _ids(service.search(collection, "ant colonies", mode="bm25")) == ["a"]


def test_a_data_dir_used_with_another_store_is_named_not_misreported(
    tmp_path: Path, counting: CountingEmbedder
) -> None:
    from quarry.errors import Conflict
    from quarry.settings import Settings

    first = Quarry(Settings(data_dir=tmp_path / "data"), embedder=counting)
    try:
        first.create_collection("switched")
    finally:
        first.close()
    other = Settings(data_dir=tmp_path / "data", store={"url": f"milvus://{tmp_path}/other.db"})
    second = Quarry(other, embedder=counting)
    try:
        with pytest.raises(Conflict, match="this data dir was used with another store"):
            second.create_collection("switched", exist_ok=True)
        second.store.create_collection("foreign", counting.dim, "cosine")  # made by another deployment
        with pytest.raises(Conflict, match="exists in the vector store .* but not in the docstore"):
            second.create_collection("foreign")
    finally:
        second.close()


def test_describe_shows_the_plan_for_the_collections_current_size(service: Quarry, collection: str) -> None:
    assert service.describe(collection)["index"]["planned_for_vectors"] == 0
    service.upsert(collection, [SourceDocument(f"d{i}", f"text number {i}") for i in range(3)])
    index = service.describe(collection)["index"]
    assert index["planned_for_vectors"] == 3 and index["reason"].startswith("3 vectors")


def test_a_new_collection_does_not_inherit_rows_left_under_its_name(service: Quarry) -> None:
    # as when a write commits after another process dropped the collection: refused, nothing kept
    with pytest.raises(CollectionNotFound):
        service.docstore.write_batch("leftover", [("a", "hash")], [], [])
    service.create_collection("leftover")
    try:
        assert service.describe("leftover")["documents"] == 0
        assert service.upsert("leftover", [SourceDocument("a", "ant text")]).added == 1
    finally:
        service.drop_collection("leftover")
