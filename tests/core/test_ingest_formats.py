"""Issue 23: PDF, HTML and DOCX files ingested for real (fixtures made here with fpdf2 and python-docx),
the folder report (files skipped with their reason, other formats named), ``--json`` and exit codes,
``--prune``/``--dry-run``, front matter and JSONL extra fields, and a signal mid-run.

Everything runs on the real Milvus Lite and the packaged MiniLM: in this process through the CLI
runner of ``test_cli`` (the session's cached MiniLM), and as ``python -m quarry.cli`` child
processes where an exit code or a signal is what is tested.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from indexing.chunking import chunk_sections
from indexing.document_rules import SourceDocument, parse_document
from indexing.sources import Source
from quarry.errors import InvalidDocument
from quarry.service import Quarry
from quarry.settings import Settings
from tests.core import test_cli
from tests.core.conftest import write_jsonl
from tests.core.test_cli import Runner, _quarry
from tests.embedding_cache import CachedEmbedder

fpdf = pytest.importorskip("fpdf")
docx = pytest.importorskip("docx")

@pytest.fixture()
def quarry_cli(minilm_vectors: CachedEmbedder) -> Iterator[Runner]:
    """``test_cli``'s in-process runner (the session's MiniLM, settings read afresh per run)."""
    yield from test_cli.quarry_cli.__wrapped__(minilm_vectors)


PAGES = ["basalt lava flows", "pyroclastic ash clouds", "caldera collapse"]


def make_sources(folder: Path) -> Path:
    """A 3-page PDF, an HTML article inside navigation and a footer, a DOCX with two headings,
    a Markdown file with front matter, a damaged PDF, a Latin-1 text file and a PNG."""
    folder.mkdir(parents=True, exist_ok=True)
    pdf = fpdf.FPDF()
    pdf.set_title("Volcano field guide")
    pdf.set_font("Helvetica", size=12)
    for n, topic in enumerate(PAGES, start=1):
        pdf.add_page()
        words = " ".join(f"{topic.split()[0]}{i}" for i in range(60))
        pdf.multi_cell(0, 8, f"Page {n} is about {topic}. {words}")
    pdf.output(str(folder / "guide.pdf"))
    (folder / "article.html").write_text(
        "<html><head><title>Otters of the Pacific</title></head><body><nav><ul><li><a href='/'>Home</a></li>"
        "<li><a href='/shop'>Shop cheap sunglasses</a></li><li><a href='/login'>Login</a></li></ul></nav>"
        "<article><h1>Otters of the Pacific</h1><p>Sea otters float on their backs in kelp forests and use "
        "stones to crack open sea urchins, a rare case of tool use among marine mammals.</p><p>They have the "
        "densest fur of any animal, up to a million hairs per square inch, which keeps them warm without "
        "blubber in the cold coastal waters.</p></article><footer>Copyright 2026 Wildlife Site. Subscribe to "
        "our newsletter. Privacy policy.</footer></body></html>",
        encoding="utf-8",
    )
    document = docx.Document()
    document.core_properties.title = "Bread handbook"
    document.add_heading("Sourdough starter", level=1)
    document.add_paragraph("Feed the starter flour and water every day until it doubles in size.")
    document.add_heading("Baking the loaf", level=1)
    document.add_paragraph("Bake at high heat in a covered pot so that the crust blisters.")
    document.save(str(folder / "bread.docx"))
    (folder / "notes.md").write_text(
        "---\ntitle: Field notes\nauthor: Ada\nyear: 2024\ndate: 2024-05-01\ntags: [geology, trip]\n---\n"
        "# Notes\nWe saw obsidian near the crater.\n",
        encoding="utf-8",
    )
    (folder / "broken.pdf").write_bytes(b"%PDF-1.7\n1 0 obj << /Type /Catalog >> truncated \x00\x01")
    (folder / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    (folder / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    return folder


def test_chunks_never_cross_a_section_boundary() -> None:
    text = "one two three four five\n\nsix seven eight"
    out = chunk_sections(text, [0, 25], size=3, overlap=1)
    assert [(s, c.text) for s, c in out] == [
        (0, "one two three"), (0, "three four five"), (1, "six seven eight"),
    ]
    assert [c.position for _, c in out] == [0, 1, 2]
    assert all(text[c.start : c.end] == c.text for _, c in out)


def test_a_folder_of_formats_is_read_with_pages_sections_and_a_report(tmp_path: Path) -> None:
    source = Source(make_sources(tmp_path / "src"))
    docs = {d.id: d for d in source}
    assert sorted(docs) == ["article.html", "bread.docx", "guide.pdf", "notes.md"]
    pdf = docs["guide.pdf"]
    assert pdf.title == "Volcano field guide"
    assert [s.metadata for s in pdf.sections] == [{"page": 1}, {"page": 2}, {"page": 3}]
    bounds = [*(s.start for s in pdf.sections), len(pdf.text)]
    for n, topic in enumerate(PAGES):
        assert topic in pdf.text[bounds[n] : bounds[n + 1]]
    html = docs["article.html"]
    assert html.title == "Otters of the Pacific" and "densest fur" in html.text
    assert not any(w in html.text for w in ("sunglasses", "Login", "newsletter", "Privacy"))
    word = docs["bread.docx"]
    assert word.title == "Bread handbook"
    assert [s.metadata for s in word.sections] == [{"section": "Sourdough starter"}, {"section": "Baking the loaf"}]
    notes = docs["notes.md"]
    assert notes.title == "Field notes" and notes.text.startswith("# Notes")
    assert notes.metadata == {
        "author": "Ada", "year": 2024, "date": "2024-05-01", "tags": ["geology", "trip"],
        "source": "notes.md", "format": "md",
    }
    report = source.report
    assert report.read == 4 and report.not_read == ["photo.png"]
    reasons = dict(report.errors)
    assert set(reasons) == {str(tmp_path / "src" / "broken.pdf"), str(tmp_path / "src" / "latin1.txt")}
    assert "not a readable PDF" in reasons[str(tmp_path / "src" / "broken.pdf")]
    assert "not valid UTF-8" in reasons[str(tmp_path / "src" / "latin1.txt")]


def test_fail_mode_stops_at_the_file_that_cannot_be_parsed(tmp_path: Path) -> None:
    source = Source(make_sources(tmp_path / "src"), on_error="fail")
    with pytest.raises(InvalidDocument, match="broken.pdf: not a readable PDF"):
        list(source)


def test_jsonl_fields_beyond_the_document_ones_are_kept_as_metadata() -> None:
    doc = parse_document({"id": "a", "text": "t", "url": "https://x", "year": 2020, "metadata": {"lang": "en"}})
    assert doc.metadata == {"lang": "en", "url": "https://x", "year": 2020}
    with pytest.raises(InvalidDocument, match="'year' is both a top-level field and in 'metadata'"):
        parse_document({"id": "a", "text": "t", "year": 1, "metadata": {"year": 2}})
    with pytest.raises(InvalidDocument, match="field 'extra' must be a string"):
        parse_document({"id": "a", "text": "t", "extra": {"nested": 1}})  # reported, not dropped


def test_formats_ingest_for_real_with_pages_in_chunk_metadata(tmp_path: Path, quarry_cli: Runner) -> None:
    src = make_sources(tmp_path / "src")
    data = tmp_path / "data"
    done = quarry_cli(["ingest", str(src), "-c", "fmt", "--chunk-size", "40", "--chunk-overlap", "8"], data)
    assert done.returncode == 4, done.stderr  # partial: two files skipped
    said = " ".join(done.stderr.split())
    assert f"skipped {src / 'broken.pdf'}: not a readable PDF" in said
    assert f"skipped {src / 'latin1.txt'}: not valid UTF-8" in said
    assert "not read (1 files of other formats): photo.png" in said
    assert "4 added" in done.stdout and "2 files skipped" in " ".join(done.stdout.split())
    quarry = Quarry(Settings(data_dir=data))
    try:
        store = quarry.docstore
        owned = store.chunk_ids_of("fmt", ["guide.pdf", "bread.docx"])
        pdf_chunks = sorted(store.get_chunks("fmt", owned["guide.pdf"]).values(), key=lambda c: c.position)
        assert len(pdf_chunks) > 3  # the pages are longer than one chunk
        assert {c.payload["page"] for c in pdf_chunks} == {1, 2, 3}
        for chunk in pdf_chunks:  # within one page: its words all come from the page's topic
            topic = PAGES[int(chunk.payload["page"]) - 1].split()[0]
            other = [p.split()[0] for p in PAGES if not p.startswith(topic)]
            assert not any(o in chunk.text for o in other), chunk.text
        sections = [c.payload.get("section") for c in store.get_chunks("fmt", owned["bread.docx"]).values()]
        assert sorted(sections) == ["Baking the loaf", "Sourdough starter"]
        hits = quarry.search("fmt", "caldera collapse", top_k=1, mode="bm25").hits
        assert hits[0].document_id == "guide.pdf" and hits[0].metadata["page"] == 3
    finally:
        quarry.close()


def test_ingest_json_names_the_bad_file_with_the_documented_exit_code(tmp_path: Path) -> None:
    """Acceptance 3, as a scheduler runs it: a child process, stdout parsed line by line."""
    src = tmp_path / "src"
    src.mkdir()
    write_jsonl(src / "ignored.jsonl", [])
    (src / "a.txt").write_text("granite is an igneous rock", encoding="utf-8")
    (src / "b.md").write_text("marble is a metamorphic rock", encoding="utf-8")
    (src / "bad.txt").write_bytes(b"\xff\xfe not text")
    name = "rocks_in_a_collection_named_to_make_the_log_line_long_enough"  # the line: > 80 columns
    done = _quarry(["ingest", str(src), "-c", name, "--json"], tmp_path / "data")
    assert done.returncode == 4, done.stderr
    log = re.compile(rf"^\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ ingest {name}: 3/3 documents, [\d.,]+ docs/s, ETA \S+$")
    assert any(log.match(line) for line in done.stderr.splitlines()), done.stderr  # timestamped, one line
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["event"] for e in events][-1] == "report"
    assert all(e["event"] == "progress" for e in events[:-1]) and events[-2]["done"] == events[-2]["total"] == 3
    report = events[-1]
    assert report["status"] == "partial" and report["exit_code"] == 4
    assert report["errors"] == [{"path": str(src / "bad.txt"), "reason": "not valid UTF-8 text: byte 0xff at byte 0"}]
    assert report["not_read"] == ["ignored.jsonl"]
    assert (report["read"], report["skipped"], report["written"], report["kept"]) == (2, 1, 2, 2)
    assert report["embedded"] == 2
    help_text = _quarry(["ingest", "--help"], tmp_path / "data").stdout
    assert "4 partial run" in " ".join(help_text.split()) and "3 a dependency is unavailable" in " ".join(
        help_text.split()
    )
    failed = _quarry(["ingest", str(src), "-c", "rocks2", "--json"], tmp_path / "data", QUARRY_INGEST__ON_ERROR="fail")
    assert failed.returncode == 2, failed.stderr
    error = json.loads(failed.stdout.splitlines()[-1])
    assert error["event"] == "error" and error["type"] == "InvalidDocument" and "bad.txt" in error["message"]


def test_prune_and_dry_run(tmp_path: Path, quarry_cli: Runner) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a", "b", "c"):
        (src / f"{name}.txt").write_text(f"document {name} about rivers", encoding="utf-8")
    data = tmp_path / "data"
    assert quarry_cli(["ingest", str(src), "-c", "p"], data).returncode == 0
    (src / "b.txt").unlink()
    (src / "c.txt").write_bytes(b"\xff broken now")  # a file that fails to parse keeps its document
    dry = quarry_cli(["ingest", str(src), "-c", "p", "--prune", "--dry-run", "--json"], data)
    report = json.loads(dry.stdout.splitlines()[-1])
    assert report["dry_run"] and report["would_prune"] == ["b.txt"] and report["would_unchanged"] == 1
    assert dry.returncode == 4  # c.txt skipped
    listed = quarry_cli(["docs", "list", "-c", "p", "--json"], data)
    assert [d["id"] for d in json.loads(listed.stdout)["documents"]] == ["a.txt", "b.txt", "c.txt"]
    pruned = quarry_cli(["ingest", str(src), "-c", "p", "--prune", "--json"], data)
    report = json.loads(pruned.stdout.splitlines()[-1])
    assert report["pruned"] == 1 and report["unchanged"] == 1  # a count, as a server job's (the ids: the plain output)
    listed = quarry_cli(["docs", "list", "-c", "p", "--json"], data)
    assert [d["id"] for d in json.loads(listed.stdout)["documents"]] == ["a.txt", "c.txt"]
    got = quarry_cli(["docs", "get", "a.txt", "-c", "p", "--json"], data)
    doc = json.loads(got.stdout)
    assert doc["id"] == "a.txt" and doc["text"] == "document a about rivers"
    assert doc["metadata"] == {"source": "a.txt", "format": "txt"}
    missing = quarry_cli(["docs", "get", "b.txt", "-c", "p"], data)
    assert missing.returncode == 2 and "b.txt" in missing.stderr


def test_sigterm_finishes_the_batch_in_flight_and_says_what_was_kept(tmp_path: Path) -> None:
    """A real signal to a real ``quarry ingest``: the batch in flight is written whole, then it stops."""
    docs = [{"id": f"d{i:04d}", "text": f"note {i} on tides and moons and seasons"} for i in range(600)]
    corpus = write_jsonl(tmp_path / "many.jsonl", docs)
    env = {**os.environ, "QUARRY_DATA_DIR": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1",
           "QUARRY_INGEST__BATCH_SIZE": "20"}
    child = subprocess.Popen(
        [sys.executable, "-m", "quarry.cli", "ingest", str(corpus), "-c", "tides", "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert child.stdout is not None
    first = json.loads(child.stdout.readline())  # the first batch is written
    assert first["event"] == "progress" and first["done"] == 20
    child.send_signal(signal.SIGTERM)
    rest, stderr = child.communicate(timeout=600)
    assert child.returncode == 130, stderr
    report = json.loads(rest.splitlines()[-1])
    assert report["status"] == "interrupted" and report["signals"] == ["SIGTERM"]
    assert not report["abandoned_batch"]
    kept = report["kept"]
    assert 20 <= kept < 600 and kept % 20 == 0  # whole batches only
    quarry = Quarry(Settings(data_dir=tmp_path / "data"))
    try:
        assert quarry.docstore.counts("tides")[0] == kept
        assert quarry.store.count("tides") == kept  # one chunk each, in both places
    finally:
        quarry.close()


def test_source_document_sections_change_the_hash() -> None:
    from indexing.collections import CollectionConfig
    from indexing.document_plan import document_hash
    from indexing.formats import Section

    cfg = CollectionConfig(name="c", dim=384, embedding_model="m", chunk_size=256, chunk_overlap=32)
    plain = SourceDocument("a", "x y", "t")
    paged = SourceDocument("a", "x y", "t", sections=(Section(0, {"page": 1}), Section(2, {"page": 2})))
    assert document_hash(plain, cfg) != document_hash(paged, cfg)


def test_documents_listed_and_fetched_over_rest(service: Quarry, collection: str, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from quarry.api import create_app

    source = Source(make_sources(tmp_path / "src"))
    service.upsert_stream(collection, source)
    with TestClient(create_app(service)) as client:
        first = client.get(f"/v1/collections/{collection}/documents", params={"limit": 3})
        assert first.status_code == 200, first.text
        page = first.json()
        assert [d["id"] for d in page["documents"]] == ["article.html", "bread.docx", "guide.pdf"]
        assert page["next_cursor"] == "guide.pdf"
        second = client.get(f"/v1/collections/{collection}/documents", params={"cursor": page["next_cursor"]}).json()
        assert [d["id"] for d in second["documents"]] == ["notes.md"] and second["next_cursor"] is None
        guide = client.get(f"/v1/collections/{collection}/documents/guide.pdf").json()
        assert guide["metadata"] == {"source": "guide.pdf", "format": "pdf"}
        assert [c["metadata"]["page"] for c in guide["chunks"]] == [1, 2, 3]
        assert len(source.report.errors) == 2  # the damaged PDF and the Latin-1 file were not stored
        assert all(topic in guide["text"] for topic in PAGES)
        missing = client.get(f"/v1/collections/{collection}/documents/broken.pdf")
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFound"
        unknown = client.get("/v1/collections/nope_nope/documents")
        assert unknown.status_code == 404


def test_a_document_text_is_rebuilt_without_the_chunk_overlap(service: Quarry, collection: str) -> None:
    text = " ".join(f"w{i}" for i in range(700))  # the collection chunks 256 tokens with 32 shared
    service.upsert(collection, [SourceDocument("long", text, "T")])
    doc = service.get_document(collection, "long")
    assert len(doc["chunks"]) == 3 and doc["text"] == text


def test_an_unavailable_store_is_the_retryable_exit_code(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "docs.jsonl", [{"id": "a", "text": "basalt"}])
    done = _quarry(["ingest", str(corpus), "-c", "c", "--json"], tmp_path / "data",
                   QUARRY_STORE__URL="milvus://127.0.0.1:1")  # nothing listens on port 1
    assert done.returncode == 3, done.stderr
    error = json.loads(done.stdout.splitlines()[-1])
    assert error["type"] == "StoreUnavailable" and error["retryable"] is True and error["exit_code"] == 3


def test_a_second_signal_abandons_the_batch_in_flight_and_rolls_it_back(tmp_path: Path) -> None:
    # Batches of 2,000: each takes seconds to embed even on a fast machine (a CI run embedded 200
    # in 0.5 s, and both signals came after that batch was committed).
    docs = [{"id": f"d{i:05d}", "text": f"entry {i} about glaciers, fjords and moraines"} for i in range(8000)]
    corpus = write_jsonl(tmp_path / "many.jsonl", docs)
    # The torch encoder: the ONNX int8 default, several times faster, may finish such a batch
    # before the second signal (0.5 s in) on a fast machine.
    env = {**os.environ, "QUARRY_DATA_DIR": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1",
           "QUARRY_INGEST__BATCH_SIZE": "2000", "QUARRY_EMBEDDING__URL": "torch://all-MiniLM-L6-v2"}
    child = subprocess.Popen(
        [sys.executable, "-m", "quarry.cli", "ingest", str(corpus), "-c", "ice", "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert child.stdout is not None
    assert json.loads(child.stdout.readline())["done"] == 2000
    time.sleep(0.2)  # into the next batch of 2,000
    child.send_signal(signal.SIGINT)
    time.sleep(0.3)  # two signals at once are one: the kernel does not queue them
    child.send_signal(signal.SIGINT)  # the batch in flight is abandoned
    rest, stderr = child.communicate(timeout=600)
    assert child.returncode == 130, stderr
    report = json.loads(rest.splitlines()[-1])
    assert report["status"] == "interrupted" and report["signals"] == ["SIGINT", "SIGINT"]
    assert report["abandoned_batch"] and report["kept"] % 2000 == 0 and report["kept"] >= 2000
    quarry = Quarry(Settings(data_dir=tmp_path / "data"))
    try:  # the abandoned batch left nothing behind in either place
        assert quarry.docstore.counts("ice")[0] == report["kept"]
        assert quarry.store.count("ice") == report["kept"]
    finally:
        quarry.close()
