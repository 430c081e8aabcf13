"""Hostile texts at every route, on both docstores: a 4xx in the error envelope, never a 5xx, and the connection lives.

A real uvicorn server (in a thread) over a real service with an API key required, on Milvus Lite,
with the SQLite state and with the PostgreSQL state (a schema of its own). Every route of the
app's OpenAPI has a valid example request below (a new route without one fails the test); each
of its texts (path parameters, query parameters, every string and object key of its JSON body)
is replaced, one at a time, by a hostile value: a NUL, a lone UTF-16 surrogate, a control
character, an over-long value. First every (route, text, kind) once, then hypothesis draws more
values. Each request goes over one kept-alive connection (``http.client`` that never reconnects
by itself), and a ``GET /healthz`` follows it on that same connection.

What must hold (:mod:`quarry.api.edge`):

* never a 5xx; a 4xx carries ``{"error": {"type", "message", "retryable"}}``;
* a NUL or a lone surrogate anywhere, and any hostile value in a text that names something
  (path and query parameters, a chat ``model``, a rerank ``model``, a reindex ``model``/``index``,
  an ingest ``path``), is a 4xx;
* the server never closes the connection (no ``Connection: close``, and the next request on it works).

Before the edge checks: a chat ``model`` ``"quarry/\\ud800"`` was a 500 (and the server dropped the
connection), ``GET .../documents?cursor=%00`` and a delete of id ``"n\\u0000"`` were a 500
``StoreError`` on PostgreSQL, a 250-character collection name a 500 (the lock file's name).
"""

from __future__ import annotations

import copy
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quarry.api import create_app
from quarry.api.keys import new_key
from quarry.service import Quarry
from quarry.settings import DocstoreSettings, Settings
from tests.core.conftest import CountingEmbedder
from tests.state.conftest import pg_schema

NAME = "edge"
DOC = "d1"

# (method, template) -> (path params, query params, JSON body or None); every route of the OpenAPI
EXAMPLES: dict[tuple[str, str], tuple[dict[str, str], dict[str, str], Any]] = {
    ("GET", "/healthz"): ({}, {}, None),
    ("GET", "/readyz"): ({}, {}, None),
    ("GET", "/v1/collections"): ({}, {}, None),
    # a name taken already: a value that slips through makes a 409, never a new collection
    ("POST", "/v1/collections"): ({}, {}, {"name": NAME, "language": "en", "tenancy": "tenant",
                                           "fusion": {"method": "rrf"}}),
    ("GET", "/v1/collections/{name}"): ({"name": NAME}, {}, None),
    ("DELETE", "/v1/collections/{name}"): ({"name": "gone"}, {}, None),
    ("GET", "/v1/collections/{name}/recall"): ({"name": NAME}, {}, None),
    ("POST", "/v1/collections/{name}/reindex"): ({"name": "gone"}, {}, {"model": "m", "index": "auto"}),
    ("POST", "/v1/collections/{name}/rollback"): ({"name": "gone"}, {}, None),
    ("GET", "/v1/collections/{name}/rollout"): ({"name": NAME}, {}, None),
    ("POST", "/v1/collections/{name}/rollout"): (
        {"name": "gone"}, {}, {"model": "m", "index": "HNSW", "mode": "canary", "schedule": [5, 100]},
    ),
    ("POST", "/v1/collections/{name}/rollout/step"): ({"name": "gone"}, {}, None),
    ("POST", "/v1/collections/{name}/rollout/promote"): ({"name": "gone"}, {}, None),
    ("POST", "/v1/collections/{name}/rollout/abort"): ({"name": "gone"}, {}, None),
    ("GET", "/v1/collections/{name}/rollout/report"): ({"name": NAME}, {"format": "json"}, None),
    ("POST", "/v1/collections/{name}/feedback"): (
        {"name": NAME}, {}, {"request_id": "r-1", "rating": "down", "clicked": [DOC]},
    ),
    ("GET", "/v1/jobs"): ({}, {"limit": "10"}, None),
    ("GET", "/v1/audit"): ({}, {"limit": "10", "cursor": "1"}, None),
    ("GET", "/v1/jobs/{job_id}"): ({"job_id": "0" * 32}, {}, None),
    ("DELETE", "/v1/jobs/{job_id}"): ({"job_id": "0" * 32}, {}, None),
    ("POST", "/v1/collections/{name}/jobs"): ({"name": NAME}, {}, {"path": "corpus.jsonl", "on_error": "skip"}),
    ("POST", "/v1/collections/{name}/documents"): (
        {"name": NAME}, {},
        {"documents": [{"id": "d2", "title": "t", "text": "boats at dawn", "metadata": {"tag": "a", "tags": ["b"]}}]},
    ),
    ("GET", "/v1/collections/{name}/documents"): ({"name": NAME}, {"cursor": DOC, "limit": "10"}, None),
    ("POST", "/v1/collections/{name}/documents/delete"): ({"name": NAME}, {}, {"ids": ["nope"]}),
    ("GET", "/v1/collections/{name}/documents/{document_id}"): ({"name": NAME, "document_id": DOC}, {}, None),
    ("DELETE", "/v1/collections/{name}/documents/{document_id}"): ({"name": NAME, "document_id": "nope"}, {}, None),
    ("POST", "/v1/collections/{name}/search"): (
        {"name": NAME}, {},
        {"query": "boats", "mode": "hybrid", "filters": {"tag": {"$in": ["a", "b"]}}, "rerank": {"model": "m"}},
    ),
    ("POST", "/v1/collections/{name}/answer"): (
        {"name": NAME}, {}, {"query": "boats", "mode": "bm25", "filters": {"tag": "a"}},
    ),
    ("POST", "/v1/chat/completions"): (
        {}, {},
        {"model": f"quarry/{NAME}", "messages": [{"role": "user", "content": "boats"}], "user": "u",
         "quarry": {"mode": "bm25", "filters": {"tag": "a"}, "require_answer": False}},
    ),
    ("GET", "/v1/models"): ({}, {}, None),
    ("GET", "/v1/models/{model}"): ({"model": f"quarry/{NAME}"}, {}, None),
    ("POST", "/v1/embeddings"): (
        {}, {}, {"model": f"quarry/{NAME}", "input": ["boats"], "encoding_format": "float", "user": "u",
                 "quarry": {"input_type": "query"}},
    ),
    ("GET", "/v1/reports"): ({}, {}, None),
    ("GET", "/v1/reports/{report_id}"): ({"report_id": "run1"}, {}, None),
    ("GET", "/v1/reports/{report_id}/{file}"): ({"report_id": "run1", "file": "summary.json"}, {}, None),
}
CHAT = ("POST", "/v1/chat/completions")
OPENAI = (CHAT, ("POST", "/v1/embeddings"))  # OpenAI's bodies: other fields accepted and ignored
# where a control character or a long value is data, not a name: refused or served, never a 5xx
DATA = ("query", "content", "text", "title", "metadata", "filters", "ids", "user", "messages", "role", "input")


@dataclass(frozen=True)
class Slot:
    """One text of one request: ``("path", param)``, ``("query", param)``, or a JSON path (``key`` True: the key)."""

    route: tuple[str, str]
    where: str
    at: tuple[str | int, ...]
    key: bool = False

    @property
    def names_something(self) -> bool:
        """Whether any control character or over-long value here must be refused (not data)."""
        if self.key and self.route in OPENAI and len(self.at) <= 3:
            return False  # OpenAI's other fields are accepted and ignored (no NUL or surrogate, though)
        return self.where != "body" or not any(str(p) in DATA for p in self.at)


def _slots() -> list[Slot]:
    out = []
    for route, (path, query, body) in EXAMPLES.items():
        out += [Slot(route, "path", (p,)) for p in path]
        out += [Slot(route, "query", (p,)) for p in [*query, "x"]]  # "x": one the route does not know
        out += [Slot(route, "body", at, key) for at, key in _texts(body, ())]
    return out


def _texts(value: Any, at: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], bool]]:
    if isinstance(value, str):
        yield at, False
    elif isinstance(value, dict):
        for k, v in value.items():
            yield (*at, k), True
            yield from _texts(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _texts(v, (*at, i))


SLOTS = _slots()
HOSTILE = {
    "nul": "a\x00b",
    "surrogate": "a\ud800b",
    "low surrogate": "\udc00",
    "newline": "a\nb",
    "escape": "\x1b[31m",
    "c1": "a\x85",
    "long": "a" * 300,
    "longer": "b" * 5000,
}
STRICT = ("nul", "surrogate", "low surrogate")  # refused in any text


def _replace(body: Any, at: tuple[str | int, ...], key: bool, value: str, append: bool) -> Any:
    body = copy.deepcopy(body)
    parent = body
    for part in at[:-1]:
        parent = parent[part]
    last = at[-1]
    if key:
        assert isinstance(last, str)
        parent[last + value if append else value] = parent.pop(last)
    else:
        parent[last] = parent[last] + value if append else value
    return body


class Conn:
    """One kept-alive HTTP/1.1 connection that never reconnects by itself."""

    def __init__(self, port: int, key: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.conn.auto_open = 0
        self.conn.connect()
        self.headers = {"Authorization": f"Bearer {key}"}

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes, bool]:
        headers = dict(self.headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, body=body, headers=headers)
        r = self.conn.getresponse()
        data = r.read()
        return r.status, data, bool(r.will_close)

    def close(self) -> None:
        self.conn.close()


def _url(route: tuple[str, str], path: dict[str, str], query: dict[str, str]) -> str:
    url = route[1].format(**{k: quote(v.encode("utf-8", "surrogatepass"), safe="") for k, v in path.items()})
    if query:
        url += "?" + urlencode({k.encode("utf-8", "surrogatepass"): v.encode("utf-8", "surrogatepass")
                                for k, v in query.items()})
    return url


def send_hostile(conn: Conn, slot: Slot, value: str, kind: str, *, append: bool = False) -> None:
    """Send ``slot`` holding ``value`` (``append``: after its valid text); check the answer and the connection."""
    path, query, body = EXAMPLES[slot.route]
    path, query = dict(path), dict(query)
    if slot.where == "path":
        param = str(slot.at[0])
        path[param] = path[param] + value if append else value
    elif slot.where == "query":
        param = str(slot.at[0])
        query[param] = query.get(param, "") + value if append else value
    else:
        body = _replace(body, slot.at, slot.key, value, append)
    raw = None if body is None else json.dumps(body).encode()  # ASCII: a surrogate travels as its \\u escape
    what = f"{slot} <- {kind} {value[:20]!r}"
    status, data, closing = conn.request(slot.route[0], _url(slot.route, path, query), raw)
    if slot.route == CHAT and status == 503:  # the body's quarry options renamed away: an answer is required,
        assert json.loads(data)["error"]["type"] == "LLMNotConfigured", data[:300]  # and this server has no LLM
        status = 200  # (as test_openapi_conformance's schemathesis run: the documented, typed 503)
    assert status < 500, (what, status, data[:500])
    if status >= 400:
        error = json.loads(data)["error"]
        assert set(error) == {"type", "message", "retryable"}, (what, data[:300])
    # a surrogate cannot travel in a URL: its UTF-8 bytes are invalid, and the server reads U+FFFD
    in_url = slot.where != "body" and any("\ud800" <= c <= "\udfff" for c in value)
    if not in_url and (kind in STRICT or slot.names_something):
        assert 400 <= status < 500, (what, status, data[:300])
    assert not closing, (what, "the server closes the connection")
    status, data, _ = conn.request("GET", "/healthz")
    assert status == 200, (what, "the next request on the connection", status, data[:200])


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, counting: CountingEmbedder,
) -> Iterator[tuple[int, str]]:
    """``(port, admin key)`` of a uvicorn server over a service holding collection ``edge`` with one document."""
    data: Path = tmp_path_factory.mktemp(f"edge-{request.param}")
    with pg_schema() if request.param == "postgres" else _nothing() as pg:
        if pg is None:
            settings = Settings(data_dir=data)
        else:
            settings = Settings(data_dir=data, docstore=DocstoreSettings(url=pg))
        quarry = Quarry(settings, embedder=counting)
        key, record = new_key("default", ["read", "write", "admin"])
        quarry.docstore.insert_api_key(record)
        quarry.create_collection(NAME, language="en")
        from indexing.document_rules import SourceDocument

        quarry.upsert(NAME, [SourceDocument(DOC, "boats at dawn", metadata={"tag": "a"})])
        port = _free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(quarry), host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 120
            while not server.started:
                assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
                time.sleep(0.05)
            yield port, key
        finally:
            server.should_exit = True
            thread.join(60)
            quarry.close()


class _nothing:  # noqa: N801 - a context manager that yields None
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_every_route_of_the_openapi_has_an_example() -> None:
    app = create_app(lambda: None)  # type: ignore[arg-type, return-value]
    routes = {(m.upper(), p) for p, ops in app.openapi()["paths"].items() for m in ops}
    assert routes == set(EXAMPLES), routes ^ set(EXAMPLES)


def test_every_text_of_every_route_refuses_each_hostile_kind(served: tuple[int, str]) -> None:
    port, key = served
    conn = Conn(port, key)
    try:
        for slot in SLOTS:
            for kind, value in HOSTILE.items():
                send_hostile(conn, slot, value, kind)
                send_hostile(conn, slot, value, kind, append=True)  # "quarry/edge\x00", "d1\n", ...
    finally:
        conn.close()


_BAD_CHARS = st.sampled_from(["\x00", "\ud800", "\udbff", "\udc00", "\udfff", "\x01", "\x1f", "\x7f", "\x9f", "\r"])
HOSTILE_VALUES = st.one_of(
    st.tuples(st.text(max_size=12), _BAD_CHARS, st.text(max_size=12)).map(lambda t: ("drawn", "".join(t))),
    st.text(alphabet="xyz_0", min_size=257, max_size=3000).map(lambda v: ("drawn long", v)),
)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(slot=st.sampled_from(SLOTS), drawn=HOSTILE_VALUES)
def _drawn(conn: Conn, slot: Slot, drawn: tuple[str, str]) -> None:
    kind, value = drawn
    strict = kind == "drawn" and any(c == "\x00" or "\ud800" <= c <= "\udfff" for c in value)
    send_hostile(conn, slot, value, "nul" if strict else kind)


def test_drawn_hostile_texts_never_reach_a_5xx(served: tuple[int, str]) -> None:
    port, key = served
    conn = Conn(port, key)
    try:
        _drawn(conn)
    finally:
        conn.close()


REPRODUCERS = [  # what the attack found: a 500 (and, after the chat one, a dropped connection)
    ("POST", "/v1/chat/completions", {"model": "quarry/\ud800", "messages": [{"role": "user", "content": "x"}]}),
    ("POST", "/v1/chat/completions", {"model": "quarry/a\x00", "messages": [{"role": "user", "content": "x"}]}),
    ("POST", f"/v1/collections/{NAME}/documents/delete", {"ids": ["n\x00"]}),
    ("GET", f"/v1/collections/{NAME}/documents?cursor=%00", None),
    ("DELETE", f"/v1/collections/{'x' * 250}/documents/x", None),
]


@pytest.mark.parametrize(("method", "path", "body"), REPRODUCERS)
def test_the_attacks_reproducers_are_400s_on_a_connection_that_lives(
    served: tuple[int, str], method: str, path: str, body: Any
) -> None:
    port, key = served
    conn = Conn(port, key)
    try:
        status, data, closing = conn.request(method, path, None if body is None else json.dumps(body).encode())
        assert status == 400 and json.loads(data)["error"]["type"] == "InvalidRequest", (status, data[:300])
        assert not closing
        assert conn.request("GET", "/healthz")[0] == 200
    finally:
        conn.close()
