"""Run retrieval modes over a BEIR split, score them, and write the report.

Entry point for ``quarry eval`` (the CLI wires the search; this module does the rest)::

    from eval.runner import evaluate

    summary = evaluate(
        search,                      # (query_text: str, mode: str, top_k: int) -> [(doc_id, score)]
        beir_dir=Path("../shared/data/scifact"),
        split="test",
        modes=["bm25", "dense", "hybrid"],
        out_dir=Path("eval-out"),
        config={"store": "milvus:///data/quarry.db", "embedder": "all-MiniLM-L6-v2"},
    )

``evaluate`` loads the judged queries of the split (:func:`eval.beir.load_split`), calls
``search`` once per query and mode (the order of the returned list is the ranking; scores are
only recorded), times each call with :func:`time.perf_counter_ns` (or the ``clock_ns`` given), scores the rankings with
``pytrec_eval`` (:mod:`eval.metrics`), reads the published numbers of the dataset from
``<beir_dir>/../REFERENCE_SCORES.md`` (:mod:`eval.reference`) and writes ``summary.json``,
``per_query.json``, ``queries.json``, ``report.md``, the self-contained ``report.html`` and two
PNGs into ``out_dir`` (:mod:`eval.report`); with a ``baseline`` run folder also ``compare.json``
and ``compare.html`` (:mod:`eval.compare`). The config records the Quarry version and commit, the
hardware and how latency was measured (:mod:`eval.environment`).
Before timing a mode, ``warmup`` untimed calls are made (model loading, caches) so that the
first timed query does not carry start-up cost. Errors raised by ``search`` propagate.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from eval.beir import BeirSplit, load_split, select_queries
from eval.compare import compare_runs, load_run, run_data
from eval.environment import environment
from eval.metrics import mean_metrics, per_query_metrics
from eval.reference import load_references
from eval.report import require_plots, write_report
from eval.summary import ModeResult, Summary
from quarry.errors import EvaluationError, InvalidRequest

if TYPE_CHECKING:
    from indexing.collections import FusionConfig
    from quarry.service import Quarry
    from retrieval.results import Mode

SearchHit = tuple[str, float] | tuple[str, float, Mapping[str, int]]
"""``(document_id, score)``, or ``(document_id, score, {channel: 1-based rank in that channel})``."""
SearchFn = Callable[[str, str, int], Sequence[SearchHit]]
"""``search(query_text, mode, top_k) -> [(document_id, score[, channel_ranks]), ...]``, best first."""

_NOT_CHANNELS = frozenset({"fusion", "rerank"})


def channel_ranks(explain: Mapping[str, Any]) -> dict[str, int]:
    """The channel ranks in a hit's ``explain``: ``{"bm25": 3, "dense": 12}`` (channels that found it)."""
    return {
        name: int(entry["rank"])
        for name, entry in explain.items()
        if name not in _NOT_CHANNELS and isinstance(entry, Mapping) and isinstance(entry.get("rank"), int)
    }


def collection_search(quarry: Quarry, collection: str, fusion: FusionConfig | None = None) -> SearchFn:
    """The :data:`SearchFn` over one collection of a service: each hit's document id, score and channel ranks.

    ``fusion`` is passed with each search (``None``: the collection's default).

    Raises (from the returned callable):
        EvaluationError: A hybrid query was answered from BM25 alone (the embedder or the vector
            store failed, or the collection holds another model's vectors): the figures would be
            BM25's under the hybrid name.
    """

    def search(text: str, mode: str, top_k: int) -> list[SearchHit]:
        result = quarry.search(collection, text, top_k=top_k, mode=cast("Mode", mode), fusion=fusion)  # checked there
        if result.degraded:
            raise EvaluationError(f"{mode} query {text[:60]!r} was degraded ({'; '.join(result.degraded)}); stopped")
        return [(h.document_id, h.score, channel_ranks(h.explain)) for h in result.hits]

    return search


REFERENCE_FILE = "REFERENCE_SCORES.md"


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )


def run_mode(
    search: SearchFn,
    queries: Mapping[str, str],
    mode: str,
    top_k: int,
    progress: Progress | None = None,
    clock_ns: Callable[[], int] = time.perf_counter_ns,
    ranks_out: dict[str, dict[str, dict[str, int]]] | None = None,
) -> tuple[dict[str, list[str]], dict[str, float]]:
    """Search every query in one mode, timing each call.

    Args:
        search: The search callable.
        queries: Query id -> query text.
        mode: Passed through to ``search``.
        top_k: Passed through to ``search``; longer answers are cut to ``top_k``.
        progress: A started rich progress display to advance, or None.
        clock_ns: Nanoseconds of a monotonic clock, read before and after each call.
        ranks_out: Filled with query id -> {document id -> channel ranks} of the hits that
            carry them (a third tuple item), when given.

    Returns:
        ``(rankings, latencies_ms)``: query id -> document ids best first, and
        query id -> wall-clock milliseconds of its ``search`` call. A blank query is not
        searched (the API rejects it): its ranking is empty, so it scores 0 on every metric and
        still counts in the means, as trec_eval counts a judged query without results with
        ``-c``; it has no latency. CMRC2018's dev split holds two.
    """
    rankings: dict[str, list[str]] = {}
    latencies_ms: dict[str, float] = {}
    task = progress.add_task(mode, total=len(queries)) if progress is not None else None
    for qid, text in queries.items():
        if not text.strip():
            rankings[qid] = []
            if progress is not None and task is not None:
                progress.advance(task)
            continue
        start = clock_ns()
        hits = search(text, mode, top_k)
        latencies_ms[qid] = (clock_ns() - start) / 1e6
        rankings[qid] = [hit[0] for hit in hits[:top_k]]
        if ranks_out is not None:
            ranks_out[qid] = {hit[0]: dict(hit[2]) for hit in hits[:top_k] if len(hit) == 3}
        if progress is not None and task is not None:
            progress.advance(task)
    return rankings, latencies_ms


def run_modes(
    search: SearchFn,
    split: BeirSplit,
    modes: Sequence[str],
    config: Mapping[str, Any],
    top_k: int = 100,
    *,
    warmup: int = 1,
    show_progress: bool = True,
    clock_ns: Callable[[], int] = time.perf_counter_ns,
) -> Summary:
    """Run and score each mode over a loaded split (no files written).

    Args:
        search: The search callable.
        split: Judged queries and qrels.
        modes: Mode names, run in this order (repeats are run once).
        config: Recorded as ``summary.config`` (copied).
        top_k: Depth asked of ``search``; Recall@100 needs ``top_k >= 100``.
        warmup: Untimed ``search`` calls per mode before timing (the first queries).
        show_progress: Show a rich progress bar on stderr.
        clock_ns: Times the calls (see :func:`run_mode`); tests pass one the search steps.

    Returns:
        The summary, modes in the given order.

    Raises:
        InvalidRequest: No modes, ``top_k < 1``, ``warmup < 0`` or a split without queries.
    """
    if not modes:
        raise InvalidRequest("no evaluation modes given")
    if top_k < 1 or warmup < 0:
        raise InvalidRequest(f"top_k must be >= 1 and warmup >= 0, got {top_k} and {warmup}")
    if not split.queries:
        raise InvalidRequest(f"split {split.name!r} has no judged queries")
    results: dict[str, ModeResult] = {}
    with _progress(show_progress) as progress:
        for mode in dict.fromkeys(modes):
            for text in [t for t in split.queries.values() if t.strip()][:warmup]:
                search(text, mode, top_k)
            ranks: dict[str, dict[str, dict[str, int]]] = {}
            rankings, latencies = run_mode(search, split.queries, mode, top_k, progress, clock_ns, ranks)
            per_query = per_query_metrics(split.qrels, rankings)
            results[mode] = ModeResult(mode, mean_metrics(per_query), per_query, latencies, rankings, ranks)
    qrels = {qid: dict(docs) for qid, docs in split.qrels.items()}
    return Summary(config=dict(config), modes=results, queries=dict(split.queries), qrels=qrels)


def evaluate(
    search: SearchFn,
    beir_dir: Path,
    split: str,
    modes: Sequence[str],
    out_dir: Path,
    config: Mapping[str, Any],
    top_k: int = 100,
    *,
    references_path: Path | None = None,
    warmup: int = 1,
    show_progress: bool = True,
    clock_ns: Callable[[], int] = time.perf_counter_ns,
    answers: Callable[[BeirSplit], dict[str, Any]] | None = None,
    ann: Callable[[BeirSplit], dict[str, Any]] | None = None,
    baseline: Path | None = None,
    max_queries: int | None = None,
    sample: int | None = None,
    seed: int = 0,
) -> Summary:
    """Evaluate ``search`` on a BEIR split and write the report (see the module docstring).

    Args:
        search: ``search(query_text, mode, top_k) -> [(document_id, score), ...]``, best first.
        beir_dir: BEIR folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``).
        split: Split name, e.g. ``"test"``.
        modes: Modes to run, e.g. ``["bm25", "dense", "hybrid"]``.
        out_dir: Folder for ``summary.json``, ``per_query.json``, ``report.md`` and the PNGs.
        config: What is being evaluated (store URL, model, BM25 parameters, ...), JSON-able;
            stored in ``summary.json["config"]`` together with dataset, split, modes, top_k,
            number of queries, warmup and start time (these run facts win on a key clash).
        top_k: Depth asked of ``search`` (100 for Recall@100).
        references_path: REFERENCE_SCORES.md; default ``<beir_dir>/../REFERENCE_SCORES.md``.
            A missing file means no published numbers in the report.
        warmup: Untimed calls per mode before timing.
        show_progress: Show a rich progress bar on stderr.
        clock_ns: Nanoseconds of a monotonic clock that times each call
            (:func:`time.perf_counter_ns` by default).
        answers: Given the loaded split, the answers section (:mod:`eval.answers`), run after
            the modes and written with them (``summary.json["answers"]``, ``## Answers``).
        ann: Given the loaded split, the ANN-vs-exact section (:func:`eval.ann.ann_vs_exact`),
            written as ``summary.json["ann_vs_exact"]`` and shown in both reports.
        baseline: An earlier run's folder to compare this run with (:mod:`eval.compare`):
            ``compare.json`` and ``compare.html`` are written too and the reports link them.
        max_queries: Only the split's first ``max_queries`` queries (:func:`eval.beir.select_queries`).
        sample: Only ``sample`` queries drawn at random with ``seed`` (exclusive with ``max_queries``).
        seed: The draw's seed.

    Returns:
        The summary that was written to ``out_dir/summary.json`` (``config.num_queries``: the
        queries run; ``config.queries_in_split`` and ``config.query_selection`` say how they were chosen).

    Raises:
        ConfigError: matplotlib is not installed (``pip install 'quarry[eval]'``), or the
            baseline folder has no readable ``summary.json``/``per_query.json``.
        InvalidRequest: Unknown split or folder, no modes, bad ``top_k``; a baseline of another
            dataset or split.
        InvalidDocument: A BEIR file is malformed.
        OSError: ``out_dir`` cannot be written.
    """
    require_plots()
    beir_dir = Path(beir_dir)
    whole = load_split(beir_dir, split)
    loaded = select_queries(whole, max_queries=max_queries, sample=sample, seed=seed)
    before = load_run(Path(baseline)) if baseline is not None else None
    selection: dict[str, Any] = (
        {"max_queries": max_queries} if max_queries is not None
        else {"sample": sample, "seed": seed} if sample is not None else {}
    )
    facts = {
        "dataset": beir_dir.resolve().name,
        "beir_dir": str(beir_dir),
        "split": split,
        "modes": list(dict.fromkeys(modes)),
        "top_k": top_k,
        "num_queries": len(loaded.queries),
        "queries_in_split": len(whole.queries),
        "query_selection": selection,
        "blank_queries": [qid for qid, text in loaded.queries.items() if not text.strip()],
        "warmup_queries": warmup,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "environment": environment(warmup),
    }
    run_config = {**config, **facts}
    summary = run_modes(
        search, loaded, modes, run_config, top_k, warmup=warmup, show_progress=show_progress, clock_ns=clock_ns
    )
    if answers is not None:
        summary = dataclasses.replace(summary, answers=answers(loaded))
    if ann is not None:
        summary = dataclasses.replace(summary, ann_vs_exact=ann(loaded))
    comparison = compare_runs(before, run_data(summary)) if before is not None else None
    ref_file = references_path or beir_dir.resolve().parent / REFERENCE_FILE
    write_report(summary, load_references(ref_file, str(facts["dataset"])), Path(out_dir), comparison)
    return summary
