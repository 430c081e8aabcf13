"""The OpenAPI is the contract: schemathesis against a live server finds no 5xx and no drift.

One ``quarry serve`` (uvicorn, Milvus Lite, the packaged MiniLM) on a free port, with an API key
(``read,write,admin``, made before the server starts: every route but the open ones needs it), over
a small collection ingested through the API; schemathesis reads ``/openapi.json`` (its
``securitySchemes`` and per-route ``security``), sends the key with every request and runs every
operation through its four phases (examples, coverage, fuzzing, stateful), a bounded number of
cases each, with a fixed seed. Every check runs but ``positive_data_acceptance``: the service
also refuses, with a 400 in the envelope, requests that no JSON Schema can describe (``offset +
top_k`` past the rank window, a blank query or text after stripping, a metadata field whose
type an earlier document fixed, limits that are runtime settings). The ``ignored_auth`` check
(part of ``all``) sends each keyed operation without the key too: it must be refused.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serve import QuarryServer

REPO = Path(__file__).resolve().parents[2]
MAX_EXAMPLES = 25  # cases per operation and phase: ~2-3 min on 2 busy cores
SEED = 20


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``(http://127.0.0.1:<port>, key)`` of a ``quarry serve`` child holding collection ``docs``."""
    data = tmp_path_factory.mktemp("conformance")
    env = {**os.environ, "QUARRY_DATA_DIR": str(data), "PYTHONPATH": str(REPO)}
    made = subprocess.run(
        [sys.executable, "-m", "quarry.cli", "keys", "create", "--scopes", "read,write,admin", "--name", "conformance"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=True,
    )
    key = made.stdout.strip()
    with QuarryServer(env, log=data / "server.log", cwd=REPO).wait_ready() as server:
        _ingest(server.url, key)
        yield server.url, key


def _ingest(url: str, key: str) -> None:
    with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {key}"}) as client:
        assert client.post("/v1/collections", json={"name": "docs", "language": "en"}).status_code == 201
        docs = [
            {"id": f"d{i}", "title": title, "text": text, "metadata": {"year": 1995 + i, "tag": tag}}
            for i, (title, text, tag) in enumerate([
                ("cats", "the cat sat on the mat", "pets"),
                ("dogs", "dogs bark at night", "pets"),
                ("", "hybrid retrieval fuses BM25 and dense rankings", "search"),
                ("milvus", "vector stores index embeddings for nearest neighbour search", "search"),
            ])
        ]
        r = client.post("/v1/collections/docs/documents", json={"documents": docs})
        assert r.status_code == 200, r.text


def test_the_server_refuses_a_request_without_its_key(live_server: tuple[str, str]) -> None:
    url, _ = live_server
    assert httpx.get(f"{url}/v1/collections").status_code == 401
    schema = httpx.get(f"{url}/openapi.json").json()
    assert set(schema["components"]["securitySchemes"]) == {"bearer", "api-key"}


def test_schemathesis_finds_no_server_error_and_no_drift(live_server: tuple[str, str], tmp_path: Path) -> None:
    url, key = live_server
    started = time.monotonic()
    # This server has no LLM: an answer that must be given (require_answer) is its documented,
    # typed 503 LLMNotConfigured, not a server error; every other 5xx still fails the run.
    (tmp_path / "schemathesis.toml").write_text(
        '[[operations]]\n'
        'include-path-regex = "/answer$|^/v1/chat/completions$"\n'
        'checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "503"]\n',
        encoding="utf-8",
    )
    cli = Path(sys.executable).with_name("schemathesis")
    run = subprocess.run(
        [
            str(cli), "--no-color", "run", f"{url}/openapi.json", "--header", f"Authorization: Bearer {key}",
            "--phases", "examples,coverage,fuzzing,stateful",
            "--checks", "all", "--exclude-checks", "positive_data_acceptance",
            "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED), "--workers", "1",
            "--request-timeout", "60",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )
    summary = run.stdout[-6000:]
    print(f"schemathesis: {time.monotonic() - started:.0f} s\n{summary}")
    assert run.returncode == 0, summary + run.stderr[-2000:]
    operations = sum(len(ops) for ops in httpx.get(f"{url}/openapi.json").json()["paths"].values())
    assert re.search(rf"Selected: {operations}/{operations}\s+Tested: {operations}\b", run.stdout), summary
    assert re.search(r"✅ Stateful", run.stdout), summary  # the stateful phase ran and passed
