"""Gray release (quarry.services.rollout): a canary's share and stickiness under 16 clients, no failed
query through start, step, promote and abort, two replicas routing alike, and a bad candidate (IVF with
nprobe 1) rolled back by its recall gate within the step's sample count.

Real engines: Milvus Lite (SQLite state) and pgvector (the PostgreSQL state), with the packaged
MiniLM (its vectors cached per machine). The offline recall floor of the build is 0 here, so that
a damaged index reaches the canary, as it did on one engine (verify 0.55).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from indexing.document_rules import SourceDocument
from indexing.rollout import Rollout, bucket, routing_key
from indexing.sources import read_documents
from quarry.api import create_app
from quarry.errors import Conflict
from quarry.service import Quarry
from quarry.services import rollout
from quarry.settings import DocstoreSettings, MonitorSettings, ReindexSettings, Settings, StoreSettings
from stores.base import IndexSpec
from tests.core.conftest import PG_URL, CountingEmbedder

RUN = uuid.uuid4().hex[:6]  # the PostgreSQL server is shared: names unique to this run
_names = itertools.count()
DOCS = 150
CLIENTS = 16


def _settings(data: Path, engine: str) -> Settings:
    extra: dict[str, Any] = {}
    if engine == "pgvector":
        extra = {"store": StoreSettings(url=PG_URL), "docstore": DocstoreSettings(url=PG_URL)}
    return Settings(data_dir=data, monitor=MonitorSettings(sample_rate=1.0),
                    reindex=ReindexSettings(recall_floor=0.0), **extra)


@pytest.fixture(scope="module", params=["milvus-lite", pytest.param("pgvector", marks=pytest.mark.integration)])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def gray(engine: str, counting: CountingEmbedder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Quarry]:
    """A service whose recall monitor samples every search and whose reindex check lets any index through."""
    quarry = Quarry(_settings(tmp_path_factory.mktemp(f"gray-{engine}"), engine), embedder=counting)
    yield quarry
    quarry.close()


@pytest.fixture()
def filled(gray: Quarry, scifact_docs: list[SourceDocument]) -> Iterator[str]:
    name = f"gr{RUN}_{next(_names)}"
    gray.create_collection(name)
    gray.upsert(name, scifact_docs[:DOCS])
    yield name
    gray.drop_collection(name)


class Spy:
    """Records which version served each search (wraps the real ``rollout.observe``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.served: dict[str, set[int]] = defaultdict(set)  # routing key -> versions seen
        self.counts: dict[int, int] = defaultdict(int)
        self.inner = rollout.observe

    def __call__(self, v: Any, name: str, chosen: Any, elapsed: float, result: Any, asked: Any) -> None:
        if chosen is not None and asked is not None:
            key = routing_key(rollout.ROUTE_KEY.get(), asked.query)
            with self.lock:
                self.served[key].add(chosen.version.version)
                self.counts[chosen.version.version] += 1
        self.inner(v, name, chosen, elapsed, result, asked)


def _clients(
    service: Quarry, name: str, queries: list[str], keys: list[list[str]], failures: list[BaseException],
) -> list[threading.Thread]:
    """One thread per client; client ``i`` searches with each of ``keys[i]`` in turn."""

    def client(mine: list[str]) -> None:
        for j, key in enumerate(mine):
            rollout.ROUTE_KEY.set(key)
            try:
                result = service.search(name, queries[j % len(queries)], top_k=10)
                assert result.hits and not result.degraded, result.degraded
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                failures.append(exc)

    return [threading.Thread(target=client, args=(k,)) for k in keys]


def _run(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_canary_serves_its_share_sticky_per_key_with_no_failed_query(
    gray: Quarry, filled: str, scifact_docs: list[SourceDocument], monkeypatch: pytest.MonkeyPatch,
) -> None:
    spy = Spy()
    monkeypatch.setattr(rollout, "observe", spy)
    queries = [d.title for d in scifact_docs[:DOCS:3]]
    view = gray.view
    started = rollout.start(view, filled, mode="canary", schedule=[5, 25, 100], step_samples=10**6, shadow_rate=0.0)
    assert (started.state, started.percent, started.candidate, started.baseline) == ("canary", 5.0, 2, 1)
    # a fixed salt: the share of these keys is then a fixed number (the routing stays the service's)
    fixed = replace(started, salt="test-salt")
    assert gray.docstore.put_rollout(fixed, expect=started)
    keys = [[f"user-{i}-{j}" for j in range(200)] for i in range(CLIENTS)]  # 3200 keys, each twice below
    failures: list[BaseException] = []
    _run(_clients(gray, filled, queries, keys, failures))
    _run(_clients(gray, filled, list(reversed(queries)), keys, failures))  # the same keys, other queries
    assert not failures, failures[:3]
    total = sum(spy.counts.values())
    share = spy.counts[2] / total
    assert total == 2 * 3200 and 0.04 <= share <= 0.06, (share, dict(spy.counts))
    assert all(len(seen) == 1 for seen in spy.served.values())  # sticky: no key saw both versions
    expected = sum(bucket(routing_key(k, ""), "test-salt") < 5.0 for ks in keys for k in ks) / 3200
    assert share == pytest.approx(expected)
    described = gray.describe(filled)["rollout"]
    assert described["state"] == "canary" and described["window"]["candidate"]["queries"] == spy.counts[2]

    # start, step, promote and abort under 16 clients searching all along: no failed query
    stop = threading.Event()
    load_failures: list[BaseException] = []

    def load(i: int) -> None:
        for j in itertools.count():
            if stop.is_set():
                return
            rollout.ROUTE_KEY.set(f"load-{i}-{j % 50}")
            try:
                assert gray.search(filled, queries[j % len(queries)], top_k=10).hits
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                load_failures.append(exc)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    try:
        stepped = rollout.step(view, filled)
        assert (stepped.state, stepped.percent) == ("canary", 25.0)
        time.sleep(1.0)
        promoted = rollout.promote(view, filled)
        assert promoted.state == "live" and gray.live_version(filled).version == 2
        time.sleep(1.0)
        again = rollout.start(view, filled, mode="canary", schedule=[50, 100], step_samples=10**6, shadow_rate=0.5)
        assert again.candidate == 3 and again.baseline == 2
        time.sleep(1.0)
        aborted = rollout.abort(view, filled)
        assert aborted.state == "rolled_back" and gray.live_version(filled).version == 2
        time.sleep(rollout.DROP_GRACE_S + 1.0)  # the candidate's collection is dropped under load
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not load_failures, load_failures[:3]
    actions = [a.action for a in gray.docstore.list_audit(since=started.started_at, limit=1000)
               if a.target == filled]
    assert actions == ["rollout.start", "rollout.step", "rollout.promote", "rollout.start", "rollout.abort"]
    assert [d["action"] for d in gray.describe(filled)["rollout"]["decisions"]] == ["start", "abort"]
    with pytest.raises(Conflict):
        rollout.step(view, filled)


@pytest.fixture()
def titles(gray: Quarry, engine: str, shared_data: Path) -> Iterator[str]:
    """3,000 SciFact titles: enough rows for an IVF index to be searched as built (not exhaustively)."""
    if engine != "pgvector":
        pytest.skip("Milvus Lite searches a collection of this size exhaustively whatever its IVF nprobe "
                    "(measured: recall 1.0 at nlist 64, nprobe 1 on 3,000 rows): the pgvector run")
    docs = [SourceDocument(id=d.id, title="", text=d.title)
            for d in itertools.islice(read_documents(shared_data / "scifact"), 3000)]
    name = f"gr{RUN}_{next(_names)}"
    gray.create_collection(name)
    gray.upsert(name, docs)
    yield name
    gray.drop_collection(name)


def _gate_settled(service: Quarry, name: str, timeout_s: float = 30.0) -> None:
    """Wait while a gate evaluation of ``name`` runs (a client slower than the gate: on a loaded
    2-core machine the searches sent meanwhile would otherwise land in the window it reports)."""
    deadline = time.monotonic() + timeout_s
    windows = rollout._tracker(service.view.space).windows  # noqa: SLF001 - the test waits on the gate thread
    while (window := windows.get(name)) is not None and window.evaluating:
        assert time.monotonic() < deadline, "the gate evaluation did not finish"
        time.sleep(0.02)


def test_a_bad_candidate_is_rolled_back_by_its_recall_gate(
    gray: Quarry, titles: str, shared_data: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    spy = Spy()
    monkeypatch.setattr(rollout, "observe", spy)
    samples = 20
    # nlist 8, nprobe 1, no iterative scan: an ANN that reads an eighth of the rows (recall@10 ~0.6-0.7)
    bad = IndexSpec("IVF_FLAT", "cosine", {"nlist": 8}, {"nprobe": 1, "iterative_scan": "off"})
    view = gray.view
    started = rollout.start(view, titles, index=bad, mode="canary", schedule=[5, 100], step_samples=samples,
                            shadow_rate=0.0)
    queries = [json.loads(line)["text"] for line in (shared_data / "scifact" / "queries.jsonl").open()]
    for j in itertools.count():
        rollout.ROUTE_KEY.set(f"u{j}")
        assert gray.search(titles, queries[j % len(queries)], top_k=10, mode="dense").hits
        _gate_settled(gray, titles)
        current = gray.docstore.get_rollout(titles)
        assert current is not None
        if not current.active or spy.counts[started.candidate] >= 3 * samples:
            break
    deadline = time.monotonic() + 30
    while (current := gray.docstore.get_rollout(titles)) is not None and current.active:
        assert time.monotonic() < deadline, (current, rollout.gates_now(view, titles, current))
        time.sleep(0.1)
    assert current is not None and current.state == "rolled_back", current
    decision = current.decisions[-1]
    assert decision["action"] == "rollback" and "recall" in decision["failed"], decision
    figures = decision["figures"]["candidate"]
    assert figures["recall"] < 0.9 and figures["queries"] <= samples + 10  # within the step's sample count
    assert decision["figures"]["live"]["recall"] > 0.95
    audit = [a for a in gray.docstore.list_audit(since=started.started_at, limit=1000) if a.target == titles]
    assert audit[-1].action == "rollout.rollback" and audit[-1].detail["figures"]["candidate"]["recall"] < 0.9
    assert gray.describe(titles)["rollout"]["state"] == "rolled_back"
    assert gray.live_version(titles).version == 1


def test_two_replicas_route_a_key_alike(
    gray: Quarry, engine: str, filled: str, tmp_path_factory: pytest.TempPathFactory, counting: CountingEmbedder,
) -> None:
    if engine != "pgvector":
        pytest.skip("a second replica needs a server store and a shared state: the pgvector run")
    other = Quarry(_settings(tmp_path_factory.mktemp("replica"), engine), embedder=counting)
    try:
        started = rollout.start(gray.view, filled, mode="canary", schedule=[30, 100], step_samples=10**6,
                                shadow_rate=0.0)
        queries = ["protein folding", "vaccine response", "gene expression in mice"]
        for i in range(200):
            key = f"k{i}"
            rollout.ROUTE_KEY.set(key)
            q = queries[i % 3]
            first, second = rollout.route(gray.view, filled, q), rollout.route(other.view, filled, q)
            assert first is not None and second is not None
            assert first.version.version == second.version.version
        moved = rollout.step(other.view, filled)  # a step on one replica is seen by the other
        wait = time.monotonic() + 10
        while (seen := gray.docstore.get_rollout(filled)) is None or seen.percent != moved.percent:
            assert time.monotonic() < wait
            time.sleep(0.05)
        rollout.abort(gray.view, filled)
        assert started.candidate == 2
    finally:
        other.close()


def test_rest_routes_and_describe(gray: Quarry, filled: str) -> None:
    with TestClient(create_app(gray)) as client:
        assert client.get(f"/v1/collections/{filled}/rollout").status_code == 404
        bad = client.post(f"/v1/collections/{filled}/rollout", json={"schedule": [50, 25]})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "InvalidRequest"
        created = client.post(f"/v1/collections/{filled}/rollout", json={"mode": "shadow", "shadow_rate": 1.0})
        assert created.status_code == 201, created.text
        assert created.json()["state"] == "shadow"
        again = client.post(f"/v1/collections/{filled}/rollout", json={})
        assert again.status_code == 409
        for _ in range(5):
            r = client.post(f"/v1/collections/{filled}/search", json={"query": "cancer cells", "top_k": 10})
            assert r.status_code == 200
        stepped = client.post(f"/v1/collections/{filled}/rollout/step").json()
        assert (stepped["state"], stepped["percent"]) == ("canary", 5.0)
        described = client.get(f"/v1/collections/{filled}").json()["rollout"]
        assert described["state"] == "canary" and described["candidate"] == 2
        aborted = client.post(f"/v1/collections/{filled}/rollout/abort")
        assert aborted.status_code == 200 and aborted.json()["state"] == "rolled_back"
        assert client.post(f"/v1/collections/{filled}/rollout/promote").status_code == 409


def test_rollout_record_roundtrip() -> None:
    r = Rollout("c", 2, 1, "canary", 5.0, 0, (5.0, 100.0), decisions=({"action": "start"},))
    assert Rollout.from_json(r.to_json()) == r


def test_cli_verbs_act_on_the_shared_state(gray: Quarry, engine: str, filled: str, tmp_path: Path) -> None:
    if engine != "pgvector":
        pytest.skip("the CLI process shares the state with this one: the pgvector run (a Lite file is one process's)")
    env = {**os.environ, "QUARRY_DATA_DIR": str(tmp_path), "QUARRY_STORE__URL": PG_URL,
           "QUARRY_DOCSTORE__URL": PG_URL, "QUARRY_EMBEDDING__DEVICE": "cpu"}

    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "quarry.cli", "rollout", *args], env=env, capture_output=True,
                              text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "shadow" in cli("start", filled, "--shadow", "--schedule", "10,100")
    seen = gray.docstore.get_rollout(filled)
    assert seen is not None and (seen.state, seen.candidate) == ("shadow", 2)
    assert "canary 10 %" in cli("step", filled)
    assert "rolled_back" in cli("abort", filled)
    seen = gray.docstore.get_rollout(filled)
    assert seen is not None and [d["action"] for d in seen.decisions] == ["start", "step", "abort"]
    assert not gray.store.has_collection(gray.docstore.get_version(filled, 2).physical_name)  # type: ignore[union-attr]


def test_the_answer_cache_keys_on_the_version_routing_chose(gray: Quarry, filled: str) -> None:
    from generation.base import GenerationParams
    from generation.factory import open_generator
    from quarry.services import answer_cache
    from quarry.services.answer import AnswerRequest
    from quarry.settings import LLMSettings
    from tests.llama import LLM_URL

    generator = open_generator(LLMSettings(url=LLM_URL))
    assert generator is not None
    cfg = gray.get_collection(filled)
    params = GenerationParams(max_tokens=64)

    def key(route_key: str) -> tuple[str, int]:
        rollout.ROUTE_KEY.set(route_key)
        chosen = rollout.route(gray.view, filled, "what do bees make")
        version = gray.live_version(filled).version if chosen is None else chosen.version.version
        return answer_cache.cache_key(gray.view, cfg, AnswerRequest("what do bees make"), generator, params,
                                      1000).scope, version

    before = {key(f"user{i}")[0] for i in range(20)}
    assert len(before) == 1  # no rollout: one key for everyone
    rollout.start(gray.view, filled, mode="canary", schedule=[50, 100], step_samples=10**6, shadow_rate=0.0)
    try:
        keys = [key(f"user{i}") for i in range(20)]
        by_version: dict[int, set[str]] = defaultdict(set)
        for text, version in keys:
            by_version[version].add(text)
        assert set(by_version) == {1, 2} and all(len(t) == 1 for t in by_version.values())
        assert by_version[1] != by_version[2]  # an answer of one version is never served for the other
    finally:
        rollout.abort(gray.view, filled)


def test_rest_searches_route_by_the_presented_key_id(
    gray: Quarry, filled: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    spy = Spy()
    monkeypatch.setattr(rollout, "observe", spy)
    rollout.start(gray.view, filled, mode="canary", schedule=[50, 100], step_samples=10**6, shadow_rate=0.0)
    try:
        with TestClient(create_app(gray)) as client:
            for i in range(20):
                for query, header in (("bees make honey", "api-key"), ("cancer cells", "authorization")):
                    value = f"qk_{i:012x}_secret" if header == "api-key" else f"Bearer qk_{i:012x}_secret"
                    r = client.post(f"/v1/collections/{filled}/search", json={"query": query, "top_k": 5},
                                    headers={header: value})
                    assert r.status_code == 200, r.text
    finally:
        rollout.abort(gray.view, filled)
    assert set(spy.served) == {f"k:{i:012x}" for i in range(20)}  # routed by the key's id, not the query
    assert all(len(seen) == 1 for seen in spy.served.values())
    assert set(spy.counts) == {1, 2}


def test_answers_and_chat_name_the_version_that_served_them(
    engine: str, counting: CountingEmbedder, scifact_docs: list[SourceDocument], tmp_path: Path,
) -> None:
    """A canary at 100 % then 0 %: ``/answer`` (JSON and SSE), chat (JSON and chunks) and ``/search`` name the
    candidate, then the live version (body and headers); the answer cache never replays across versions."""
    from tests.llama import llama_settings, require_llama

    require_llama()
    settings = _settings(tmp_path, engine).model_copy(
        update={"llm": llama_settings(structured="off", retry_after_s=0)})
    quarry = Quarry(settings, embedder=counting)
    name = f"gr{RUN}_{next(_names)}"
    quarry.create_collection(name, language="en")
    quarry.upsert(name, scifact_docs[:20])
    started = rollout.start(quarry.view, name, mode="canary", schedule=[100], step_samples=10**6, shadow_rate=0.0)
    answer, chat = f"/v1/collections/{name}/answer", "/v1/chat/completions"
    ask = {"query": "vitamin D and bone density", "top_k": 2, "max_tokens": 16}
    chat_body = {"model": f"quarry/{name}", "messages": [{"role": "user", "content": ask["query"]}],
                 "quarry": {"top_k": 2}, "max_tokens": 16}
    try:
        with TestClient(create_app(quarry)) as client:
            for percent, version, role in ((100.0, 2, "candidate"), (0.0, 1, "live")):
                current = quarry.docstore.get_rollout(name)
                assert current is not None
                assert quarry.docstore.put_rollout(replace(current, percent=percent, updated_at=time.time()))
                heads = {"X-Quarry-Collection-Version": str(version), "X-Quarry-Rollout": role}
                r = client.post(answer, json=ask)  # a miss: the other version's stored answer is not served
                assert r.status_code == 200, r.text
                body = r.json()
                assert (body["version"], body["rollout"], body["cache"]) == (version, role, "miss")
                assert {k: r.headers.get(k) for k in heads} == heads
                r = client.post(answer, json=ask)  # a hit: the same version's answer
                assert (r.json()["version"], r.json()["cache"]) == (version, "hit")
                assert r.headers["X-Quarry-Collection-Version"] == str(version)
                with client.stream("POST", answer, json={**ask, "stream": True},
                                   headers={"Cache-Control": "no-cache"}) as streamed:
                    assert {k: streamed.headers.get(k) for k in heads} == heads
                    lines = [line for line in streamed.iter_lines() if line.startswith("data:")]
                    first = json.loads(lines[0].removeprefix("data:"))
                    assert (first["version"], first["rollout"]) == (version, role)
                r = client.post(chat, json=chat_body, headers={"Cache-Control": "no-cache"})
                assert r.status_code == 200, r.text
                assert (r.json()["quarry"]["version"], r.json()["quarry"]["rollout"]) == (version, role)
                assert {k: r.headers.get(k) for k in heads} == heads
                with client.stream("POST", chat, json={**chat_body, "stream": True},
                                   headers={"Cache-Control": "no-cache"}) as streamed:
                    assert {k: streamed.headers.get(k) for k in heads} == heads
                    frames = [json.loads(line.removeprefix("data:")) for line in streamed.iter_lines()
                              if line.startswith("data:") and "[DONE]" not in line]
                    assert (frames[0]["quarry"]["version"], frames[0]["quarry"]["rollout"]) == (version, role)
                r = client.post(f"/v1/collections/{name}/search", json={"query": ask["query"], "top_k": 2})
                assert {k: r.headers.get(k) for k in heads} == heads
        rollout.abort(quarry.view, name, wait=True)  # the candidate dropped before the store closes
        with TestClient(create_app(quarry)) as client:  # no rollout: the live version, no role
            r = client.post(f"/v1/collections/{name}/search", json={"query": ask["query"], "top_k": 2})
            assert r.headers["X-Quarry-Collection-Version"] == "1" and "X-Quarry-Rollout" not in r.headers
        assert started.candidate == 2
    finally:
        current = quarry.docstore.get_rollout(name)
        if current is not None and current.active:
            rollout.abort(quarry.view, name)
        quarry.drop_collection(name)
        quarry.close()


def test_shadow_runs_reuse_the_served_vector_and_run_together(
    gray: Quarry, filled: str, counting: CountingEmbedder, scifact_docs: list[SourceDocument],
) -> None:
    """Shadow mode at 100 %: every search runs again on the candidate (same model, same results), each query
    embedded once (the shadow run reuses the served vector), the waiting runs run together."""
    queries = [d.title for d in scifact_docs[:DOCS:3]][:48]  # 12 clients x 4 distinct titles
    rollout.start(gray.view, filled, mode="shadow", step_samples=10**6, shadow_rate=1.0)
    try:
        texts = counting.texts
        before = (rollout.describe(gray.view, filled) or {})["shadow"]  # the space's counts, every collection's
        failures: list[BaseException] = []

        def client(mine: list[str]) -> None:
            for query in mine:
                try:
                    assert gray.search(filled, query, top_k=10).hits
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    failures.append(exc)

        _run([threading.Thread(target=client, args=(queries[i::12],)) for i in range(12)])
        assert not failures, failures[:3]
        deadline = time.monotonic() + 30
        while True:
            now = (rollout.describe(gray.view, filled) or {})["shadow"]
            run, skipped = now["run"] - before["run"], now["skipped"] - before["skipped"]
            if run + skipped >= 48:
                break
            assert time.monotonic() < deadline, (run, skipped)
            time.sleep(0.05)
        assert counting.texts - texts == 48  # one vector per search, not two
        window = (rollout.describe(gray.view, filled) or {})["window"]["candidate"]
        assert window["queries"] == run >= 16  # in shadow mode its runs are the candidate's figures
        assert window["overlap"] == 1.0 and window["p95_ms"] is not None  # the same model and index: the same top 10
    finally:
        rollout.abort(gray.view, filled)


def test_the_answer_cache_stores_nothing_another_version_served() -> None:
    """A step (or a swap) between the cache key and the search: the answer is served, not stored."""
    import asyncio

    import numpy as np

    from generation.answer import Event
    from generation.cache import CacheKey, MemoryCache, Question
    from generation.cache_guard import terms
    from quarry.services import answer_cache

    vector = np.ones(4, dtype=np.float32) / 2.0
    question = Question("what do bees make", vector, terms("what do bees make", "en"))

    async def answered(plan: answer_cache.Plan, served: int) -> None:
        async def events() -> Any:
            yield Event("sources", {"sources": [], "version": served})
            yield Event("done", {"answer": "Honey [1].", "degraded": []})

        async for _ in answer_cache.recording(events(), plan, True):
            pass

    for served, stored in ((1, False), (2, True)):
        cache = MemoryCache(0.9, 3600, 10)
        key = CacheKey('{"version": 2}', "t:1:1")
        asyncio.run(answered(answer_cache.Plan("miss", cache, key, question, version=2), served))
        assert (cache.get(key, question).entry is not None) == stored
