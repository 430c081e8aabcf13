"""The web console in a real browser (the Debian Chromium, Playwright): key, search, answer, jobs, recall, reports.

Each test opens ``/console`` on the session's server (``conftest.live``), enters the key once and
uses the page as a person would. The checks that are not about the browser (CSP, the reports
route's path checks) talk HTTP directly.
"""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.console.conftest import XSS, Live

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]  # the answers: llama.cpp


def test_the_key_is_kept_in_session_storage_and_sent_as_a_header(console: Page, live: Live) -> None:
    sent: list[dict[str, str]] = []
    console.on("request", lambda r: sent.append(r.headers) if "/v1/" in r.url else None)
    assert console.evaluate("sessionStorage.getItem('quarry.key')") == live.key
    assert console.evaluate("document.cookie") == "" and live.key not in console.url
    console.reload()  # the tab keeps it: nothing to enter again
    expect(console.locator("#collections-table tr[data-collection=notes]")).to_be_visible()
    assert sent and all(h.get("authorization") == f"Bearer {live.key}" for h in sent)
    expect(console.locator("#collections-table tr[data-collection=notes]")).to_contain_text("v1")


def test_without_a_key_the_console_shows_the_401_and_no_data(page: Page, live: Live) -> None:
    page.goto(f"{live.url}/console")
    expect(page.locator("#key-state")).to_contain_text("Unauthenticated")
    expect(page.locator("#status")).to_contain_text("enter an API key")
    assert page.locator("#collections-table tbody tr").count() == 0
    page.fill("#key", "qk_0000_wrong")
    page.click("#key-form button[type=submit]")
    expect(page.locator("#key-state")).to_contain_text("Unauthenticated")


def test_search_shows_hits_with_each_channels_explain_and_text_as_text(console: Page) -> None:
    console.click("nav a[data-view=search]")
    console.select_option("#search-collection", "notes")
    console.fill("#search-query", "why do the tides rise and fall")
    console.select_option("#fusion-method", "weighted")
    console.fill("#fusion-bm25", "0.7")
    console.fill("#fusion-dense", "0.3")
    console.fill("#search-top-k", "3")
    console.click("#search-form button[type=submit]")
    hits = console.locator("#search-results li.hit")
    expect(hits.first).to_contain_text("tides")
    first = hits.first.locator("table.explain")
    expect(first.locator("tr", has_text="bm25")).to_contain_text("1")
    expect(first.locator("tr", has_text="dense")).to_be_visible()
    fused = "fusion weighted (normalization minmax; weights bm25 0.7, dense 0.3)"
    expect(hits.first.locator("p.fusion")).to_contain_text(fused)
    shot = os.environ.get("QUARRY_TEST_CONSOLE_SCREENSHOT")  # the README's picture: docs/img/console.png
    if shot:
        console.set_viewport_size({"width": 1200, "height": 900})
        console.screenshot(path=shot)
    # the document holding an <img onerror> is shown as text; no element is made of it, no script ran
    console.fill("#search-query", "image tag document")
    console.click("#search-form button[type=submit]")
    expect(console.locator("#search-results")).to_contain_text(XSS)
    assert console.locator("#search-results img").count() == 0
    assert console.evaluate("window.__xss") is None
    console.fill("#search-filters", '{"topic": "ir"}')
    console.click("#search-form button[type=submit]")
    expect(console.locator("#search-results li.hit")).to_have_count(1)
    expect(console.locator("#search-results li.hit")).to_contain_text("hybrid")


QUESTIONS = ("What do tides follow?", "Why do the tides rise and fall?", "How often do ferries cross the harbour?")


def _answer(page: Page, question: str) -> list[tuple[str, str]]:
    """Ask ``question``; the (state, answer text) pairs seen every ~30 ms until the stream ended."""
    page.fill("#answer-query", question)
    page.click("#answer-form button[type=submit]")
    seen: list[tuple[str, str]] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = page.locator("#answer-state").inner_text()
        seen.append((state, page.locator("#answer-text").inner_text()))
        if state.startswith(("done", "error", "failed")):
            break
        page.wait_for_timeout(30)
    return seen


def test_an_answer_streams_with_citations_linked_to_the_highlighted_passage(console: Page) -> None:
    console.click("nav a[data-view=answer]")
    console.select_option("#answer-collection", "notes")
    console.select_option("#answer-mode", "bm25")
    console.fill("#answer-max-tokens", "48")
    for question in QUESTIONS:  # the 135M-parameter model cites in some answers only
        seen = _answer(console, question)
        assert seen[-1][0].startswith("done"), seen[-1]
        # streamed: text was on the page while the state still said "generating", then more of it
        partial = [text for state, text in seen if state.endswith("generating…") and text]
        assert partial and len(partial[0]) < len(seen[-1][1]), seen
        if console.locator("#answer-text a.cite").count():
            break
    cite = console.locator("#answer-text a.cite").first
    expect(cite).to_be_visible()
    number = cite.get_attribute("data-source")
    cite.click()
    source = console.locator(f"#source-{number}")
    expect(source).to_have_class("cited")
    expect(source.locator("mark")).to_be_visible()
    quote = console.locator("#citations li q").first.inner_text()
    assert source.locator("mark").inner_text() in (quote, source.locator(".text").inner_text())


def _ndjson(count: int, prefix: str) -> bytes:
    lines = [json.dumps({"id": f"{prefix}{i}", "text": f"Document {i} of the {prefix} upload: the harbour "
                         f"ferry timetable, route {i % 17}, notes on tides and weather {i}."}) for i in range(count)]
    return ("\n".join(lines) + "\n").encode()


def test_an_ingestion_job_shows_its_progress_move_and_one_is_cancelled(console: Page) -> None:
    console.click("nav a[data-view=jobs]")
    console.select_option("#job-collection", "uploads")
    console.set_input_files("#job-file", files=[{"name": "a.jsonl", "mimeType": "application/x-ndjson",
                                                 "buffer": _ndjson(320, "a")}])
    console.click("#job-form button[type=submit]")
    row = console.locator("#jobs-table tr[data-job]").first
    expect(row).to_be_visible()
    seen: list[str] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        text, state = row.locator(".progress-text").inner_text().strip(), row.get_attribute("data-state")
        if not seen or seen[-1] != text:
            seen.append(text)
        if state not in ("queued", "running"):
            break
        console.wait_for_timeout(50)
    assert row.get_attribute("data-state") == "done", seen
    done = [int(t.split("/")[0]) for t in seen]
    assert seen[-1] == "320 / 320" and any(0 < d < 320 for d in done), seen  # it moved, and ended whole

    console.set_input_files("#job-file", files=[{"name": "b.jsonl", "mimeType": "application/x-ndjson",
                                                 "buffer": _ndjson(2000, "b")}])
    console.click("#job-form button[type=submit]")
    second = console.locator("#jobs-table tr[data-job]").first
    expect(second.locator("button.cancel")).to_be_visible()
    second.locator("button.cancel").click()
    expect(second).to_have_attribute("data-state", "cancelled", timeout=30_000)


def test_recall_figures_of_a_collection(console: Page, live: Live) -> None:
    with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {live.key}"}) as client:
        for query in ("moon", "harbour ferries", "dense rankings"):
            client.post("/v1/collections/notes/search", json={"query": query, "mode": "dense"}).raise_for_status()
    console.click("nav a[data-view=recall]")
    console.select_option("#recall-collection", "notes")
    row = console.locator("#recall-table tbody tr", has_text="none")
    expect(row).to_be_visible()
    expect(row.locator("td").first).not_to_have_text("0", timeout=20_000)  # samples measured (refreshed every 5 s)
    expect(console.locator("#recall-summary")).to_contain_text("measured")
    expect(console.locator("#recall-table svg.spark").first).to_be_visible()


def test_a_report_is_listed_and_opened(console: Page) -> None:
    console.click("nav a[data-view=reports]")
    row = console.locator("#reports-table tr[data-report=scifact-bm25]")
    expect(row).to_contain_text("hybrid 0.7013")
    assert console.locator("#reports-table tr[data-report=not-a-run]").count() == 0
    row.locator("button.open").click()
    expect(console.locator("#report-means tr", has_text="hybrid")).to_contain_text("0.7013")
    expect(console.locator("#report-md")).to_contain_text("# SciFact")
    plot = console.locator("#report-plots img")
    expect(plot).to_have_count(1)
    console.wait_for_function("document.querySelector('#report-plots img').naturalWidth > 0")
    with console.expect_download() as download:
        console.click("#report-download")
    assert download.value.suggested_filename == "scifact-bm25-report.html"


def test_the_console_is_served_offline_under_a_strict_policy(live: Live) -> None:
    with httpx.Client(base_url=live.url) as client:
        for path in ("/console", "/console/console.js", "/console/console.css"):
            r = client.get(path)  # open: the files hold no data
            assert r.status_code == 200
            csp = r.headers["content-security-policy"]
            assert "script-src 'self';" in csp and "unsafe-inline" not in csp and "default-src 'none'" in csp
            assert r.headers["x-content-type-options"] == "nosniff"
        page = client.get("/console").text
        assert "<script>" not in page and " style=" not in page and "http" not in page.replace("http-equiv", "")
        assert client.get("/v1/reports").status_code == 401  # the data needs the key


def test_the_reports_routes_serve_only_run_folders_and_their_listed_files(live: Live) -> None:
    (live.reports / "escape").symlink_to(live.reports.parent, target_is_directory=True)  # a link out of the folder
    (live.reports.parent / "summary.json").write_text("{}")
    broken = live.reports / "broken.run"  # a summary that is not what quarry eval writes: listed, no 5xx
    broken.mkdir()
    (broken / "summary.json").write_text('{"config": [1], "modes": {"bm25": {"ndcg@10": "high"}}}')
    headers = {"Authorization": f"Bearer {live.key}"}
    with httpx.Client(base_url=live.url, headers=headers) as client:
        listed = client.get("/v1/reports").json()
        assert sorted(r["id"] for r in listed["reports"]) == ["broken.run", "scifact-bm25"]
        opened = client.get("/v1/reports/broken.run")
        assert opened.status_code == 200 and opened.json()["ndcg@10"] == {"bm25": None}, opened.text
        for path in ("/v1/reports/..", "/v1/reports/.hidden", "/v1/reports/a%2F..%2F..",
                     "/v1/reports/scifact-bm25/..%2F..%2Fserver.log", "/v1/reports/scifact-bm25/per_query.json",
                     "/v1/reports/escape", "/v1/reports/escape/summary.json", "/v1/reports/nope"):
            r = client.get(path)
            assert r.status_code in (400, 404), (path, r.status_code, r.text)
            assert r.json()["error"]["type"] in ("InvalidRequest", "NotFound"), path
        html = client.get("/v1/reports/scifact-bm25/report.html")
        assert html.status_code == 200 and html.headers["content-disposition"].startswith("attachment")
        assert html.headers["content-security-policy"].startswith("sandbox")
        assert client.get("/v1/reports/scifact-bm25/quality.png").headers["content-type"] == "image/png"
