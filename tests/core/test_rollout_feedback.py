"""Answer feedback (``POST /v1/collections/{name}/feedback``) and the feedback gates of a gray release.

A canary whose users rate its answers down is rolled back by the ``down_rate`` gate once each
version has ``min_feedback_samples`` rated requests, the decision and its figures in the audit log
and in ``describe``; feedback is tied to the request id and the key that was served, idempotent,
and refused with a typed 4xx when it names nothing served. Real engines (Milvus Lite with the
SQLite state, pgvector with the PostgreSQL state) through the REST app; the gates' statistics
are checked by hand-worked figures.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from indexing.document_rules import SourceDocument
from indexing.rollout import Figures, Gates, evaluate, worse_share_p
from quarry.api import create_app
from quarry.api.keys import new_key
from quarry.logs import REQUEST_ID
from quarry.service import Quarry
from quarry.services import feedback, rollout
from quarry.settings import MonitorSettings, Settings
from tests.core.conftest import CountingEmbedder
from tests.core.test_rollout import _gate_settled, engine, filled, gray  # noqa: F401 - the gray-release fixtures


# --- the gates' statistics ---------------------------------------------------------------------
def test_worse_share_p_is_the_one_sided_two_proportion_z_test() -> None:
    # 30/60 vs 10/60: pooled 1/3, z = (0.5 - 1/6) / sqrt(1/3 * 2/3 * 2/60) = 3.873 -> p = 5.4e-5
    assert worse_share_p(30, 60, 10, 60) == pytest.approx(5.38e-5, rel=0.01)
    # 12/60 vs 10/60: z = 0.471 -> p = 0.319 (chance)
    assert worse_share_p(12, 60, 10, 60) == pytest.approx(0.319, abs=0.001)
    assert worse_share_p(10, 60, 30, 60) > 0.99  # better, not worse
    assert worse_share_p(0, 0, 5, 10) == 1.0 and worse_share_p(0, 10, 0, 10) == 1.0


def _fig(queries: int, rated: int, down: int, clicked: int = 0, *, keys: int = 10) -> Figures:
    """A version's figures, its feedback sent by ``keys`` senders (every query from a clicking key)."""
    return Figures(queries=queries, latencies_ms=[5.0] * queries, rated=rated, down=down, clicked=clicked,
                   click_queries=queries if clicked else 0, clickers=keys if clicked else 0,
                   raters=keys if rated else 0)


def test_the_down_rate_gate_fails_only_on_a_significant_rise_and_skips_without_feedback() -> None:
    gates = Gates(min_feedback_samples=20)
    bad = evaluate(_fig(100, 40, 20), _fig(100, 40, 4), gates)  # 0.50 vs 0.10: +0.40, p ~ 5e-5
    assert not bad.passed and bad.failed == ("down_rate",) and "thumbs-down share 0.500" in bad.reasons[0]
    assert bad.figures["feedback"]["down_p"] < 1e-3
    noisy = evaluate(_fig(100, 20, 5), _fig(100, 20, 2), gates)  # 0.25 vs 0.10: +0.15 but p = 0.11
    assert noisy.passed and "down_rate" not in noisy.failed and noisy.figures["feedback"]["down_p"] > 0.05
    few = evaluate(_fig(100, 19, 19), _fig(100, 40, 0), gates)  # 19 rated: the gate is skipped, holds nothing
    assert few.passed and "down_rate" in few.skipped and "down_rate" not in few.pending
    # one app on each side (a canary routes a key wholly to one version): clients compared, not versions
    apps = evaluate(_fig(100, 40, 40, keys=1), _fig(100, 40, 0, keys=1), gates)
    assert apps.passed and "down_rate" in apps.skipped


def test_the_click_gate_reads_click_through_of_the_clicking_keys_queries() -> None:
    gates = Gates(min_feedback_samples=20)
    dropped = evaluate(_fig(200, 0, 0, clicked=20), _fig(200, 0, 0, clicked=80), gates)  # CTR 0.10 vs 0.40
    assert dropped.failed == ("click_rate",) and dropped.figures["feedback"]["click_p"] < 1e-6
    none = evaluate(_fig(200, 0, 0), _fig(200, 0, 0), gates)  # no client sends clicks: skipped
    assert none.passed and set(none.skipped) == {"down_rate", "click_rate"}
    # the candidate's keys never click (an OpenAI client, a batch job): its click-through says nothing
    silent = evaluate(_fig(200, 0, 0), _fig(200, 0, 0, clicked=80), gates)
    assert silent.passed and "click_rate" in silent.skipped and silent.figures["candidate"]["click_rate"] is None


# --- the route ---------------------------------------------------------------------------------
def _feedback_total(signal: str, role: str, name: str) -> float:
    value = REGISTRY.get_sample_value("quarry_feedback_total",
                                      {"tenant": "default", "collection": name, "signal": signal, "role": role})
    return value or 0.0


def test_feedback_is_tied_to_the_served_request_and_its_key(gray: Quarry, filled: str) -> None:  # noqa: F811
    url = f"/v1/collections/{filled}/feedback"
    key_a, key_b = {"api-key": "qk_00000000000a_secret"}, {"api-key": "qk_00000000000b_secret"}
    with TestClient(create_app(gray)) as client:
        r = client.post(f"/v1/collections/{filled}/search", json={"query": "cancer cells", "top_k": 5},
                        headers={"X-Request-ID": "fb-1", **key_a})
        assert r.status_code == 200 and r.headers["X-Request-ID"] == "fb-1"
        hits = [h["document_id"] for h in r.json()["hits"]]
        before = _feedback_total("down", "none", filled)
        body = {"request_id": "fb-1", "rating": "down", "clicked": hits[:2]}
        first = client.post(url, json=body, headers=key_a)
        assert first.status_code == 200, first.text
        assert first.json() == {"request_id": "fb-1", "collection": filled, "version": 1, "rollout": None,
                                "rating": "down", "clicks": 2}
        assert client.post(url, json=body, headers=key_a).json() == first.json()  # a retry changes nothing
        assert _feedback_total("down", "none", filled) == before + 1
        up = client.post(url, json={"request_id": "fb-1", "rating": "up"}, headers=key_a).json()
        assert up["rating"] == "up" and up["clicks"] == 2  # the last rating counts
        # another key, an unknown id, another collection's request: alike, 404
        for who, rid, where in ((key_b, "fb-1", url), ({}, "fb-1", url), (key_a, "fb-unknown", url)):
            refused = client.post(where, json={"request_id": rid, "rating": "down"}, headers=who)
            assert refused.status_code == 404 and refused.json()["error"]["type"] == "NotFound", refused.text
        # another key reusing the id has a request of its own: it replaces nothing of key a's
        other = client.post(f"/v1/collections/{filled}/search", json={"query": "bees make honey", "top_k": 3},
                            headers={"X-Request-ID": "fb-1", **key_b})
        assert other.status_code == 200
        mine = client.post(url, json={"request_id": "fb-1", "rating": "up"}, headers=key_a).json()
        assert mine["clicks"] == 2
        theirs = client.post(url, json={"request_id": "fb-1", "rating": "down"}, headers=key_b).json()
        assert theirs["rating"] == "down" and theirs["clicks"] == 0
        stray = client.post(url, json={"request_id": "fb-1", "clicked": ["not-a-hit"]}, headers=key_a)
        assert stray.status_code == 400 and "not-a-hit" in stray.json()["error"]["message"]
        empty = client.post(url, json={"request_id": "fb-1"}, headers=key_a)
        assert empty.status_code == 400 and empty.json()["error"]["type"] == "InvalidRequest"
        bad_id = client.post(url, json={"request_id": "a b", "rating": "up"}, headers=key_a)
        assert bad_id.status_code == 422
        gone = client.post("/v1/collections/nope/feedback", json={"request_id": "fb-1", "rating": "up"})
        assert gone.status_code == 404 and gone.json()["error"]["type"] == "CollectionNotFound"


def test_a_canary_its_users_rate_down_is_rolled_back_by_the_feedback_gate(
    gray: Quarry, filled: str, shared_data: Path,  # noqa: F811
) -> None:
    samples = 40
    queries = [json.loads(line)["text"] for line in (shared_data / "scifact" / "queries.jsonl").open()][:160]
    with TestClient(create_app(gray)) as client:
        started = client.post(f"/v1/collections/{filled}/rollout", json={
            "mode": "canary", "schedule": [50, 100], "step_samples": samples, "shadow_rate": 0.0,
            # only the feedback decides here (latency on a loaded CI machine, recall: other tests)
            "gates": {"max_p95_ratio": 1000, "max_p99_ratio": 1000, "min_recall": 0, "min_recall_ratio": 0,
                      "min_feedback_samples": 20},
        })
        assert started.status_code == 201, started.text
        served: dict[str, str] = {}
        for i, query in enumerate(queries):  # routed by the query text: half to each version
            r = client.post(f"/v1/collections/{filled}/search", json={"query": query, "top_k": 5},
                            headers={"X-Request-ID": f"canary-{i}"})
            assert r.status_code == 200, r.text
            served[f"canary-{i}"] = r.headers["X-Quarry-Rollout"]
        roles = list(served.values())
        assert roles.count("candidate") >= 40 and roles.count("live") >= 40, roles.count("candidate")
        during = gray.docstore.get_rollout(filled)
        assert during is not None and during.state == "canary"  # the gates passed without feedback
        for rid, role in served.items():  # the candidate's answers are rated down, the live ones up
            r = client.post(f"/v1/collections/{filled}/feedback",
                            json={"request_id": rid, "rating": "down" if role == "candidate" else "up"})
            assert r.status_code == 200 and r.json()["rollout"] == role, r.text
        deadline = time.monotonic() + 30
        while (current := gray.docstore.get_rollout(filled)) is not None and current.active:
            assert time.monotonic() < deadline, rollout.gates_now(gray.view, filled, current)
            time.sleep(0.1)
    assert current is not None and current.state == "rolled_back", current
    decision = current.decisions[-1]
    assert decision["action"] == "rollback" and decision["failed"] == ["down_rate"], decision
    cand, live = decision["figures"]["candidate"], decision["figures"]["live"]
    assert cand["down_rate"] == 1.0 and live["down_rate"] == 0.0
    assert cand["rated"] >= 20 and live["rated"] >= 20  # the gate counted once both had enough
    assert decision["figures"]["feedback"]["down_p"] < 0.05
    audit = [a for a in gray.docstore.list_audit(since=current.started_at, limit=1000) if a.target == filled]
    assert audit[-1].action == "rollout.rollback" and audit[-1].detail["failed"] == ["down_rate"]
    assert gray.describe(filled)["rollout"]["state"] == "rolled_back"
    assert gray.live_version(filled).version == 1

def _keyed_canary(client: TestClient, name: str, queries: list[str]) -> dict[str, list[tuple[str, str, str]]]:
    """Start a 50 % canary and search as 40 API keys (3 queries each, routed by key); per role, the
    ``(key header, request id, first hit)`` of each search."""
    started = client.post(f"/v1/collections/{name}/rollout", json={
        "mode": "canary", "schedule": [50, 100], "step_samples": 20, "shadow_rate": 0.0,
        "gates": {"max_p95_ratio": 1000, "max_p99_ratio": 1000, "min_recall": 0, "min_recall_ratio": 0},
    })
    assert started.status_code == 201, started.text
    by_role: dict[str, list[tuple[str, str, str]]] = {"candidate": [], "live": []}
    for k in range(40):
        key = f"qk_{k:012x}_secret"  # an open server: any key-shaped header routes by its id
        for j in range(3):
            rid = f"{started.json()['salt'][:6]}-{k}-{j}"
            r = client.post(f"/v1/collections/{name}/search", json={"query": queries[3 * k + j], "top_k": 5},
                            headers={"api-key": key, "X-Request-ID": rid})
            assert r.status_code == 200, r.text
            by_role[r.headers["X-Quarry-Rollout"]].append((key, rid, r.json()["hits"][0]["document_id"]))
    assert len(by_role["candidate"]) >= 30 and len(by_role["live"]) >= 30, {k: len(v) for k, v in by_role.items()}
    return by_role


def _click(client: TestClient, name: str, served: list[tuple[str, str, str]]) -> None:
    for key, rid, first in served:
        r = client.post(f"/v1/collections/{name}/feedback", json={"request_id": rid, "clicked": [first]},
                        headers={"api-key": key})
        assert r.status_code == 200, r.text


def test_the_click_gate_compares_the_clicking_keys_not_a_version_whose_clients_never_click(
    gray: Quarry, filled: str, shared_data: Path,  # noqa: F811
) -> None:
    """A canary routes each key wholly to one version: keys that never click (an OpenAI client, a batch
    job) on the candidate once rolled an identical candidate back (click-through 0.000 of 45 vs 0.955 of
    22, p 1.3e-15); now only the clicking keys' queries count. A candidate its clicking users click less
    is still rolled back."""
    queries = [json.loads(line)["text"] for line in (shared_data / "scifact" / "queries.jsonl").open()][:120]
    with TestClient(create_app(gray)) as client:
        served = _keyed_canary(client, filled, queries)
        _click(client, filled, served["live"])  # the candidate's keys send no click at all
        _gate_settled(gray, filled)
        current = gray.docstore.get_rollout(filled)
        assert current is not None and current.state == "canary", current.decisions[-1]
        decision = rollout.gates_now(gray.view, filled, current)
        assert "click_rate" in decision.skipped and decision.figures["candidate"]["click_queries"] == 0
        assert decision.figures["live"]["click_rate"] == 1.0 and decision.figures["live"]["clickers"] >= 5
        assert client.post(f"/v1/collections/{filled}/rollout/abort").status_code == 200

        served = _keyed_canary(client, filled, queries)  # a new salt: another split of the keys
        _click(client, filled, served["live"])
        first_of_key = {key: (key, rid, hit) for key, rid, hit in reversed(served["candidate"])}
        _click(client, filled, list(first_of_key.values()))  # the candidate's users click 1 search in 3
        deadline = time.monotonic() + 30
        while (current := gray.docstore.get_rollout(filled)) is not None and current.active:
            assert time.monotonic() < deadline, rollout.gates_now(gray.view, filled, current)
            time.sleep(0.1)
    assert current is not None and current.state == "rolled_back"
    decision = current.decisions[-1]
    assert decision["failed"] == ["click_rate"], decision
    cand, live = decision["figures"]["candidate"], decision["figures"]["live"]
    assert cand["click_rate"] < 0.5 and live["click_rate"] == 1.0 and decision["figures"]["feedback"]["click_p"] < 0.05



@pytest.fixture()
def keyed(counting: CountingEmbedder, tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, dict[str, str]]]]:
    """A server keeping 5 requests a tenant, its keys (``op``, ``reader``: tenant default; ``b``: another).

    Collections ``own`` (the op's) and ``kb`` (shared), the same 3 documents in each (in ``kb``
    both tenants'); the keys' ``Authorization`` headers.
    """
    quarry = Quarry(Settings(data_dir=tmp_path, monitor=MonitorSettings(feedback_requests=5)), embedder=counting)
    tenant_b = f"fb{secrets.token_hex(2)}"
    quarry.docstore.create_tenant(tenant_b, tenant_b)
    auth: dict[str, dict[str, str]] = {}
    for who, tenant, scopes in (("op", "default", ["read", "write", "admin"]), ("reader", "default", ["read"]),
                                ("b", tenant_b, ["read", "write"])):
        key, record = new_key(tenant, scopes)
        quarry.docstore.insert_api_key(record)
        auth[who] = {"Authorization": f"Bearer {key}"}
    docs = [{"id": f"d{i}", "text": text} for i, text in enumerate(
        ["Tides follow the moon.", "Ferries cross the harbour.", "The moon pulls the oceans."])]
    try:
        with TestClient(create_app(quarry)) as client:
            for name, extra in (("own", {}), ("kb", {"tenancy": "shared"})):
                made = client.post("/v1/collections", json={"name": name, **extra}, headers=auth["op"])
                assert made.status_code == 201, made.text
            for name, who in (("own", "op"), ("kb", "op"), ("kb", "b")):
                put = client.post(f"/v1/collections/{name}/documents?wait=true", json={"documents": docs},
                                  headers=auth[who])
                assert put.status_code == 200, put.text
            yield client, auth
    finally:
        quarry.close()


def _search(client: TestClient, name: str, who: dict[str, str], rid: str) -> list[str]:
    r = client.post(f"/v1/collections/{name}/search", json={"query": "moon tides", "top_k": 2},
                    headers={**who, "X-Request-ID": rid})
    assert r.status_code == 200, r.text
    return [h["document_id"] for h in r.json()["hits"]]


def _rate(client: TestClient, name: str, who: dict[str, str], body: dict[str, object]) -> Any:
    """The feedback reply (a TestClient response)."""
    return client.post(f"/v1/collections/{name}/feedback", json=body, headers=who)


def test_feedback_keys_on_the_verified_key_not_a_second_key_header(
    keyed: tuple[TestClient, dict[str, dict[str, str]]],
) -> None:
    """Before the fix an ``api-key`` header after one's own ``Authorization`` made the request that
    other key's: rate its requests, replace them (and be routed as it by a canary)."""
    client, auth = keyed
    reader_id = auth["reader"]["Authorization"].split("_")[1]
    as_reader = {"api-key": f"qk_{reader_id}_not-its-secret"}  # the reader's id, in a second header
    hits = _search(client, "own", auth["reader"], "victim")
    assert _rate(client, "own", auth["reader"], {"request_id": "victim", "rating": "down"}).status_code == 200
    # the op's own key is verified: the request is the op's, which never searched "victim"
    smuggled = _rate(client, "own", {**auth["op"], **as_reader}, {"request_id": "victim", "rating": "up"})
    assert smuggled.status_code == 404, smuggled.text  # was 200: the reader's rating turned up
    _search(client, "own", {**auth["op"], **as_reader}, "victim")  # the op's own entry, not the reader's
    mine = _rate(client, "own", auth["reader"], {"request_id": "victim", "clicked": hits[:1]})
    assert mine.status_code == 200 and mine.json()["rating"] == "down", mine.text  # was None: replaced
    assert _rate(client, "own", auth["op"], {"request_id": "victim", "rating": "up"}).status_code == 200


def test_another_tenant_of_a_shared_collection_evicts_none_of_a_tenants_requests(
    keyed: tuple[TestClient, dict[str, dict[str, str]]],
) -> None:
    """Before the fix the shared collections kept one ledger for all tenants: 5 searches by tenant b
    pushed tenant default's request out (404 on its feedback)."""
    client, auth = keyed
    _search(client, "kb", auth["op"], "kb-victim")
    for i in range(5):
        _search(client, "kb", auth["b"], f"kb-flood-{i}")
    kept = _rate(client, "kb", auth["op"], {"request_id": "kb-victim", "rating": "up"})
    assert kept.status_code == 200, kept.text  # was 404: pushed out by another tenant
    assert _rate(client, "kb", auth["b"], {"request_id": "kb-flood-0", "rating": "up"}).status_code == 200
    for i in range(5):  # a tenant's own searches still bound what it keeps (5)
        _search(client, "kb", auth["op"], f"kb-own-{i}")
    assert _rate(client, "kb", auth["op"], {"request_id": "kb-victim", "rating": "up"}).status_code == 404


def test_an_answer_the_cache_replays_is_rated_as_the_answer_it_replays(
    counting: CountingEmbedder, tmp_path: Path,
) -> None:
    """A cache hit runs no search: before the fix its request id was unknown (404) to feedback.

    The suite's llama.cpp server answers; the second identical question (``/answer``, then chat)
    is the cache's. Its rating names the version its stored sources name, and a click may name
    any of its sources.
    """
    from tests.llama import llama_settings, require_llama

    require_llama()
    settings = Settings(data_dir=tmp_path, llm=llama_settings(structured="off", retry_after_s=0))
    quarry = Quarry(settings, embedder=counting)
    quarry.create_collection("c", language="en")
    quarry.upsert("c", [SourceDocument(id=f"d{i}", text=text) for i, text in enumerate(
        ["Tides follow the moon.", "Ferries cross the harbour.", "The moon pulls the oceans."])])
    ask = {"query": "what pulls the tides?", "top_k": 2, "max_tokens": 8}
    chat = {"model": "quarry/c", "messages": [{"role": "user", "content": "what crosses the harbour?"}],
            "quarry": {"top_k": 2}, "max_tokens": 8}
    try:
        with TestClient(create_app(quarry)) as client:
            for i in (1, 2):
                r = client.post("/v1/collections/c/answer", json=ask, headers={"X-Request-ID": f"ans-{i}"})
                assert r.status_code == 200 and r.json()["cache"] == ("miss" if i == 1 else "hit"), r.text
                c = client.post("/v1/chat/completions", json=chat, headers={"X-Request-ID": f"chat-{i}"})
                assert c.status_code == 200 and c.json()["quarry"]["cache"] == ("miss" if i == 1 else "hit"), c.text
            source = r.json()["sources"][0]["document_id"]
            rated = client.post("/v1/collections/c/feedback",
                                json={"request_id": "ans-2", "rating": "down", "clicked": [source]})
            assert rated.status_code == 200, rated.text  # was 404: no search noted it
            assert rated.json() == {"request_id": "ans-2", "collection": "c", "version": 1, "rollout": None,
                                    "rating": "down", "clicks": 1}
            chatted = client.post("/v1/collections/c/feedback", json={"request_id": "chat-2", "rating": "up"})
            assert chatted.status_code == 200 and chatted.json()["rating"] == "up", chatted.text
            stray = client.post("/v1/collections/c/feedback", json={"request_id": "ans-2", "clicked": ["nope"]})
            assert stray.status_code == 400, stray.text
    finally:
        quarry.close()


def test_a_search_of_an_earlier_step_ending_late_keeps_the_new_steps_window(
    gray: Quarry, filled: str,  # noqa: F811
) -> None:
    """A search routed before a step and ended after it: before the fix it replaced the new step's
    window by its old step's, and the next search replaced that by an empty one: the step lost its
    figures and a rating changed afterwards left ``down`` at -1 (rated 0)."""
    rollout.start(gray.view, filled, mode="canary", schedule=[50, 100], step_samples=10**6, shadow_rate=0.0)
    key, rid = rollout.ROUTE_KEY.set("late"), REQUEST_ID.set("late-1")
    try:
        stale = rollout.route(gray.view, filled, "cancer cells")  # routed in step 0 ...
        rollout.step(gray.view, filled)  # ... the step moves to 100 % while it runs
        gray.search(filled, "cancer cells", top_k=5)  # step 1's: the candidate
        assert feedback.give(gray.view, filled, "late-1", rating="down")["rollout"] == "candidate"
        rollout.observe(gray.view, filled, stale, 0.01, None, None)  # the step-0 search ends now
        REQUEST_ID.set("late-2")
        gray.search(filled, "cancer cells", top_k=5)
        assert feedback.give(gray.view, filled, "late-1", rating="up")["rating"] == "up"
        described = rollout.describe(gray.view, filled)
        assert described is not None and "window" in described, described
        candidate = described["window"]["candidate"]
        assert (candidate["queries"], candidate["rated"], candidate["down_rate"]) == (2, 1, 0.0), candidate
    finally:
        REQUEST_ID.reset(rid)
        rollout.ROUTE_KEY.reset(key)
        rollout.abort(gray.view, filled)
