"""Names of collections that do not exist leave nothing on disk; an over-long name is a 400 before any store call.

1,000 requests on unknown names (deletes, searches, reads) leave 0 new files under the data dir
(the SQLite docstore's write locks are bytes of one file, ``docstore.sqlite.lock``, not a file per
name); a 250-character name is a 400 ``InvalidRequest`` in the error envelope on every route that
takes one, and the state store is not asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from indexing.docstore import open_docstore
from quarry.api import create_app
from quarry.service import Quarry
from quarry.settings import Settings
from tests.core.conftest import CountingEmbedder


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, counting: CountingEmbedder) -> Iterator[tuple[TestClient, Path]]:
    data = tmp_path_factory.mktemp("names-data")
    quarry = Quarry(Settings(data_dir=data), embedder=counting)
    with TestClient(create_app(quarry)) as client:
        yield client, data
    quarry.close()


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_a_thousand_unknown_names_leave_no_file(served: tuple[TestClient, Path]) -> None:
    client, data = served
    assert client.post("/v1/collections", json={"name": "known"}).status_code == 201
    doc = {"documents": [{"id": "a", "text": "some words to find"}]}
    assert client.post("/v1/collections/known/documents", json=doc).status_code == 200
    assert client.delete("/v1/collections/known/documents/a").status_code == 200  # its write lock was taken
    before = _files(data)
    for i in range(1000):
        r = client.delete(f"/v1/collections/lk{i}/documents/x")
        assert r.status_code == 404, r.text
        if i % 10 == 0:
            search = client.post(f"/v1/collections/lk{i}/search", json={"query": "words", "mode": "bm25"})
            assert search.status_code == 404, search.text
            assert client.get(f"/v1/collections/lk{i}/documents").status_code == 404
    assert _files(data) - before == set()
    assert client.delete("/v1/collections/known").status_code == 200
    assert not [f for f in _files(data) if "known" in f and "monitor" not in f]  # gone with its collection


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("DELETE", "/v1/collections/{n}/documents/x", None),
        ("POST", "/v1/collections/{n}/search", {"query": "words"}),
        ("GET", "/v1/collections/{n}", None),
        ("DELETE", "/v1/collections/{n}", None),
        ("POST", "/v1/collections/{n}/documents", {"documents": [{"id": "a", "text": "x"}]}),
        ("POST", "/v1/collections/{n}/answer", {"query": "words"}),
    ],
)
def test_a_250_character_name_is_a_400_before_any_store_call(
    served: tuple[TestClient, Path], method: str, path: str, body: dict[str, Any] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, data = served
    state = client.app.state.quarry.docstore  # type: ignore[attr-defined]
    asked: list[str] = []
    for read in ("collection_config", "collection_state", "write_lock", "version"):
        real = getattr(state, read)
        monkeypatch.setattr(state, read, lambda *a, _r=real, _n=read, **k: (asked.append(_n), _r(*a, **k))[1])
    before = _files(data)
    r = client.request(method, path.format(n="a" * 250), json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "InvalidRequest" and "250 characters" in error["message"], error
    assert asked == [] and _files(data) == before


def test_a_chat_model_naming_a_250_character_collection_is_a_400(served: tuple[TestClient, Path]) -> None:
    client, _ = served
    body = {"model": "quarry/" + "a" * 250, "messages": [{"role": "user", "content": "words?"}]}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["type"] == "InvalidRequest", r.text


def test_no_state_call_waits_on_the_event_loop(
    served: tuple[TestClient, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Searches, answers, chat and the open server's key check read the state off the loop (or from its caches)."""
    client, data = served
    assert client.post("/v1/collections", json={"name": "loopy"}).status_code == 201
    doc = {"documents": [{"id": "a", "text": "giraffes browse acacia leaves"}]}
    assert client.post("/v1/collections/loopy/documents", json=doc).status_code == 200
    caplog.set_level("WARNING", logger="indexing.state_calls")
    for _ in range(2):  # after a commit (cache misses), then from the caches
        for mode in ("bm25", "dense", "hybrid"):
            r = client.post("/v1/collections/loopy/search", json={"query": "giraffes", "mode": mode})
            assert r.status_code == 200 and r.json()["hits"], r.text
        assert client.post("/v1/collections/loopy/answer", json={"query": "what do giraffes eat?"}).status_code == 200
        chat = {"model": "quarry/loopy", "messages": [{"role": "user", "content": "giraffes?"}],
                "quarry": {"require_answer": False}}  # no LLM here: the sources (retrieval reads the state)
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
        assert client.get("/readyz").status_code == 200
        doc = {"documents": [{"id": "b", "text": "acacia trees grow on the savanna"}]}
        assert client.post("/v1/collections/loopy/documents", json=doc).status_code == 200
    on_loop = [r.getMessage() for r in caplog.records if "waits on the event loop" in r.getMessage()]
    assert on_loop == []
    # the detector itself: a state call made on a running loop is reported
    state = open_docstore("", data)

    async def on_the_loop() -> None:
        state.list_tenants()

    try:
        asyncio.run(on_the_loop())
    finally:
        state.close()
    assert any("list_tenants waits on the event loop" in r.getMessage() for r in caplog.records)
