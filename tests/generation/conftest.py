"""Fixtures of the answer path: a SciFact sample, a real uvicorn server, SSE (MiniLM: tests/conftest.py)."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from indexing.document_rules import SourceDocument
from indexing.sources import iter_jsonl
from tests.serve import free_port


@pytest.fixture(scope="session")
def scifact_sample(shared_data: Path) -> list[SourceDocument]:
    """The first 40 SciFact documents."""
    return list(itertools.islice(iter_jsonl(shared_data / "scifact" / "corpus.jsonl"), 40))


class Served:
    """An app served by a real uvicorn in a thread (streams reach the client as they are sent)."""

    def __init__(self, app: FastAPI) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def sse_events(response: httpx.Response) -> Iterator[tuple[str, dict[str, Any], float]]:
    """(event, data, monotonic time received) for each Server-Sent Event of a streamed response."""
    kind, data = "message", []
    for line in response.iter_lines():
        if line.startswith(":"):
            continue
        if not line:
            if data:
                yield kind, json.loads("\n".join(data)), time.monotonic()
            kind, data = "message", []
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
