import json
import os
import subprocess
import sys
from pathlib import Path

from tests.core.conftest import write_jsonl


def _quarry(args: list[str], data_dir: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QUARRY_DATA_DIR": str(data_dir), "HF_HUB_OFFLINE": "1", **extra_env}
    return subprocess.run(
        [sys.executable, "-m", "quarry.cli", *args], env=env, capture_output=True, text=True, timeout=600
    )


def test_cli_ingest_search_and_bad_line(tmp_path: Path) -> None:
    docs = [
        {"id": f"d{i}", "title": f"title {i}", "text": t, "metadata": {"year": 2000 + i}}
        for i, t in enumerate(
            [
                "the mitochondria is the powerhouse of the cell",
                "jupiter is a gas giant planet",
                "熊猫主要生活在四川的山区",
            ]
        )
    ]
    corpus = write_jsonl(tmp_path / "docs.jsonl", docs)
    data = tmp_path / "data"
    first = _quarry(["ingest", str(corpus), "--collection", "demo"], data)
    assert first.returncode == 0, first.stderr
    assert "3 added" in first.stdout and "exceed" not in first.stdout
    again = _quarry(["ingest", str(corpus), "--collection", "demo", "--chunk-size", "50", "--language", "auto"], data)
    assert "3 unchanged; 0 chunks embedded" in " ".join(again.stdout.split())
    note = " ".join(again.stderr.split())
    assert "exists with chunk_size=256; --chunk-size applies to a new collection only" in note
    found = _quarry(["search", "gas giant", "--collection", "demo", "--json", "-k", "1"], data)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["hits"][0]["document_id"] == "d1"
    zh = _quarry(["search", "熊猫", "--collection", "demo", "--json", "--mode", "bm25"], data)
    assert json.loads(zh.stdout)["hits"][0]["document_id"] == "d2"
    bad = write_jsonl(tmp_path / "bad.jsonl", [docs[0], "{not json"])
    failed = _quarry(["ingest", str(bad), "--collection", "demo2"], data)
    assert failed.returncode == 2 and "line 2" in failed.stderr
    missing = _quarry(["search", "x", "--collection", "nope"], data)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_cli_ingest_says_when_chunks_exceed_the_model_length(tmp_path: Path) -> None:
    long_text = " ".join(f"word{i}" for i in range(400))  # ~5 word-pieces each, far over 256
    corpus = write_jsonl(tmp_path / "long.jsonl", [{"id": "a", "text": long_text}, {"id": "b", "text": "short"}])
    done = _quarry(["ingest", str(corpus), "--collection", "long", "--chunk-size", "1000"], tmp_path / "data")
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())
    assert "(1 truncated)" in said
    assert "1 of 2 chunks exceed the embedding model's 256 tokens" in said and "--chunk-size" in said


def test_error_messages_are_printed_verbatim(tmp_path: Path) -> None:
    """A message with brackets (the Triton URL usage ``[/<version>]``) is text, not rich markup."""
    bad = _quarry(["search", "x", "--collection", "c"], tmp_path, QUARRY_EMBEDDING__URL="triton+grpc://127.0.0.1:8001/")
    assert bad.returncode == 2, bad.stderr
    said = " ".join(bad.stderr.split())
    assert "error (ConfigError): expected triton+grpc://host:port/<model>[/<version>]" in said


def _beir(folder: Path, docs: list[dict[str, str]]) -> Path:
    folder.mkdir(parents=True)
    write_jsonl(folder / "corpus.jsonl", docs)
    write_jsonl(folder / "queries.jsonl", [{"_id": "q1", "text": "gas giant planet"}])
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tjupiter\t1\n", encoding="utf-8")
    return folder


def test_eval_checks_its_inputs_before_ingesting_and_refuses_a_stale_collection(tmp_path: Path) -> None:
    docs = [
        {"_id": "jupiter", "title": "Jupiter", "text": "jupiter is a gas giant planet"},
        {"_id": "cell", "title": "Cells", "text": "the mitochondria is the powerhouse of the cell"},
        {"_id": "panda", "title": "Pandas", "text": "pandas eat bamboo"},
    ]
    beir, data, out = _beir(tmp_path / "toy", docs), tmp_path / "data", tmp_path / "out"
    for args, says in [
        (["--split", "dev"], "no split 'dev'"),
        (["--modes", "bm25,sparse"], "--modes must name some of bm25, dense, hybrid"),
        (["--out", str(write_jsonl(tmp_path / "a-file", []))], "is not a writable folder"),
    ]:
        bad = _quarry(["eval", "--beir", str(beir), "--out", str(out), *args], data)
        assert bad.returncode == 2 and says in " ".join(bad.stderr.split()), bad.stderr
        assert "ingest" not in bad.stderr  # failed before any document was read into a collection
    empty = _beir(tmp_path / "empty", [])
    bad = _quarry(["eval", "--beir", str(empty), "--out", str(out)], data)
    assert bad.returncode == 2 and "holds no documents" in bad.stderr, bad.stderr

    done = _quarry(["eval", "--beir", str(beir), "--modes", "bm25", "--out", str(out)], data)
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "summary.json").read_text())["modes"]["bm25"]["ndcg@10"] == 1.0
    write_jsonl(beir / "corpus.jsonl", docs[1:])  # jupiter left the corpus; the collection still holds it
    stale = _quarry(["eval", "--beir", str(beir), "--modes", "bm25", "--out", str(out)], data)
    assert stale.returncode == 2
    assert "collection 'eval_toy' holds 3 documents but" in " ".join(stale.stderr.split()), stale.stderr


def test_bad_settings_and_stores_are_one_error_line_not_a_traceback(tmp_path: Path) -> None:
    bad = _quarry(["search", "x", "-c", "c"], tmp_path, QUARRY_SEARCH__CANDIDATES="abc")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "QUARRY_SEARCH__CANDIDATES" in bad.stderr and "'abc'" in bad.stderr
    for value in ("inf", "1e10", "nan"):  # a wait past threading's TIMEOUT_MAX failed every rerank request
        late = _quarry(["search", "x", "-c", "c"], tmp_path, QUARRY_SEARCH__DENSE_TIMEOUT_S=value)
        assert late.returncode == 2 and "QUARRY_SEARCH__DENSE_TIMEOUT_S" in late.stderr, late.stderr
    scheme = _quarry(["collections", "list"], tmp_path, QUARRY_STORE__URL="nosuch://x")
    assert scheme.returncode == 2 and "Traceback" not in scheme.stderr
    assert "unsupported store URL scheme 'nosuch'" in scheme.stderr
