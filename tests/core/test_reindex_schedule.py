"""Scheduled and triggered reindexing (issue 22, acceptance 7): the real Milvus Lite service
with the packaged MiniLM (its cached vectors), and two ``quarry serve`` processes sharing
pgvector and the PostgreSQL docstore.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import httpx
import pytest
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger
from pydantic import ValidationError

from indexing.docstore import Job, open_docstore
from indexing.document_rules import SourceDocument
from quarry.scheduler import ReindexScheduler, parse_schedule, period_s
from quarry.service import Quarry
from quarry.settings import DocstoreSettings, ReindexSettings, Settings, StoreSettings
from tests.serve import QuarryServer

_names = itertools.count()
RUN = uuid.uuid4().hex[:6]


def _jobs(service: Quarry, name: str) -> list[Job]:
    return [j for j in service.docstore.list_jobs(collection=name, limit=100) if j.kind == "reindex"]


def _settle(service: Quarry, name: str, timeout_s: float = 300) -> list[Job]:
    """Wait until no reindex job of ``name`` is queued or running; its reindex jobs, oldest first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        jobs = _jobs(service, name)
        if all(j.state in ("done", "failed") for j in jobs) and not _held(service, name):
            return sorted(jobs, key=lambda j: j.created_at)
        time.sleep(0.2)
    raise AssertionError(f"reindex jobs of {name} still running after {timeout_s} s")


def _held(service: Quarry, name: str) -> bool:
    lease = service.docstore.get_lease(f"reindex:{name}")
    return lease is not None and lease.expires_at > time.time()


@pytest.fixture()
def small(service: Quarry, scifact_docs: list[SourceDocument]) -> Iterator[str]:
    name = f"sched{RUN}_{next(_names)}"
    service.create_collection(name)
    service.upsert(name, scifact_docs[:40])
    yield name
    _settle(service, name)
    service.drop_collection(name)


def test_schedule_settings_parse_and_bad_ones_are_refused() -> None:
    assert isinstance(parse_schedule("90s"), IntervalTrigger)
    assert period_s(parse_schedule("30m")) == 1800  # type: ignore[arg-type]
    assert period_s(parse_schedule("1.5h")) == 5400  # type: ignore[arg-type]
    cron = parse_schedule("0 3 * * *")
    assert isinstance(cron, CronTrigger) and period_s(cron, datetime(2026, 1, 1, tzinfo=UTC)) == 86_400
    assert parse_schedule("") is None and parse_schedule("off") is None
    assert not ReindexSettings().scheduled  # off by default
    assert ReindexSettings(schedule="6h").scheduled and ReindexSettings(churn_fraction=0.2).scheduled
    assert not ReindexSettings(schedules={"a": "off"}).scheduled
    for bad in ("every day", "0 3 * *", "61 * * * *", "0s"):
        with pytest.raises(ValidationError, match="schedule"):
            ReindexSettings(schedule=bad)
    with pytest.raises(ValidationError, match="crontab"):
        ReindexSettings(schedules={"docs": "sometimes"})
    env = Settings(_env_file=None, **{"reindex": {"schedule": " 15m ", "schedules": {"x": "0 * * * *"}}})  # type: ignore[call-arg]
    assert env.reindex.schedule == "15m" and env.reindex.schedules == {"x": "0 * * * *"}


def test_schedule_with_a_short_interval_reindexes(service: Quarry, small: str) -> None:
    settings = service.settings.reindex.model_copy(update={"schedules": {small: "1s"}})
    scheduler = ReindexScheduler(service, settings)
    service.scheduler = scheduler
    scheduler.start()
    try:
        assert service.describe(small)["reindex"]["next_run"] is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(j.state == "done" for j in _jobs(service, small)):
            time.sleep(0.2)
    finally:
        scheduler.shutdown()
        service.scheduler = None
    jobs = _settle(service, small)
    done = [j for j in jobs if j.state == "done"]
    assert done, [(j.state, j.error) for j in jobs]
    assert all(j.params["trigger"] == "schedule" and j.params["reason"] == "schedule '1s'" for j in jobs)
    assert all(j.params["by"].split(":")[1] == str(os.getpid()) for j in jobs)
    assert done[-1].counters["embedded"] == 0 and service.live_version(small).version >= 2
    assert all(b.created_at >= a.updated_at for a, b in itertools.pairwise(jobs))  # never two at once
    last = service.describe(small)["reindex"]["last_trigger"]
    assert last["trigger"] == "schedule" and last["job"] == jobs[-1].id
    assert service.describe(small)["reindex"]["next_run"] is None  # no scheduler now


def test_churn_and_growth_triggers_start_one_reindex(
    service: Quarry, small: str, scifact_docs: list[SourceDocument]
) -> None:
    settings = service.settings.reindex.model_copy(update={"churn_fraction": 0.2, "on_growth": True})
    scheduler = ReindexScheduler(service, settings)  # not started: its checks are called by hand
    assert scheduler.due(small) is None
    service.delete_documents(small, [d.id for d in scifact_docs[:12]])  # 12 of 40: 30 % > 20 %
    due = scheduler.due(small)
    assert due is not None and due.trigger == "churn" and "12 of 40 documents deleted" in due.reason, due
    started = scheduler.check_triggers([small])
    assert len(started) == 1 and started[0].params["trigger"] == "churn"
    assert scheduler.check_triggers([small]) == []  # the lease: one at a time
    jobs = _settle(service, small)
    assert [j.state for j in jobs] == ["done"], [(j.state, j.error) for j in jobs]
    assert scheduler.due(small) is None  # the new version was built after the deletes
    assert scheduler.check_triggers([small]) == []

    # growth: the live index was planned for 1,000,000 vectors, the collection holds 28 documents' chunks
    service.apply_index(small, service.reindexer.plan(1_000_000, 384))
    kind = service.get_collection(small).index["kind"]
    due = scheduler.due(small)
    if kind == "FLAT":
        pytest.skip("this engine plans FLAT even for 1,000,000 vectors")
    assert due is not None and due.trigger == "growth" and "planned for 1,000,000 vectors" in due.reason, due
    started = scheduler.check_triggers([small])
    assert len(started) == 1 and started[0].params["trigger"] == "growth"
    jobs = _settle(service, small)
    assert [j.state for j in jobs] == ["done", "done"], [(j.state, j.error) for j in jobs]
    assert service.get_collection(small).index["kind"] == "FLAT" and scheduler.due(small) is None
    assert service.describe(small)["reindex"]["last_trigger"]["trigger"] == "growth"


@contextmanager
def _two_servers(state_url: str, store_url: str, tmp: pytest.TempPathFactory) -> Iterator[list[httpx.Client]]:
    """Two ``quarry serve`` processes on one store and one PostgreSQL docstore, each scheduling every 2 s."""
    from tests.state.test_workers import _serve

    servers: list[QuarryServer] = []
    clients: list[httpx.Client] = []
    try:
        for i in range(2):
            servers.append(_serve(
                [], tmp.mktemp(f"sched{i}"), QUARRY_STORE__URL=store_url,
                QUARRY_DOCSTORE__URL=state_url, QUARRY_REINDEX__SCHEDULE="2s",
                QUARRY_BM25__MAX_STALENESS_S="1", QUARRY_SEARCH__DENSE_TIMEOUT_S="120",
            ))
            clients.append(httpx.Client(base_url=servers[-1].url, timeout=120))
        for server in servers:
            server.wait_ready(timeout_s=400, poll_s=1)
        yield clients
    finally:
        for client in clients:
            client.close()
        for server in servers:
            server.stop()


def _search_both(clients: list[httpx.Client], name: str, query: str, seconds: float) -> int:
    """Hybrid and BM25 searches on both servers for ``seconds``; each must answer 200, not degraded."""
    searches = 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        for client in clients:
            for mode in ("hybrid", "bm25"):
                found = client.post(f"/v1/collections/{name}/search", json={"query": query, "mode": mode})
                assert found.status_code == 200, found.text
                assert not found.json().get("degraded"), found.json()
                searches += 1
        time.sleep(0.5)
    return searches


@pytest.mark.integration
def test_two_servers_with_a_short_schedule_never_reindex_a_collection_twice_at_once(
    tmp_path_factory: pytest.TempPathFactory, scifact_docs: list[SourceDocument], counting: object
) -> None:
    from tests.state.conftest import PG_URL, pg_schema

    name = f"sched2p{RUN}"
    with pg_schema() as state_url:
        try:
            with _two_servers(state_url, PG_URL, tmp_path_factory) as clients:
                assert clients[0].post("/v1/collections", json={"name": name}).status_code == 201
                docs = [{"id": d.id, "title": d.title, "text": d.text} for d in scifact_docs[:40]]
                r = clients[1].post(f"/v1/collections/{name}/documents", json={"documents": docs})
                assert r.status_code == 200, r.text
                searches = _search_both(clients, name, scifact_docs[3].title, 40)  # ~20 ticks in each
                described = clients[0].get(f"/v1/collections/{name}").json()
            state = open_docstore(state_url, tmp_path_factory.mktemp("state"))
            try:
                jobs = sorted((j for j in state.list_jobs(collection=name, limit=1000) if j.kind == "reindex"),
                              key=lambda j: j.created_at)
            finally:
                state.close()
        finally:
            settings = Settings(data_dir=tmp_path_factory.mktemp("clean"), store=StoreSettings(url=PG_URL),
                                docstore=DocstoreSettings(url=state_url))
            cleanup = Quarry(settings, embedder=counting)  # type: ignore[arg-type]
            try:
                if name in cleanup.docstore.list_collections():
                    cleanup.drop_collection(name)  # every version's store collection too
            finally:
                cleanup.close()
    done = [j for j in jobs if j.state == "done"]
    pids = {j.params["by"].split(":")[1] for j in jobs}
    print(f"{len(jobs)} scheduled reindex jobs ({len(done)} done) started by {len(pids)} processes; "
          f"{searches} searches, all 200")
    assert len(done) >= 2, [(j.state, j.error) for j in jobs]
    assert all(j.params["trigger"] == "schedule" for j in jobs)
    for a, b in itertools.pairwise(jobs):  # none overlaps the next: it ended before the next began
        assert a.state in ("done", "failed") and b.created_at >= a.updated_at, (a, b)
    assert described["reindex"]["last_trigger"]["trigger"] == "schedule" and described["live_version"] >= 2


def test_reindex_due_once_for_an_external_cron(service: Quarry, small: str) -> None:
    scheduler = ReindexScheduler(service, service.settings.reindex.model_copy(update={"schedules": {small: "1h"}}))
    started = scheduler.run_due([small])  # never reindexed on schedule: due
    assert [j.params["trigger"] for j in started] == ["schedule"] and "reindex --due" in started[0].params["reason"]
    assert [j.state for j in _settle(service, small)] == ["done"]
    assert scheduler.run_due([small]) == []  # one within the hour: not due again
    off = ReindexScheduler(service, service.settings.reindex)  # nothing set: nothing due
    assert off.run_due([small]) == []


def test_reindex_cli_needs_a_name_or_due(tmp_path: object) -> None:
    from typer.testing import CliRunner

    from quarry.cli import app

    done = CliRunner().invoke(app, ["reindex"])
    assert done.exit_code == 2 and "--due" in done.output, done.output



def test_recall_trigger_reindexes_once(
    tmp_path_factory: pytest.TempPathFactory, scifact_docs: list[SourceDocument], counting: object
) -> None:
    """The monitor measures answers far from the exact ones (recall 0) and fires; one reindex follows.

    The answers are the store's real top-10 for the *negated* query (its farthest vectors): at
    150 documents no index of these engines answers a live search below the floor (pgvector
    re-runs short IVF answers exactly), so the weak index is stood for by the wrong answer.
    """
    from monitoring.exact import Sample
    from quarry.settings import MonitorSettings

    settings = Settings(
        data_dir=tmp_path_factory.mktemp("recall-trigger"),
        monitor=MonitorSettings(sample_rate=0.0, trigger_window_s=3, trigger_min_samples=5),
    )
    service = Quarry(settings, embedder=counting)  # type: ignore[arg-type]
    name = f"schedrc{RUN}"
    service.create_collection(name)
    try:
        service.upsert(name, scifact_docs[:60])
        scheduler = ReindexScheduler(service, settings.reindex.model_copy(update={"on_recall": True}))
        time.sleep(3.1)  # the live version has served a whole trigger window
        live = service.live_version(name).physical_name
        vectors = counting.embed([d.title for d in scifact_docs[:10]]).vectors  # type: ignore[attr-defined]
        for vector in vectors:
            far = service.store.search(live, -vector[None, :], 10, with_payload=False)[0]
            service.monitor.measure(Sample(name, "cosine", vector, None, 10, tuple(h.id for h in far), live))
        due = scheduler.due(name)
        assert due is not None and due.trigger == "recall" and "below 0.9" in due.reason, str(service.recall(name))
        started = scheduler.check_triggers([name])
        assert [j.params["trigger"] for j in started] == ["recall"]
        jobs = _settle(service, name)
        assert [j.state for j in jobs] == ["done"], [(j.state, j.error) for j in jobs]
        assert scheduler.due(name) is None and scheduler.check_triggers([name]) == []  # once: a new version
    finally:
        service.drop_collection(name)
        service.close()
