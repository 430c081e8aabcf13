"""``quarry eval --answers`` end to end: the CLI over a tiny SciFact subset, the REAL llama.cpp server.

Three judged SciFact test queries, their relevant documents and a dozen others; ``--modes bm25``
keeps the retrieval part short; answers are capped at 32 tokens (SmolLM2-135M on 1 thread). Three
held-out out-of-corpus questions with the calibrated threshold give the abstention figures (a
declined one costs no LLM call).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.core.conftest import write_jsonl
from tests.llama import LLM_URL

pytestmark = pytest.mark.integration


def _cli(args: list[str], data_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "QUARRY_DATA_DIR": str(data_dir), "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run([sys.executable, "-m", "quarry.cli", *args], env=full, capture_output=True, text=True,
                          timeout=900)


def _tiny_scifact(shared_data: Path, folder: Path, queries: int = 3, others: int = 12) -> Path:
    src = shared_data / "scifact"
    rows = [line.split("\t") for line in (src / "qrels" / "test.tsv").read_text().splitlines()[1:]]
    qids = list(dict.fromkeys(r[0] for r in rows))[:queries]
    judged = [r for r in rows if r[0] in qids]
    wanted = {r[1] for r in judged}
    corpus = [json.loads(line) for line in (src / "corpus.jsonl").read_text().splitlines() if line.strip()]
    docs = [d for d in corpus if d["_id"] in wanted]
    docs += list(itertools.islice((d for d in corpus if d["_id"] not in wanted), others))
    all_queries = [json.loads(line) for line in (src / "queries.jsonl").read_text().splitlines() if line.strip()]
    folder.mkdir(parents=True)
    write_jsonl(folder / "corpus.jsonl", docs)
    write_jsonl(folder / "queries.jsonl", [q for q in all_queries if q["_id"] in qids])
    (folder / "qrels").mkdir()
    tsv = "query-id\tcorpus-id\tscore\n" + "".join("\t".join(r) + "\n" for r in judged)
    (folder / "qrels" / "test.tsv").write_text(tsv, encoding="utf-8")
    return folder


def test_eval_answers_without_an_llm_is_a_clear_error_before_ingesting(tmp_path: Path, shared_data: Path) -> None:
    beir = _tiny_scifact(shared_data, tmp_path / "tiny")
    bad = _cli(["eval", "--beir", str(beir), "--modes", "bm25", "--answers", "--out", str(tmp_path / "out")],
               tmp_path / "data", QUARRY_LLM__URL="")
    said = " ".join(bad.stderr.split())
    assert bad.returncode == 2 and "error (LLMNotConfigured)" in said and "QUARRY_LLM__URL" in said, bad.stderr
    assert not (tmp_path / "out" / "summary.json").exists()


def test_eval_answers_writes_the_answers_section(tmp_path: Path, shared_data: Path) -> None:
    beir, out = _tiny_scifact(shared_data, tmp_path / "tiny"), tmp_path / "out"
    done = _cli(
        ["eval", "--beir", str(beir), "--modes", "bm25", "--answers", "--answers-queries", "3", "--out", str(out),
         "--unanswerable-queries", "3", "--answers-min-score", "0.3317"],
        tmp_path / "data", QUARRY_LLM__URL=LLM_URL, QUARRY_LLM__MAX_TOKENS="32", QUARRY_LLM__CONTEXT_TOKENS="600",
        QUARRY_LLM__FIRST_TOKEN_TIMEOUT_S="300", QUARRY_LLM__STALL_TIMEOUT_S="60",
    )
    assert done.returncode == 0, done.stderr
    answers = json.loads((out / "summary.json").read_text())["answers"]
    assert answers["queries"] == 3 and answers["answered"] + answers["failed"] == 3
    assert answers["answered"] == 3, answers["errors"]
    for key in ("citation_validity", "cited_relevant", "no_citation", "supported"):
        assert answers[key] is None or 0.0 <= answers[key] <= 1.0, (key, answers[key])
    # three answers were written: each the LLM's (cited or not) or an abstention (not an uncited answer)
    abstained = sum(1 for r in answers["per_query"] if r["set"] == "answerable" and r["outcome"] != "answered")
    assert answers["answered_by_llm"] + abstained == 3
    assert (answers["no_citation"] is not None) == (answers["answered_by_llm"] > 0)
    resolved, dropped = answers["citations"], answers["dropped_citations"]
    if resolved + dropped:
        assert answers["citation_validity"] == resolved / (resolved + dropped)
    for timing in ("ttft_ms", "total_ms"):
        p50, p95 = answers[timing]["p50"], answers[timing]["p95"]
        assert 0 < p50 <= p95, (timing, answers[timing])
    assert answers["ttft_ms"]["p50"] <= answers["total_ms"]["p95"]
    asked = {json.loads(line)["_id"] for line in (beir / "queries.jsonl").read_text().splitlines()}
    judged = [r for r in answers["per_query"] if r["set"] == "answerable"]
    assert {r["query_id"] for r in judged} == asked
    # the held-out out-of-corpus questions, with the threshold given: abstention precision and recall
    ab, others = answers["abstention"], [r for r in answers["per_query"] if r["set"] == "unanswerable"]
    assert answers["unanswerable_queries"] == len(others) == 3 and ab["min_score"] == 0.3317
    declined_u = sum(1 for r in others if r["outcome"] == "declined")
    declined_a = sum(1 for r in judged if r["outcome"] == "declined")
    assert (ab["declined_unanswerable"], ab["declined_answerable"]) == (declined_u, declined_a)
    assert ab["recall"] == declined_u / 3
    assert ab["precision"] == (declined_u / (declined_u + declined_a) if declined_u + declined_a else None)
    assert all(r["ttft_ms"] is None for r in answers["per_query"] if r["outcome"] == "declined")
    report = (out / "report.md").read_text()
    assert "## Answers" in report and "citation validity (markers resolved / all)" in report
    assert "| model | questions | cite rate | citation validity | support rate | abstention precision" in report
    assert "### Answers per query" in report and 'id="answers-table"' in (out / "report.html").read_text()
    said = " ".join(done.stdout.split())
    assert "answers: 3 queries" in said and "abstention: 3 unanswerable questions, min_score 0.3317" in said
