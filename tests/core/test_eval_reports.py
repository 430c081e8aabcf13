"""The evaluation report on a real pipeline (Milvus Lite, the packaged MiniLM's vectors, BM25) over a SciFact subset.

The subset: the first 20 judged test queries, the first 300 documents plus those judged for them
(``scifact_docs``). The collection gets an IVF_FLAT index (one probe of 16 lists) for the
ANN-vs-exact section, whose figure is recomputed independently; the HTML report is then opened in
headless Chromium.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eval.ann import ann_vs_exact, collection_ann
from eval.beir import load_split
from eval.runner import collection_search, evaluate
from eval.summary import Summary
from indexing.ann_data import exact_top_k, recall_at_k
from indexing.document_rules import SourceDocument
from indexing.sources import read_documents
from quarry.service import Quarry
from quarry.settings import Settings
from stores.base import IndexSpec
from tests.chromium import chromium_path
from tests.core.conftest import CountingEmbedder

NAME = "scifact_sub"
RESOURCE = re.compile(  # an attribute or CSS that would fetch something from elsewhere
    r"""(?:src|href|action|poster|data)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?(?:https?:)?//|@import""", re.I
)


@pytest.fixture(scope="module")
def subset(tmp_path_factory: pytest.TempPathFactory, shared_data: Path, scifact_docs: list[SourceDocument]) -> Path:
    """A BEIR folder: the ``scifact_docs`` corpus, the first 20 judged test queries and their qrels."""
    src, folder = shared_data / "scifact", tmp_path_factory.mktemp("scifact-sub")
    split = load_split(src, "test")
    qids = list(split.qrels)[:20]
    keep = {d.id for d in scifact_docs}
    with (src / "corpus.jsonl").open(encoding="utf-8") as fh:
        rows = [line for line in fh if json.loads(line)["_id"] in keep]
    (folder / "corpus.jsonl").write_text("".join(rows), encoding="utf-8")
    queries = [json.dumps({"_id": q, "text": split.queries[q]}) for q in qids]
    (folder / "queries.jsonl").write_text("\n".join(queries) + "\n", encoding="utf-8")
    (folder / "qrels").mkdir()
    qrels = [f"{q}\t{d}\t{g}" for q in qids for d, g in split.qrels[q].items()]
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(qrels) + "\n", "utf-8")
    return folder


@pytest.fixture(scope="module")
def quarry(tmp_path_factory: pytest.TempPathFactory, counting: CountingEmbedder, subset: Path) -> Iterator[Quarry]:
    service = Quarry(Settings(data_dir=tmp_path_factory.mktemp("reports")), embedder=counting)
    service.create_collection(NAME, language="auto")
    service.upsert(NAME, read_documents(subset))
    service.store.build_index(NAME, IndexSpec("IVF_FLAT", "cosine", {"nlist": 16}, {"nprobe": 1}))
    yield service
    service.close()


@pytest.fixture(scope="module")
def report(quarry: Quarry, subset: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Summary, Path]:
    out = tmp_path_factory.mktemp("report")
    summary = evaluate(
        collection_search(quarry, NAME), subset, "test", ["bm25", "dense", "hybrid"], out,
        {"embedding_model": quarry.embedder.model_id}, ann=collection_ann(quarry, NAME), show_progress=False,
        references_path=subset.parent.parent / "none.md",
    )
    return summary, out


def test_ann_vs_exact_on_the_collection(report: tuple[Summary, Path], quarry: Quarry) -> None:
    summary, _ = report
    ann = summary.ann_vs_exact
    assert ann is not None and ann["index"]["kind"] == "IVF_FLAT" and ann["queries"] == 20
    assert ann["vectors"] == quarry.describe(NAME)["vectors"] and ann["exact"].startswith("numpy brute force")
    # The figure recomputed another way: indexing.ann_data's brute force and plain recall@k (no near-ties here).
    ids = quarry.docstore.bm25_chunk_ids(NAME)[1]
    records = quarry.store.get(NAME, ids)
    base = np.vstack([r.vector for r in records]).astype(np.float32)
    row_of = {r.id: i for i, r in enumerate(records)}
    vectors = quarry.embedder.embed([summary.queries[q] for q in summary.queries]).vectors
    found = quarry.store.search(NAME, vectors, 100, with_payload=False)
    for k in (10, 100):
        got = np.array([[row_of[h.id] for h in hits[:k]] for hits in found], dtype=np.int64)
        assert ann["recall"][str(k)] == pytest.approx(recall_at_k(got, exact_top_k(base, vectors, k), k), abs=1e-9)
    # Exact against exact: with the index dropped the store scans, and every neighbour is found.
    quarry.store.drop_index(NAME)
    try:
        exact = ann_vs_exact(quarry.store, NAME, ids, list(summary.queries), vectors, "cosine")
        assert exact["index"] is None and exact["recall"] == {"10": 1.0, "100": 1.0} and exact["worst"] == []
    finally:
        quarry.store.build_index(NAME, IndexSpec("IVF_FLAT", "cosine", {"nlist": 16}, {"nprobe": 1}))


def test_per_query_view_and_run_config(report: tuple[Summary, Path]) -> None:
    summary, out = report
    view = json.loads((out / "queries.json").read_text(encoding="utf-8"))
    assert len(view["queries"]) == 20 and view["worst_mode"] == "hybrid"
    per_query = json.loads((out / "per_query.json").read_text(encoding="utf-8"))

    def ndcg(mode: str, qid: str) -> float:
        return float(per_query[mode][qid]["ndcg@10"])

    lost = {q for q in per_query["hybrid"] if ndcg("hybrid", q) < max(ndcg("bm25", q), ndcg("dense", q))}
    assert {item["qid"] for item in view["hybrid_losses"]} == lost
    rows = {row["qid"]: row for row in view["queries"]}
    assert all(rows[q]["text"] == summary.queries[q] for q in rows)
    relevant = [doc for row in view["queries"] for doc in row["relevant"]]
    both = [doc for doc in relevant if {"bm25", "dense"} <= set(doc["channels"])]
    assert both, "the hybrid explain data gives both channel ranks of relevant documents it found"
    for row in view["queries"]:
        for doc in row["relevant"]:
            if doc["ranks"]["bm25"] is not None:  # the bm25 mode's rank is the bm25 channel's rank
                assert doc["channels"]["bm25"] == doc["ranks"]["bm25"], (row["qid"], doc)
    env = summary.config["environment"]
    assert env["quarry_version"] and env["hardware"]["cores"] >= 1 and env["hardware"]["cpu"]
    assert env["git"] is None or re.fullmatch(r"[0-9a-f]{40}", env["git"]["commit"])
    assert "perf_counter_ns" in env["latency_method"] and "1 untimed warm-up" in env["latency_method"]
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "## ANN vs exact search" in md and "## Per query (nDCG@10)" in md and "## Environment" in md


def test_html_report_is_self_contained(report: tuple[Summary, Path]) -> None:
    _, out = report
    html = (out / "report.html").read_text(encoding="utf-8")
    assert not RESOURCE.search(html), RESOURCE.search(html)
    assert not re.search(r"https?://", html)  # no external URL at all in this run's page
    assert html.count('src="data:image/png;base64,') == 2


def _render(browser: str, page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
        "--disable-background-networking", "--disable-component-update", *args, page.as_uri(),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def _text(dom: str, element_id: str) -> str:
    """Text of the element with ``element_id`` up to the end of its section (tags removed)."""
    start = dom.index(f'id="{element_id}"')
    end = dom.find("</section>", start)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom[start:end]))


def test_html_report_renders_offline_in_headless_chromium(report: tuple[Summary, Path], tmp_path: Path) -> None:
    summary, out = report
    browser = chromium_path()
    page = tmp_path / "offline" / "report.html"  # alone in its folder: nothing beside it to load
    page.parent.mkdir()
    shutil.copy(out / "report.html", page)
    done = _render(browser, page, tmp_path / "profile", "--dump-dom")
    assert done.returncode == 0 and "<body" in done.stdout, done.stderr[-2000:]
    dom = done.stdout
    for section in ("modes", "plots", "references", "ann-vs-exact", "per-query", "run-config"):
        assert f'id="{section}"' in dom, section
    ann: dict[str, Any] = summary.ann_vs_exact or {}
    recall = _text(dom, "ann-recall")
    assert "recall@10" in recall and f"{ann['recall']['10']:.4f}" in recall and "IVF_FLAT" in _text(dom, "ann-vs-exact")
    worst = _text(dom, "worst-queries")
    first = min(summary.queries, key=lambda q: (summary.modes["hybrid"].per_query[q]["ndcg@10"], q))
    assert summary.queries[first][:40] in worst
    assert 'id="hybrid-losses"' in dom and 'id="all-queries-table"' in dom
    shot = tmp_path / "shot.png"
    done = _render(browser, page, tmp_path / "profile2", f"--screenshot={shot}", "--window-size=1280,2000")
    assert done.returncode == 0 and shot.stat().st_size > 10_000, done.stderr[-2000:]
