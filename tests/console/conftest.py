"""The web console's browser tests: one ``quarry serve`` per test session, the Debian Chromium through Playwright.

The server (Milvus Lite, SQLite state, the packaged MiniLM, the suite's llama.cpp server as its
LLM, a reports folder with one run) starts once for the session, with one admin key made before
it starts. Playwright drives the Chromium that ``scripts/test.sh`` installs (``executable_path``:
no browser download). When a test fails, each console page is screenshotted into the test's
output folder (pytest-playwright's ``--output``, default ``test-results/``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, BrowserType, Page, Playwright, expect, sync_playwright

from tests.chromium import chromium_path
from tests.llama import LLM_URL
from tests.serve import QuarryServer

REPO = Path(__file__).resolve().parents[2]
VIEWS = ("collections", "search", "answer", "jobs", "recall", "reports")
XSS = '<img src=x onerror="window.__xss = 1">'
DOCS = [
    {"id": "tides", "title": "Tides", "text": "Tides follow the moon. The moon's gravity pulls the oceans, "
     "so the tides rise and fall twice a day.", "metadata": {"year": 2001, "topic": "sea"}},
    {"id": "ferries", "title": "Ferries", "text": "Ferries cross the harbour every hour.",
     "metadata": {"year": 2005, "topic": "sea"}},
    {"id": "hybrid", "text": "Hybrid retrieval fuses BM25 and dense rankings.",
     "metadata": {"year": 2010, "topic": "ir"}},
    {"id": "xss", "title": XSS, "text": f"An image tag {XSS} in a document is shown as text.",
     "metadata": {"year": 2020, "topic": XSS}},
]


@dataclass(frozen=True)
class Live:
    """The session's server: its URL, the admin key, and the reports folder."""

    url: str
    key: str
    reports: Path


# pytest-playwright's Playwright, browser type and browser are session-scoped: its sync API keeps an
# event loop running in the worker's main thread until the session ends, and every later test file
# of that worker that calls asyncio.run() fails ("cannot be called from a running event loop").
# Here they live for this module only and are stopped after it.
@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    """Playwright for this module's tests; stopped (its event loop closed) after them."""
    pw = sync_playwright().start()
    yield pw
    pw.stop()


@pytest.fixture(scope="module")
def browser_type(playwright: Playwright, browser_name: str) -> BrowserType:
    """The browser type pytest-playwright names (chromium)."""
    return getattr(playwright, browser_name)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def browser_context_args() -> dict[str, Any]:
    """New pages' options: none (no device emulation, base URL or video in these tests)."""
    return {}


@pytest.fixture(scope="module")
def browser(browser_type: BrowserType, browser_type_launch_args: dict[str, Any]) -> Iterator[Browser]:
    """One Chromium for this module's tests."""
    launched = browser_type.launch(**browser_type_launch_args)
    yield launched
    launched.close()


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    """pytest-playwright's launch arguments with the Debian Chromium (Playwright downloads no browser)."""
    return {**browser_type_launch_args, "executable_path": chromium_path(), "args": ["--no-sandbox"]}


def _report(reports: Path) -> None:
    """One run folder as ``quarry eval --out`` writes it (summary.json, report.md, report.html, a plot)."""
    run = reports / "scifact-bm25"
    run.mkdir(parents=True)
    modes = {m: {"ndcg@10": n, "recall@10": 0.8, "recall@100": 0.95, "mrr@10": 0.62,
                 "latency_ms": {"p50": 1.5, "p95": 3.0}, "num_queries": 300}
             for m, n in (("bm25", 0.6651), ("hybrid", 0.7013))}
    config = {"dataset": "scifact", "collection": "eval_scifact", "started_at": "2026-12-06T03:00:00+00:00"}
    summary = {"config": config, "modes": modes}
    (run / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    markdown = "# SciFact\n\n| mode | nDCG@10 |\n|---|---|\n| hybrid | 0.7013 |\n"
    (run / "report.md").write_text(markdown, encoding="utf-8")
    (run / "report.html").write_text("<!doctype html><title>r</title><p>SciFact</p>", encoding="utf-8")
    png = (REPO / "docs" / "scifact-quality.png").read_bytes()
    (run / "quality.png").write_bytes(png)
    (reports / "not-a-run").mkdir()  # no summary.json: not listed


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    data = tmp_path_factory.mktemp("console")
    reports = data / "reports"
    _report(reports)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("QUARRY_") or k.endswith("CACHE_DIR")},
           "QUARRY_DATA_DIR": str(data), "PYTHONPATH": str(REPO), "QUARRY_INGEST__BATCH_SIZE": "16",
           "QUARRY_EVAL__REPORTS_DIR": str(reports), "QUARRY_LLM__URL": LLM_URL,
           "QUARRY_LLM__FIRST_TOKEN_TIMEOUT_S": "300", "QUARRY_LLM__STALL_TIMEOUT_S": "60",
           "QUARRY_LLM__TOTAL_TIMEOUT_S": "600", "QUARRY_MONITOR__SAMPLE_RATE": "1.0"}
    key = subprocess.run(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "quarry.cli", "keys", "create", "--scopes", "read,write,admin"], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout.strip()
    with QuarryServer(env, log=data / "server.log", cwd=REPO).wait_ready() as server:
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=120) as client:
            client.post("/v1/collections", json={"name": "notes", "language": "en"}).raise_for_status()
            client.post("/v1/collections/notes/documents", json={"documents": DOCS}).raise_for_status()
            client.post("/v1/collections", json={"name": "uploads", "language": "en"}).raise_for_status()
        yield Live(server.url, key, reports)


@pytest.fixture
def console(page: Page, live: Live, output_path: str, request: pytest.FixtureRequest) -> Iterator[Page]:
    """The console with the key entered; each page screenshotted into the test's output folder if the test failed."""
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(f"{live.url}/console")
    page.fill("#key", live.key)
    page.click("#key-form button[type=submit]")
    expect(page.locator("#key-state")).to_contain_text("key accepted")
    yield page
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        folder = Path(output_path)  # pytest-playwright's folder of this test (under --output)
        folder.mkdir(parents=True, exist_ok=True)
        for view in VIEWS:
            page.goto(f"{live.url}/console#{view}")
            page.wait_for_timeout(300)
            page.screenshot(path=str(folder / f"{view}.png"), full_page=True)
    assert not [e for e in errors if "Content Security Policy" in e], errors


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the item (the ``console`` fixture screenshots a failed test)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)
