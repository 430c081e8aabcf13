"""The ``quarry`` command line: a few real ``python -m quarry.cli`` processes (exit codes, output
streams, the model built from settings), the rest in this process through typer's ``CliRunner``.
"""

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from rich.console import Console
from typer.testing import CliRunner

from quarry import cli
from quarry.cli import data as cli_data
from quarry.cli import evaluate as cli_evaluate
from quarry.cli import ingest as cli_ingest
from quarry.cli import root as cli_root
from quarry.cli import serve as cli_serve
from quarry.service import Quarry
from quarry.settings import Settings, get_settings
from tests.core.conftest import write_jsonl
from tests.embedding_cache import CachedEmbedder

CLI_MODULES = (cli_root, cli_data, cli_evaluate, cli_ingest, cli_serve)  # each holds its _quarry, out, err


@dataclass
class Ran:
    """What a ``quarry`` run left: its exit status and what it printed."""

    returncode: int
    stdout: str
    stderr: str


def _quarry(args: list[str], data_dir: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    """``python -m quarry.cli`` in a child process, as a user runs it."""
    env = {**os.environ, "QUARRY_DATA_DIR": str(data_dir), "HF_HUB_OFFLINE": "1", **extra_env}
    return subprocess.run(
        [sys.executable, "-m", "quarry.cli", *args], env=env, capture_output=True, text=True, timeout=600
    )


Runner = Callable[..., Ran]


@pytest.fixture()
def quarry_cli(minilm_vectors: CachedEmbedder) -> Iterator[Runner]:
    """``quarry`` in this process: ``quarry.cli.main`` (the console entry point, with its mapping of
    errors to exit 2) under typer's ``CliRunner`` isolation (environment, captured streams).

    Each run reads the environment afresh (``get_settings`` is cached per process). The services
    a command opens get the session's MiniLM instead of loading it again, and are closed after
    the command (a process would exit); the child-process runs build it from settings.
    """
    opened: list[Quarry] = []

    def open_service(settings: Settings | None = None) -> Any:
        service = Quarry(settings or get_settings(), embedder=minilm_vectors)
        opened.append(service)
        return service

    def run(args: list[str], data_dir: Path, **extra_env: str) -> Ran:
        env = {"QUARRY_DATA_DIR": str(data_dir), **extra_env}
        with CliRunner().isolation(env=env) as (stdout, stderr, _), ExitStack() as patches:
            patches.enter_context(patch.object(sys, "argv", ["quarry", *args]))
            out, err = Console(), Console(stderr=True)  # made here: they write to the captured streams
            for module in CLI_MODULES:
                patches.enter_context(patch.object(module, "_quarry", open_service))
                patches.enter_context(patch.object(module, "out", out))
                patches.enter_context(patch.object(module, "err", err))
            get_settings.cache_clear()
            try:
                cli.main()
                code = 0
            except SystemExit as exc:
                code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
            finally:
                get_settings.cache_clear()
                while opened:
                    opened.pop().close()
            sys.stdout.flush()
            sys.stderr.flush()
            return Ran(code, stdout.getvalue().decode(), stderr.getvalue().decode())

    yield run


def test_cli_ingest_search_and_bad_line(tmp_path: Path, quarry_cli: Runner) -> None:
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
    again = quarry_cli(
        ["ingest", str(corpus), "--collection", "demo", "--chunk-size", "50", "--language", "auto"], data
    )
    assert again.returncode == 0, again.stderr
    assert "3 unchanged; 0 chunks embedded" in " ".join(again.stdout.split())
    note = " ".join(again.stderr.split())
    assert "exists with chunk_size=256; --chunk-size applies to a new collection only" in note
    found = quarry_cli(["search", "gas giant", "--collection", "demo", "--json", "-k", "1"], data)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["hits"][0]["document_id"] == "d1"
    zh = quarry_cli(["search", "熊猫", "--collection", "demo", "--json", "--mode", "bm25"], data)
    assert json.loads(zh.stdout)["hits"][0]["document_id"] == "d2"
    bad = write_jsonl(tmp_path / "bad.jsonl", [docs[0], "{not json"])
    failed = _quarry(["ingest", str(bad), "--collection", "demo2"], data)
    assert failed.returncode == 2 and "line 2" in failed.stderr
    missing = quarry_cli(["search", "x", "--collection", "nope"], data)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_cli_ingest_says_when_chunks_exceed_the_model_length(tmp_path: Path, quarry_cli: Runner) -> None:
    long_text = " ".join(f"word{i}" for i in range(400))  # ~5 word-pieces each, far over 256
    corpus = write_jsonl(tmp_path / "long.jsonl", [{"id": "a", "text": long_text}, {"id": "b", "text": "short"}])
    done = quarry_cli(["ingest", str(corpus), "--collection", "long", "--chunk-size", "1000"], tmp_path / "data")
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


def test_eval_checks_its_inputs_before_ingesting_and_refuses_a_stale_collection(
    tmp_path: Path, quarry_cli: Runner
) -> None:
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
        bad = quarry_cli(["eval", "--beir", str(beir), "--out", str(out), *args], data)
        assert bad.returncode == 2 and says in " ".join(bad.stderr.split()), bad.stderr
        assert "ingest" not in bad.stderr  # failed before any document was read into a collection
    empty = _beir(tmp_path / "empty", [])
    bad = quarry_cli(["eval", "--beir", str(empty), "--out", str(out)], data)
    assert bad.returncode == 2 and "holds no documents" in bad.stderr, bad.stderr

    done = quarry_cli(["eval", "--beir", str(beir), "--modes", "bm25", "--out", str(out)], data)
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "summary.json").read_text())["modes"]["bm25"]["ndcg@10"] == 1.0
    moon = {"_id": "moon", "title": "Moon", "text": "the moon orbits the earth"}
    write_jsonl(beir / "corpus.jsonl", [*docs[1:], moon])  # jupiter left the corpus; the collection still holds it
    stale = quarry_cli(["eval", "--beir", str(beir), "--modes", "bm25", "--out", str(out)], data)
    assert stale.returncode == 2
    said = " ".join(stale.stderr.split())
    assert "collection 'eval_toy' holds 1 document(s) that" in said and "does not have" in said, stale.stderr
    assert "ingest" not in stale.stderr  # refused before the corpus (moon) was written into it


def test_eval_writes_the_html_report_and_compares_with_a_baseline(tmp_path: Path, quarry_cli: Runner) -> None:
    docs = [
        {"_id": "jupiter", "title": "Jupiter", "text": "jupiter is a gas giant planet"},
        {"_id": "cell", "title": "Cells", "text": "the mitochondria is the powerhouse of the cell"},
    ]
    beir, data = _beir(tmp_path / "toy", docs), tmp_path / "data"
    first, second = tmp_path / "first", tmp_path / "second"
    missing = quarry_cli(["eval", "--out", str(first)], data)
    assert missing.returncode == 2 and "needs --beir" in missing.stderr, missing.stderr
    done = quarry_cli(["eval", "--beir", str(beir), "--out", str(first)], data)
    assert done.returncode == 0, done.stderr
    assert "ANN vs exact (FLAT): recall@2 1.0000" in done.stdout, done.stdout  # the planner's index at 2 vectors
    assert {"report.html", "queries.json"} <= {p.name for p in first.iterdir()}
    summary = json.loads((first / "summary.json").read_text())
    assert summary["ann_vs_exact"]["recall"] == {"2": 1.0} and summary["config"]["environment"]["hardware"]["cores"]
    other = tmp_path / "other-split"
    other.mkdir()
    (other / "summary.json").write_text(json.dumps({"config": {"dataset": "toy", "split": "dev"}, "modes": {}}))
    (other / "per_query.json").write_text("{}")
    bad = quarry_cli(["eval", "--beir", str(beir), "--out", str(second), "--baseline", str(other)], data)
    assert bad.returncode == 2 and "runs differ in split" in bad.stderr, bad.stderr
    again = quarry_cli(["eval", "--beir", str(beir), "--out", str(second), "--baseline", str(first), "--no-ann"], data)
    assert again.returncode == 0, again.stderr
    compared = json.loads((second / "compare.json").read_text())
    rows = compared["rows"]  # the same one query scored the same: no difference, too few queries for a test
    assert len(rows) == 12 and all((r["delta"], r["ties"], r["p_value"]) == (0.0, 1, None) for r in rows), rows
    assert "W/L/T" in again.stdout and "0/0/1" in again.stdout, again.stdout
    html = (second / "report.html").read_text()
    assert 'id="comparison"' in html and "Not measured in this run" in html
    assert "ann_vs_exact" not in json.loads((second / "summary.json").read_text())


def test_eval_tune_refuses_the_test_split_and_writes_a_setting_tuned_on_train(
    tmp_path: Path, quarry_cli: Runner
) -> None:
    docs = [
        {"_id": "jupiter", "title": "Jupiter", "text": "jupiter is a gas giant planet"},
        {"_id": "cell", "title": "Cells", "text": "the mitochondria is the powerhouse of the cell"},
    ]
    beir, data, out = _beir(tmp_path / "toy", docs), tmp_path / "data", tmp_path / "out"
    bad = quarry_cli(["eval", "--beir", str(beir), "--out", str(out), "--tune", "test"], data)
    assert bad.returncode == 2 and "refused" in " ".join(bad.stderr.split()), bad.stderr
    assert "ingest" not in bad.stderr  # refused before anything was read in
    (beir / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tjupiter\t1\n", encoding="utf-8")
    done = quarry_cli(["eval", "--beir", str(beir), "--modes", "hybrid", "--out", str(out), "--tune", "train"], data)
    assert done.returncode == 0, done.stderr
    tuned = json.loads((out / "tuned-fusion.json").read_text())
    assert tuned["tuned"]["split"] == "train" and set(tuned["tuned"]) >= {"default", "tuned"}
    assert tuned["fusion"]["method"] in ("rrf", "weighted") and tuned["candidates"] >= 1
    again = quarry_cli(
        ["eval", "--beir", str(beir), "--modes", "hybrid", "--out", str(out / "b"),
         "--fusion", str(out / "tuned-fusion.json")],
        data,
    )
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "b" / "summary.json").read_text())["config"]["fusion"] == tuned["fusion"] | {
        "weights": {"bm25": 1.0, "dense": 1.0} | tuned["fusion"]["weights"]
    }


def test_bad_settings_and_stores_are_one_error_line_not_a_traceback(tmp_path: Path, quarry_cli: Runner) -> None:
    bad = quarry_cli(["search", "x", "-c", "c"], tmp_path, QUARRY_SEARCH__CANDIDATES="abc")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "QUARRY_SEARCH__CANDIDATES" in bad.stderr and "'abc'" in bad.stderr
    for value in ("inf", "1e10", "nan"):  # a wait past threading's TIMEOUT_MAX failed every rerank request
        late = quarry_cli(["search", "x", "-c", "c"], tmp_path, QUARRY_SEARCH__DENSE_TIMEOUT_S=value)
        assert late.returncode == 2 and "QUARRY_SEARCH__DENSE_TIMEOUT_S" in late.stderr, late.stderr
    scheme = quarry_cli(["collections", "list"], tmp_path, QUARRY_STORE__URL="nosuch://x")
    assert scheme.returncode == 2 and "Traceback" not in scheme.stderr
    assert "unsupported store URL scheme 'nosuch'" in scheme.stderr
