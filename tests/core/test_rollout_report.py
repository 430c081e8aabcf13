"""The A/B report of a rollout (quarry.services.rollout_report, eval.rollout_report): its figures, the
paired test of shadowed queries, the REST route (JSON and HTML), the CLI, and the page rendered offline
in Chromium; and a rollout asked for a model URL the server cannot open is a 400, not a 500.

A real rollout on Milvus Lite (SQLite state) with the packaged MiniLM (its vectors cached per
machine): shadow, then a 50 % canary, every query shadowed; the report is read over REST, through
the CLI (in process, and ``--server`` against a uvicorn server in a thread) and in the browser.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from eval.rollout_report import render_rollout_html, with_paired
from indexing.document_rules import SourceDocument
from indexing.rollout import Figures, Rollout
from quarry.api import create_app
from quarry.cli import rollout as rollout_cli
from quarry.cli.root import app as cli_app
from quarry.service import Quarry
from quarry.services import rollout
from quarry.services.rollout import Pair, Snapshot
from quarry.services.rollout_report import build
from quarry.settings import MonitorSettings, ReindexSettings, Settings
from tests.chromium import chromium_path
from tests.core.conftest import CountingEmbedder

DOCS = 60
SHADOWED = 12  # queries per phase (below the shadow queue's 16: none is skipped)
NAME = "abreport"


@dataclass(frozen=True)
class Reported:
    """The collection, its report as JSON and as HTML, after a shadow phase and a canary phase."""

    name: str
    json: dict[str, Any]
    html: str
    headers: dict[str, str]


@pytest.fixture(scope="module")
def gray(counting: CountingEmbedder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Quarry]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("abreport"), monitor=MonitorSettings(sample_rate=1.0),
                        reindex=ReindexSettings(recall_floor=0.0))
    quarry = Quarry(settings, embedder=counting)
    yield quarry
    quarry.close()


def _pairs(client: TestClient, name: str) -> int:
    got = client.get(f"/v1/collections/{name}/rollout/report", params={"format": "json"})
    return int(got.json()["shadow"]["pairs"])


def _search_all(client: TestClient, name: str, queries: list[str], expect_pairs: int) -> None:
    for i, query in enumerate(queries):
        r = client.post(f"/v1/collections/{name}/search", json={"query": query, "top_k": 10},
                        headers={"api-key": f"qk_{i:012x}_secret"})  # a key per query: the canary routes by it
        assert r.status_code == 200, r.text
    deadline = time.monotonic() + 60
    while _pairs(client, name) < expect_pairs:  # the shadow runs are a background thread's
        assert time.monotonic() < deadline, _pairs(client, name)
        time.sleep(0.05)


@pytest.fixture(scope="module")
def reported(gray: Quarry, scifact_docs: list[SourceDocument]) -> Iterator[Reported]:
    gray.create_collection(NAME)
    gray.upsert(NAME, scifact_docs[:DOCS])
    queries = [d.title for d in scifact_docs[:2 * SHADOWED]]
    with TestClient(create_app(gray)) as client:
        created = client.post(f"/v1/collections/{NAME}/rollout",
                              json={"mode": "shadow", "shadow_rate": 1.0, "schedule": [50, 100],
                                    "step_samples": 10**6})
        assert created.status_code == 201, created.text
        _search_all(client, NAME, queries[:SHADOWED], SHADOWED)
        assert client.post(f"/v1/collections/{NAME}/rollout/step").json()["percent"] == 50.0
        stepped = gray.docstore.get_rollout(NAME)
        assert stepped is not None  # a fixed salt: which keys the canary serves is then a fixed thing
        assert gray.docstore.put_rollout(replace(stepped, salt="abreport"), expect=stepped)
        _search_all(client, NAME, queries[SHADOWED:], 2 * SHADOWED)
        gray.view.space.monitor.drain(timeout_s=30.0)  # the sampled recall of every search
        got = client.get(f"/v1/collections/{NAME}/rollout/report", params={"format": "json"})
        assert got.status_code == 200 and got.headers["content-type"] == "application/json", got.text
        page = client.get(f"/v1/collections/{NAME}/rollout/report")
        assert page.status_code == 200, page.text
        yield Reported(NAME, got.json(), page.text, dict(page.headers))
    rollout.abort(gray.view, NAME)
    gray.drop_collection(NAME)


def test_the_json_report_pairs_every_shadowed_query(reported: Reported) -> None:
    r = reported.json
    assert (r["collection"], r["rollout"]["state"], r["rollout"]["percent"]) == (NAME, "canary", 50.0)
    live, cand = r["versions"]["live"], r["versions"]["candidate"]
    assert (live["version"], cand["version"]) == (1, 2)
    # the canary step's window: every search served by one version, none failed or degraded
    assert live["queries"] + cand["queries"] == SHADOWED and live["queries"] > 0 and cand["queries"] > 0
    assert live["error_rate"] == 0.0 and cand["degraded_rate"] == 0.0
    assert live["p50_ms"] <= live["p95_ms"] <= live["p99_ms"]
    assert live["recall_samples"] >= 1 and cand["recall_samples"] >= 1  # the recall monitor samples every search
    pairs = r["pairs"]
    assert len(pairs) == r["shadow"]["pairs"] == 2 * SHADOWED and r["shadow"]["skipped"] == 0
    assert [p["step"] for p in pairs] == [-1] * SHADOWED + [0] * SHADOWED
    canary = [p for p in pairs if p["step"] == 0]
    assert sum(p["served_by"] == "candidate" for p in canary) == cand["queries"]
    assert all(p["served_by"] == "live" for p in pairs if p["step"] == -1)
    assert all(p["live_ms"] > 0 and p["candidate_ms"] > 0 and p["live_hits"] == 10 for p in pairs)
    # the same model and a copied index: both versions answer alike
    assert r["overlap"]["samples"] == SHADOWED and r["overlap"]["mean"] == pytest.approx(1.0)

    paired = r["paired"]
    assert (paired["a"], paired["b"], paired["n"]) == ("live", "candidate", 2 * SHADOWED)
    rows = {row["metric"]: row for row in paired["rows"]}
    assert set(rows) == {"latency_ms", "hits", "degraded"}
    lat = rows["latency_ms"]
    assert lat["n"] == 2 * SHADOWED and lat["wins"] + lat["losses"] + lat["ties"] == 2 * SHADOWED
    assert lat["mean_a"] == pytest.approx(sum(p["live_ms"] for p in pairs) / len(pairs))
    assert lat["delta"] == pytest.approx(lat["mean_b"] - lat["mean_a"])
    assert 0.0 < lat["p_value"] <= 1.0 and lat["ci_low"] <= lat["delta"] <= lat["ci_high"]
    assert rows["hits"]["delta"] == 0.0 and rows["hits"]["p_value"] == 1.0 and rows["hits"]["ties"] == 2 * SHADOWED
    assert paired["overlap"]["n"] == 2 * SHADOWED and paired["overlap"]["top1_same"] == pytest.approx(1.0)
    assert [d["action"] for d in r["decisions"]] == ["start", "step"]


def test_the_html_report_is_self_contained(reported: Reported) -> None:
    html = reported.html
    assert reported.headers["content-type"].startswith("text/html")
    assert reported.headers["content-security-policy"].startswith("sandbox; default-src 'none'")
    assert not re.search(r"https?://", html) and "<script" not in html and "<link" not in html
    assert not re.search(r"""(src|href)=["'](?!data:|#)""", html)
    for section in ("versions", "paired", "decisions", "gates", "notes"):
        assert f'<section id="{section}">' in html, section
    assert f"{2 * SHADOWED} shadowed queries, each run by both versions" in html


def test_the_report_renders_offline_in_chromium(reported: Reported, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    browser_path = chromium_path()
    page_file = tmp_path / "offline" / "rollout.html"  # alone in its folder: nothing beside it to load
    page_file.parent.mkdir()
    page_file.write_text(reported.html, encoding="utf-8")
    fetched: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
        try:
            context = browser.new_context(offline=True)
            page = context.new_page()
            page.on("request", lambda req: fetched.append(req.url))
            page.goto(page_file.as_uri())
            versions = page.locator("#versions-table tr")
            assert versions.count() == 11  # ... and the thumbs-down and click-through rows
            assert "queries served" in versions.nth(1).inner_text()
            cells = [versions.nth(1).locator("td").nth(i).inner_text() for i in (1, 2)]
            live, cand = reported.json["versions"]["live"], reported.json["versions"]["candidate"]
            assert cells == [str(live["queries"]), str(cand["queries"])]
            paired = page.locator("#paired-table tr")
            assert paired.count() == 4  # the header and latency_ms, hits, degraded
            latency = paired.nth(1).inner_text()
            row = next(r for r in reported.json["paired"]["rows"] if r["metric"] == "latency_ms")
            assert "latency_ms" in latency and f"{row['delta']:+.4f}" in latency and str(2 * SHADOWED) in latency
            summary = page.locator("#paired-summary").inner_text()
            assert "paired randomisation test" in summary and f"{2 * SHADOWED} shadowed queries" in summary
            assert "Top-10 overlap of the pairs: mean 1.0000" in page.locator("#overlap-summary").inner_text()
            assert page.locator("#decisions-table tr").count() == 3
            assert page.locator("h1").inner_text() == f"A/B report: {NAME}"
            shot = page.screenshot(full_page=True)
            assert len(shot) > 10_000
        finally:
            browser.close()
    assert fetched and set(fetched) == {page_file.as_uri()}, fetched  # the page itself, nothing else


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Kept:
    """The test's service for the CLI (``_quarry()``), left open when the command closes it."""

    def __init__(self, inner: Quarry) -> None:
        self.view = inner.view

    def close(self) -> None:
        pass


def test_the_cli_writes_the_report_locally_and_from_a_server(
    reported: Reported, gray: Quarry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner = CliRunner()
    monkeypatch.setattr(rollout_cli, "_quarry", lambda: _Kept(gray))
    out = tmp_path / "local.html"
    done = runner.invoke(cli_app, ["rollout", "report", NAME, "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert "written to" in done.output and "Paired test on the shadowed queries" in out.read_text(encoding="utf-8")
    done = runner.invoke(cli_app, ["rollout", "report", NAME, "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["paired"]["n"] == 2 * SHADOWED

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(gray), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        remote = tmp_path / "remote.json"
        done = runner.invoke(cli_app, ["rollout", "report", NAME, "--json", "--out", str(remote),
                                       "--server", f"http://127.0.0.1:{port}"])
        assert done.exit_code == 0, done.output
        body = json.loads(remote.read_text(encoding="utf-8"))
        assert body["paired"]["n"] == 2 * SHADOWED and body["versions"]["live"]["queries"] is not None
        missing = runner.invoke(cli_app, ["rollout", "report", "nosuch", "--server", f"http://127.0.0.1:{port}"])
        assert missing.exit_code == 2 and "CollectionNotFound" in missing.output, missing.output
    finally:
        server.should_exit = True
        thread.join(60)


def test_no_rollout_is_a_404_and_a_model_url_the_server_cannot_open_a_400(gray: Quarry) -> None:
    name = "abreport_bad"
    gray.create_collection(name)
    gray.upsert(name, [SourceDocument("d1", "bees", "bees make honey")])
    try:
        with TestClient(create_app(gray)) as client:
            missing = client.get(f"/v1/collections/{name}/rollout/report")
            assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFound", missing.text
            gone = client.get("/v1/collections/nosuch/rollout/report", params={"format": "json"})
            assert gone.status_code == 404 and gone.json()["error"]["type"] == "CollectionNotFound"
            assert client.get(f"/v1/collections/{name}/rollout/report", params={"format": "pdf"}).status_code == 422
            for model in ("", "   ", "torch://no-such-org/no-such-model", "nope://some-model"):
                bad = client.post(f"/v1/collections/{name}/rollout", json={"model": model})
                assert bad.status_code == 400, (model, bad.status_code, bad.text)
                error = bad.json()["error"]
                assert error["type"] == "InvalidRequest" and error["retryable"] is False
            assert "supported" in bad.json()["error"]["message"]  # the unknown scheme's message lists them
            # the lease was given back: a good start works
            started = client.post(f"/v1/collections/{name}/rollout", json={"mode": "shadow"})
            assert started.status_code == 201, started.text
            assert client.post(f"/v1/collections/{name}/rollout/abort").status_code == 200
    finally:
        gray.drop_collection(name)


def test_build_and_the_paired_test_on_known_pairs() -> None:
    record = Rollout("c", 2, 1, "canary", 50.0, 0, (50.0, 100.0), shadow_rate=1.0, step_started_at=100.0,
                     decisions=({"at": 90.0, "action": "start", "step": -1, "percent": 0.0, "reason": "built"},))
    live = Figures(queries=4, errors=1, degraded=0, latencies_ms=[10.0, 20.0, 30.0], recall=[1.0, 0.9])
    cand = Figures(queries=2, errors=0, degraded=1, latencies_ms=[12.0, 40.0], recall=[0.8], overlap=[1.0, 0.5, 0.0])
    pairs = tuple(Pair(2, 0, i == 0, live_ms, live_ms + 2.0, 10, 10 - (i == 2), False, False, ov, ov == 1.0)
                  for i, (live_ms, ov) in enumerate(((10.0, 1.0), (20.0, 0.5), (30.0, 0.0))))
    report = build(Snapshot(record, live, cand, pairs, 3, 0), now=200.0)
    assert report["versions"]["live"] == {
        "version": 1, "queries": 4, "errors": 1, "error_rate": 0.25, "degraded_rate": 0.0, "p50_ms": 20.0,
        "p95_ms": 30.0, "p99_ms": 30.0, "recall": pytest.approx(0.95), "recall_samples": 2, "rated": 0, "raters": 0,
        "down_rate": None, "clicked": 0, "click_queries": 0, "click_rate": None}
    assert report["versions"]["candidate"]["degraded_rate"] == 0.5
    assert report["overlap"] == {"mean": 0.5, "samples": 3}
    assert [p["served_by"] for p in report["pairs"]] == ["candidate", "live", "live"]
    paired = with_paired(report)["paired"]
    rows = {r["metric"]: r for r in paired["rows"]}
    # every pair 2 ms slower: the delta is 2.0; exact enumeration of 2**3 sign flips: p = 2/8
    lat = rows["latency_ms"]
    assert (lat["delta"], lat["wins"], lat["losses"]) == (pytest.approx(2.0), 3, 0)
    assert lat["p_value"] == pytest.approx(0.25) and lat["p_ttest"] is None  # constant differences: no t-test
    assert (rows["hits"]["delta"], rows["hits"]["losses"]) == (pytest.approx(-1 / 3), 1)
    assert paired["overlap"] == {"n": 3, "mean": 0.5, "p50": 0.5, "min": 0.0, "below_gate": pytest.approx(2 / 3),
                                 "top1_same": pytest.approx(1 / 3)}
    html = render_rollout_html(report)
    assert "3 shadowed queries" in html and "+2.0000" in html
    # no live figures in this process (a CLI on another replica's state): the page says so
    empty = build(Snapshot(record, None, None, (), 0, 0), now=200.0)
    assert empty["versions"]["live"]["queries"] is None and empty["window"]["measured"] is False
    page = render_rollout_html(empty)
    assert "No shadowed query yet" in page and "this process has served none of it" in page
