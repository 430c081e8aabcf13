"""Attacks a hostile client or tenant would try, each a regression test of a hole found (and closed) on 2026-12-03.

No model and no vector store where the hole does not need one: these run in well under a second each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from starlette.requests import Request

from indexing.docstore import open_docstore
from quarry.api import access, keys
from quarry.api.keys import KeyVerifier, new_key
from quarry.errors import Forbidden, InvalidRequest, RateLimited, Unauthenticated
from quarry.ingest_jobs import confine
from quarry.service import Quarry
from quarry.settings import AuthSettings, Settings
from tests.core.conftest import CountingEmbedder


def test_a_beir_folder_whose_corpus_links_out_of_the_roots_is_refused(tmp_path: Path) -> None:
    """A BEIR folder inside the root is read through its ``corpus.jsonl``: a link there to a file outside escaped.

    ``confine`` checked the folder only, and ``Source`` reads ``<folder>/corpus.jsonl`` without the
    per-file check a plain folder gets: a job over ``beir/`` ingested ``outside/corpus.jsonl``.
    """
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "beir").mkdir(parents=True)
    outside.mkdir()
    (outside / "corpus.jsonl").write_text(json.dumps({"_id": "s1", "text": "a secret beyond the root"}) + "\n")
    (root / "beir" / "corpus.jsonl").symlink_to(outside / "corpus.jsonl")
    with pytest.raises(Forbidden, match="corpus.jsonl links outside"):
        confine("beir", [root])
    # a BEIR folder whose corpus is its own (or links within the roots) is still a source
    (root / "ok").mkdir()
    (root / "ok" / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "text": "inside"}) + "\n")
    (root / "linked").mkdir()
    (root / "linked" / "corpus.jsonl").symlink_to(root / "ok" / "corpus.jsonl")
    assert confine("ok", [root]) == (root / "ok").resolve()
    assert confine("linked", [root]) == (root / "linked").resolve()


def test_a_source_path_the_os_cannot_look_up_is_a_400_not_a_500(tmp_path: Path) -> None:
    """A path segment over NAME_MAX (255 bytes) made ``Path.exists`` raise ``OSError`` (ENAMETOOLONG).

    ``POST /v1/collections/{name}/jobs {"path": "a" * 300}`` answered 500 ``InternalError``: any
    ``write`` key could fill the server log with tracebacks. Now 400 ``InvalidRequest``.
    """
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    with pytest.raises(InvalidRequest, match="cannot be looked up"):
        confine("a" * 300, [root])
    with pytest.raises(InvalidRequest, match="cannot be looked up"):
        confine("sub/" + "b" * 1000 + "/x.jsonl", [root])


def _wrong(key: str) -> str:
    """The key with another random secret (same id): what a client that saw the id can send."""
    return key[:16] + secrets.token_urlsafe(32)


def test_wrong_secrets_for_a_known_key_id_cost_at_most_5_scrypts_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each new wrong secret for a real key id ran scrypt (~50 ms of CPU); nothing bounded them.

    A key id is no secret (error messages, logs, the audit name it): any client could make the
    server hash without end. Now at most 5 wrong secrets per id and second are checked; more
    are 429 without hashing, and the key verified before is still recognised from its memo.
    """
    state = open_docstore("", tmp_path)
    try:
        key, record = new_key("default", ["read"])
        state.insert_api_key(record)
        now = [1000.0]
        verifier = KeyVerifier(state, clock=lambda: now[0])
        assert verifier.verify(key).key_id == record.id
        hashed = []
        real = keys.check_secret
        monkeypatch.setattr(keys, "check_secret", lambda secret, stored: hashed.append(1) or real(secret, stored))
        outcomes = []
        for _ in range(20):
            try:
                verifier.verify(_wrong(key))
            except (Unauthenticated, RateLimited) as exc:
                outcomes.append(type(exc).__name__)
        assert len(hashed) == 5 and outcomes == ["Unauthenticated"] * 5 + ["RateLimited"] * 15, (hashed, outcomes)
        state.create_tenant("acme", "acme")  # a commit: the key's record is read again, its secret from the memo
        assert verifier.verify(key).key_id == record.id and len(hashed) == 5
        now[0] += 1.5  # the window moved on: a wrong secret is checked (and refused) again
        with pytest.raises(Unauthenticated, match="wrong secret"):
            verifier.verify(_wrong(key))
        assert len(hashed) == 6
    finally:
        state.close()


def _hammer(verifiers: list[KeyVerifier], key: str, threads: int) -> list[str]:
    """``threads`` threads at once, each presenting a new wrong secret of ``key`` to a verifier in turn."""
    start = threading.Barrier(threads)
    outcomes: list[str] = []

    def one(i: int) -> None:
        start.wait()
        try:
            verifiers[i % len(verifiers)].verify(_wrong(key))
        except (Unauthenticated, RateLimited) as exc:
            outcomes.append(type(exc).__name__)

    running = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    return outcomes


def test_concurrent_wrong_secrets_for_one_key_id_cost_at_most_5_scrypts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bound counted wrong secrets after their scrypt: 32 threads at once all passed it.

    The attack measured 5.0 checks/s with 1 client thread, 9.1 with 4, 16.0 with 16 and 26.8 with
    32. Now a check takes its place before it hashes: 32 threads at once (one clock second) hash 5.
    """
    state = open_docstore("", tmp_path)
    try:
        key, record = new_key("default", ["read"])
        state.insert_api_key(record)
        verifier = KeyVerifier(state, clock=lambda: 1000.0)
        hashed: list[int] = []
        real = keys.check_secret
        monkeypatch.setattr(keys, "check_secret", lambda secret, stored: hashed.append(1) or real(secret, stored))
        assert verifier.verify(key).key_id == record.id  # a right secret: checked, its place given back
        outcomes = _hammer([verifier], key, 32)
        assert len(hashed) == 6, len(hashed)  # the right one and 5 wrong ones
        assert sorted(outcomes) == ["RateLimited"] * 27 + ["Unauthenticated"] * 5
        assert verifier.verify(key).key_id == record.id and len(hashed) == 6  # the right one: from its memo
    finally:
        state.close()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def test_workers_sharing_the_state_share_the_wrong_secret_bound(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each worker (a verifier of its own over the shared state) counted its own 5: N workers, 5 x N scrypts.

    Four verifiers over four handles of one state of record, 32 threads at once: 5 hashed in all
    (the state's check slots; held 30 s here so that a slow machine cannot free one meanwhile).
    """
    from tests.state.conftest import pg_schema

    with pg_schema() if backend == "postgres" else _no_schema() as url:
        handles = [open_docstore(url or "", tmp_path) for _ in range(4)]
        try:
            key, record = new_key("default", ["read"])
            handles[0].insert_api_key(record)
            workers = [KeyVerifier(h, clock=lambda: 1000.0, slots=keys.CheckSlots(h, 5, 30.0)) for h in handles]
            hashed: list[int] = []
            real = keys.check_secret
            monkeypatch.setattr(keys, "check_secret", lambda secret, stored: hashed.append(1) or real(secret, stored))
            assert workers[1].verify(key).key_id == record.id  # a right secret gives its slot back
            outcomes = _hammer(workers, key, 32)
            assert len(hashed) == 6 and outcomes.count("Unauthenticated") == 5, (len(hashed), outcomes)
            assert workers[1].verify(key).key_id == record.id and len(hashed) == 6  # from its memo
        finally:
            for handle in handles:
                handle.close()


class _no_schema:  # noqa: N801 - a context manager that yields None (SQLite: a file in tmp_path)
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_key_verification_runs_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``authorize`` verified a new key on the event loop: scrypt held every other request ~50 ms.

    Here the secret check waits (5 s at most) for a callback the event loop runs 10 ms later:
    it runs only if the check is not on the loop (on main: it timed out, and the key was refused).
    """
    state = open_docstore("", tmp_path)
    try:
        key, record = new_key("default", ["read"])
        state.insert_api_key(record)
        layer = access.Access(state, AuthSettings())
        loop_ran = threading.Event()
        real = keys.check_secret
        monkeypatch.setattr(keys, "check_secret", lambda secret, stored: loop_ran.wait(5) and real(secret, stored))
        scope = {
            "type": "http", "method": "GET", "path": "/v1/collections", "query_string": b"",
            "headers": [(b"authorization", f"Bearer {key}".encode())], "path_params": {},
            "app": SimpleNamespace(state=SimpleNamespace(access=layer)),
            "route": SimpleNamespace(path="/v1/collections"),
        }

        async def scenario() -> str | None:
            asyncio.get_running_loop().call_later(0.01, loop_ran.set)
            return (await access.authorize(Request(scope))).key_id

        assert asyncio.run(scenario()) == record.id
    finally:
        state.close()


def test_a_tenant_id_holding_a_double_underscore_is_refused() -> None:
    """Vector-store names are ``t_<tenant>__<collection>`` and collection names may hold ``__``.

    So tenant ``acme``'s ``corp__docs`` and tenant ``acme__corp``'s ``docs`` were the same
    physical collection ``t_acme__corp__docs``: whichever came second got 409 (a name squatted
    across tenants, and the first's collection listed by the second's store view). A tenant id
    with ``__`` is now refused when its key is made (the only way a tenant is created).
    """
    for bad in ("acme__corp", "a__", "x__y__z"):
        with pytest.raises(InvalidRequest, match="never '__'"):
            new_key(bad, ["read"])
    for good in ("acme", "acme_corp", "a_b_c", "t1_"):
        assert new_key(good, ["read"])[1].tenant_id == good


def test_describe_of_a_shared_collection_reads_its_own_key_range_only(
    tmp_path: Path, counting: CountingEmbedder,
) -> None:
    """``ScopedQuarry._own_ids`` read every id after the tenant's prefix, the later tenants' too.

    A ``read`` key of tenant ``aa`` describing a shared collection holding 3,000 documents of
    ``tb`` (and none of its own) read all 3,000 ids: each describe cost O(every later tenant's
    documents). Now it pages and stops at the first id past its range.
    """
    quarry = Quarry(Settings(data_dir=tmp_path), embedder=counting)
    try:
        for tenant in ("aa", "tb"):
            quarry.docstore.create_tenant(tenant, tenant)
        quarry.create_collection("kb", shared=True)
        shared = quarry.shared_view()
        shared.docstore.write_batch("kb", [(f"tb/d{i:05d}", "h") for i in range(3000)], [], [])
        shared.docstore.write_batch("kb", [("aa/x", "h")], [], [])
        scoped = quarry.for_tenant("aa").for_collection("kb")
        read: list[int] = []
        real = scoped.docstore.document_ids

        def counted(name: str, **kw: object) -> list[str]:
            ids = real(name, **kw)  # type: ignore[arg-type]
            read.append(len(ids))
            return ids

        scoped.docstore.document_ids = counted  # type: ignore[method-assign]
        assert scoped.describe("kb")["documents"] == 1
        assert sum(read) <= 1000, read
        tb = quarry.for_tenant("tb").for_collection("kb")
        assert tb.describe("kb")["documents"] == 3000  # a range longer than one page is read whole
    finally:
        quarry.close()


def test_an_over_rate_keys_429_and_a_flooded_ids_are_answered_before_routing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each 429 of an over-rate key went through routing, the dependencies and the exception handler.

    ~420 µs of server CPU each (``bench/abuse.py``): 1,700 of them a second took the victim
    tenant's p50 from 1.2 to 7.5 ms. Now the outermost middleware answers them from two
    dictionary lookups by the key's id, before the app: 68 µs each.
    """
    from starlette.datastructures import Headers

    from quarry.api import pacing
    from quarry.api.observe import ObserveMiddleware

    state = open_docstore("", tmp_path)
    try:
        key, record = new_key("default", ["read"], rate=1.0)
        state.insert_api_key(record)
        layer = access.Access(state, AuthSettings())
        headers = Headers({"authorization": f"Bearer {key}"})
        assert access.limited_early(layer, headers) is None
        layer.limiter.spend(record.id, 1.0)
        with pytest.raises(RateLimited):
            layer.limiter.spend(record.id, 1.0)  # authorize's refusal: the window is full for ~1 s
        assert isinstance(access.limited_early(layer, headers), RateLimited)
        # an id flooded with wrong secrets: refused unread, but the key verified before passes
        other, other_record = new_key("default", ["read"])
        state.insert_api_key(other_record)
        assert layer.verifier.verify(other).key_id == other_record.id
        for _ in range(6):
            with pytest.raises((Unauthenticated, RateLimited)):
                layer.verifier.verify(_wrong(other))
        assert isinstance(access.limited_early(layer, Headers({"api-key": _wrong(other)})), RateLimited)
        assert access.limited_early(layer, Headers({"api-key": other})) is None

        reached: list[str] = []

        async def app(scope: dict[str, object], receive: object, send: object) -> None:
            reached.append(str(scope["path"]))

        sent: list[dict[str, object]] = []

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        async def receive() -> dict[str, object]:
            return {"type": "http.request", "body": b""}

        held: list[tuple[float, float, int]] = []

        async def hold(hold_s: float, retry_after_s: float, max_held: int) -> bool:
            held.append((hold_s, retry_after_s, max_held))
            return True

        monkeypatch.setattr(pacing, "hold", hold)
        service = SimpleNamespace(settings=SimpleNamespace(auth=AuthSettings(), metrics=SimpleNamespace(enabled=False)))
        scope = {
            "type": "http", "method": "POST", "path": "/v1/collections/c/search", "query_string": b"",
            "headers": [(b"authorization", f"Bearer {key}".encode())],
            "app": SimpleNamespace(state=SimpleNamespace(access=layer, quarry=service)),
        }
        with contextlib.suppress(RateLimited):  # the window again: the wrong-secret checks above can outlast it
            layer.limiter.spend(record.id, 1.0)
        asyncio.run(ObserveMiddleware(app)(scope, receive, send))  # type: ignore[arg-type]
        assert reached == [] and sent[0]["status"] == 429
        assert (b"retry-after", b"1") in sent[0]["headers"]  # type: ignore[operator]
        # held before it goes (QUARRY_AUTH__LIMIT_HOLD_S, at most Retry-After), as a shed 503: paced
        assert len(held) == 1 and held[0][0] == 1.0 and held[0][2] == 256
    finally:
        state.close()
