"""The runner end to end over the real SciFact test queries with a deterministic toy search.

Mode ``half``: the judged documents first for every other query (in qrels order), and at ranks
11.. for the rest; each call takes 1 ms. Mode ``late``: 100 non-relevant documents first, the
judged ones after; each call takes 2 ms, every tenth 5 ms. The calls are timed on the search's
own clock, which each call steps by its duration, so the latencies are known in advance too,
however loaded the machine (the runner's real clock is checked once, in ``test_real_clock``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from PIL import Image

from eval.beir import BeirSplit, iter_corpus, load_split
from eval.runner import evaluate, run_modes
from eval.summary import Summary
from quarry.errors import InvalidRequest

SUMMARY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["config", "modes"],
    "additionalProperties": False,
    "properties": {
        "config": {"type": "object"},
        "modes": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["ndcg@10", "recall@10", "recall@100", "mrr@10", "latency_ms"],
                "properties": {
                    **{
                        m: {"type": "number", "minimum": 0, "maximum": 1}
                        for m in ("ndcg@10", "recall@10", "recall@100", "mrr@10")
                    },
                    "latency_ms": {
                        "type": "object",
                        "required": ["p50", "p95"],
                        "additionalProperties": False,
                        "properties": {"p50": {"type": "number"}, "p95": {"type": "number"}},
                    },
                },
            },
        },
    },
}


class ToySearch:
    """Deterministic search over SciFact ids that knows the qrels (see the module docstring)."""

    def __init__(self, beir: Path) -> None:
        self.split = load_split(beir, "test")
        self.qid_of = {text: qid for qid, text in self.split.queries.items()}
        self.half = set(list(self.split.qrels)[::2])
        self.corpus_ids = [doc["_id"] for doc in iter_corpus(beir)]
        self.calls: list[tuple[str, int]] = []
        self.now_ns = 0

    def clock_ns(self) -> int:
        return self.now_ns

    def __call__(self, text: str, mode: str, top_k: int) -> list[tuple[str, float]]:
        self.calls.append((mode, top_k))
        slow = mode == "late" and len(self.calls) % 10 == 0
        self.now_ns += (5 if slow else 2 if mode == "late" else 1) * 1_000_000
        qid = self.qid_of[text]
        relevant = sorted(self.split.qrels[qid])
        others = [d for d in self.corpus_ids[:120] if d not in self.split.qrels[qid]]
        if mode == "half":
            ranked = relevant + others if qid in self.half else others[:10] + relevant + others[10:]
        else:
            ranked = others[:100] + relevant  # longer than top_k: the runner must cut it
        return [(doc, 1.0 / (rank + 1)) for rank, doc in enumerate(ranked)]


@pytest.fixture(scope="module")
def run(
    shared_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Summary, Path, ToySearch]:
    out = tmp_path_factory.mktemp("eval-out")
    search = ToySearch(shared_data / "scifact")
    summary = evaluate(
        search,
        shared_data / "scifact",
        "test",
        ["half", "late"],
        out,
        {"store": "toy", "split": "x"},
        clock_ns=search.clock_ns,
    )
    return summary, out, search


def test_summary_json_has_the_interface_schema_and_known_numbers(
    run: tuple[Summary, Path, ToySearch],
) -> None:
    summary, out, _ = run
    data = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    jsonschema.validate(data, SUMMARY_SCHEMA)
    assert data == json.loads(json.dumps(summary.to_dict()))
    assert list(data["modes"]) == ["half", "late"]
    half, late = data["modes"]["half"], data["modes"]["late"]
    assert {k: half[k] for k in ("ndcg@10", "recall@10", "recall@100", "mrr@10")} == {
        "ndcg@10": 0.5,
        "recall@10": 0.5,
        "recall@100": 1.0,
        "mrr@10": 0.5,
    }
    assert {k: late[k] for k in ("ndcg@10", "recall@10", "recall@100", "mrr@10")} == {
        "ndcg@10": 0.0,
        "recall@10": 0.0,
        "recall@100": 0.0,
        "mrr@10": 0.0,
    }
    assert half["num_queries"] == late["num_queries"] == 300
    assert half["latency_ms"] == {"p50": 1.0, "p95": 1.0}
    assert late["latency_ms"] == {"p50": 2.0, "p95": 5.0}  # 30 of the 300 calls took 5 ms
    config = data["config"]
    assert config["store"] == "toy"
    assert config["split"] == "test"  # run facts win over a clashing caller key
    assert (config["dataset"], config["top_k"], config["num_queries"]) == ("scifact", 100, 300)
    assert config["modes"] == ["half", "late"]


def test_each_query_searched_once_per_mode_after_one_warmup(
    run: tuple[Summary, Path, ToySearch],
) -> None:
    _, _, search = run
    assert search.calls.count(("half", 100)) == 301
    assert search.calls.count(("late", 100)) == 301
    assert len(search.calls) == 602


def test_per_query_file(run: tuple[Summary, Path, ToySearch]) -> None:
    _, out, search = run
    per_query = json.loads((out / "per_query.json").read_text(encoding="utf-8"))
    assert set(per_query) == {"half", "late"}
    assert set(per_query["half"]) == set(search.split.qrels)
    first = next(iter(search.split.qrels))
    assert per_query["half"][first]["ndcg@10"] == 1.0 and per_query["half"][first]["latency_ms"] == 1.0


def test_report_md_shows_ours_beside_the_published_numbers(
    run: tuple[Summary, Path, ToySearch],
) -> None:
    _, out, _ = run
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "# Evaluation: scifact (test split)" in report
    assert "| half | 0.5000 | 0.5000 | 1.0000 | 0.5000 |" in report
    assert "| **Quarry `late`** | **0.0000** | **0.0000** |" in report
    for published in (
        "| BM25, Elasticsearch multifield (BEIR paper) | 0.665 | 0.908 |",
        "| BM25 multifield, Anserini/Lucene (reproduces the BEIR ES run) | 0.6647 | 0.9076 |",
        "| BM25 (bm25s, MTEB baseline) | 0.6874 | 0.9127 |",
        "| dense: sentence-transformers/all-MiniLM-L6-v2 (cosine, exact) | 0.6451 | 0.9250 |",
    ):
        assert published in report
    assert "![nDCG@10 and Recall@100 per mode](quality.png)" in report
    assert "![Latency per query](latency.png)" in report


def test_plots_are_valid_png_images(run: tuple[Summary, Path, ToySearch]) -> None:
    _, out, _ = run
    for name in ("quality.png", "latency.png"):
        with Image.open(out / name) as image:
            assert image.format == "PNG"
            assert image.width >= 600 and image.height >= 400
            image.verify()


def test_dataset_without_published_numbers(shared_data: Path, tmp_path: Path) -> None:
    beir = shared_data / "cmrc2018-retrieval"
    split = load_split(beir, "dev")

    searched: list[str] = []

    def search(text: str, mode: str, top_k: int) -> list[tuple[str, float]]:
        searched.append(text)
        return [("DEV_0", 1.0)]

    summary = evaluate(search, beir, "dev", ["bm25"], tmp_path, {}, show_progress=False)
    assert summary.modes["bm25"].per_query.keys() == split.qrels.keys()
    # Two dev queries are blank: not searched (the API rejects them), scored 0, counted in the means.
    blank = ["TRIAL_776_QUERY_4", "TRIAL_20_QUERY_0"]
    assert sorted(summary.config["blank_queries"]) == sorted(blank)
    assert all(text.strip() for text in searched) and len(searched) == len(split.queries) - 2 + 1  # + warmup
    assert all(summary.modes["bm25"].per_query[q]["ndcg@10"] == 0.0 for q in blank)
    assert not set(blank) & set(summary.modes["bm25"].latencies_ms)
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "section *CMRC2018-retrieval (shared/data/cmrc2018-retrieval)*" in report
    assert "**test** split" in report  # published numbers are for test, we ran dev
    missing = evaluate(
        search, beir, "dev", ["bm25"], tmp_path, {}, references_path=tmp_path / "none.md"
    )
    assert missing.modes["bm25"].metrics == summary.modes["bm25"].metrics
    assert "No published numbers found" in (tmp_path / "report.md").read_text(encoding="utf-8")


def test_real_clock(shared_data: Path) -> None:
    """By default the runner times the calls on the real clock: a 2 ms sleep takes at least 2 ms."""
    split = load_split(shared_data / "scifact", "test")
    ids = list(split.queries)[:3]
    few = BeirSplit(split.name, {q: split.queries[q] for q in ids}, {q: split.qrels[q] for q in ids})

    def search(text: str, mode: str, top_k: int) -> list[tuple[str, float]]:
        time.sleep(0.002)
        return []

    summary = run_modes(search, few, ["slow"], {}, show_progress=False)
    assert len(summary.modes["slow"].latencies_ms) == 3
    assert all(ms >= 2.0 for ms in summary.modes["slow"].latencies_ms.values())


def test_invalid_arguments(shared_data: Path, tmp_path: Path) -> None:
    def search(text: str, mode: str, top_k: int) -> list[tuple[str, float]]:
        return []

    with pytest.raises(InvalidRequest, match="no evaluation modes"):
        evaluate(search, shared_data / "scifact", "test", [], tmp_path, {})
    with pytest.raises(InvalidRequest, match="top_k must be >= 1"):
        evaluate(search, shared_data / "scifact", "test", ["bm25"], tmp_path, {}, top_k=0)
    with pytest.raises(InvalidRequest, match="no split 'nope'"):
        evaluate(search, shared_data / "scifact", "nope", ["bm25"], tmp_path, {})
    assert not (tmp_path / "summary.json").exists()


def test_reports_carry_no_curator_notes_beside_numbers(run: tuple[Summary, Path, ToySearch]) -> None:
    """REFERENCE_SCORES.md's prose beside a table ("Expectation for the project...") is not the run's."""
    _, out, _ = run
    for name in ("report.md", "report.html"):
        text = (out / name).read_text(encoding="utf-8")
        assert "Expectation for the project" not in text and "treat any number you get" not in text, name


def test_reference_lines_share_close_values_and_keep_whole_labels(shared_data: Path) -> None:
    from eval.plots import reference_lines
    from eval.reference import load_references

    refs = load_references(shared_data / "REFERENCE_SCORES.md", "scifact")
    lines = dict(reference_lines(refs, "recall@100"))
    # 0.9250 (MiniLM) and 0.9253 (BM25 flat) are one line with both systems named, none cut
    at_925 = next(systems for value, systems in lines.items() if abs(value - 0.925) < 0.001)
    assert any(s.startswith("dense: sentence-transformers/all-MiniLM-L6-v2") for s in at_925)
    assert any(s.startswith("BM25 flat") for s in at_925)
    names = [s for systems in lines.values() for s in systems]
    assert "BM25 multifield, Anserini/Lucene (reproduces the BEIR ES run)" in names
    values = sorted(lines)
    assert all(b - a >= 0.002 for a, b in zip(values, values[1:], strict=False))


def test_a_run_on_selected_queries_records_how_they_were_chosen(shared_data: Path, tmp_path: Path) -> None:
    search = ToySearch(shared_data / "scifact")
    first = evaluate(search, shared_data / "scifact", "test", ["half"], tmp_path / "a", {}, max_queries=50,
                     show_progress=False, clock_ns=search.clock_ns)
    assert first.config["num_queries"] == 50 and first.config["queries_in_split"] == 300
    assert first.config["query_selection"] == {"max_queries": 50}
    assert list(first.modes["half"].per_query) == list(search.split.queries)[:50]
    drawn = evaluate(search, shared_data / "scifact", "test", ["half"], tmp_path / "b", {}, sample=40, seed=7,
                     show_progress=False, clock_ns=search.clock_ns)
    again = evaluate(search, shared_data / "scifact", "test", ["half"], tmp_path / "c", {}, sample=40, seed=7,
                     show_progress=False, clock_ns=search.clock_ns)
    assert set(drawn.modes["half"].per_query) == set(again.modes["half"].per_query)
    assert len(drawn.modes["half"].per_query) == 40 and drawn.config["query_selection"] == {"sample": 40, "seed": 7}
    with pytest.raises(InvalidRequest, match="give one"):
        evaluate(search, shared_data / "scifact", "test", ["half"], tmp_path / "d", {}, max_queries=5, sample=5)
