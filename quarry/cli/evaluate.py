"""``quarry eval`` and ``quarry eval compare``: BEIR evaluation and run comparison."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from quarry.cli.ingest import _ingest_with_progress
from quarry.cli.root import (
    Language,
    _default_name,
    _quarry,
    err,
    eval_app,
    out,
)
from quarry.errors import InvalidRequest, LLMNotConfigured
from quarry.settings import get_settings


@eval_app.callback(invoke_without_command=True)
def evaluate(
    ctx: typer.Context,
    beir: Annotated[
        Path | None, typer.Option("--beir", help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/); required.")
    ] = None,
    split: Annotated[str, typer.Option(help="qrels split.")] = "test",
    modes: Annotated[str, typer.Option(help="Comma-separated: bm25,dense,hybrid.")] = "bm25,dense,hybrid",
    out_dir: Annotated[Path, typer.Option("--out", help="Where report.md and summary.json go.")] = Path("eval-out"),
    collection: Annotated[str | None, typer.Option("--collection", "-c", help="Default: eval_<dataset>.")] = None,
    language: Language = "auto",
    answers: Annotated[
        bool, typer.Option("--answers", help="Also answer queries with the LLM (QUARRY_LLM__URL) and score them.")
    ] = False,
    answers_queries: Annotated[
        int, typer.Option("--answers-queries", min=1, help="Queries answered with --answers (split order).")
    ] = 20,
    unanswerable: Annotated[
        Path | None, typer.Option("--unanswerable", help="Out-of-corpus questions (BEIR queries.jsonl form) asked "
                                  "with --answers to measure abstention; default: eval/data/unanswerable_test.jsonl.")
    ] = None,
    unanswerable_queries: Annotated[
        int, typer.Option("--unanswerable-queries", min=0, help="How many of them (0: none).")
    ] = 50,
    answers_min_score: Annotated[
        float | None, typer.Option("--answers-min-score", help="Abstention threshold for --answers (default: the "
                                   "collection's QUARRY_LLM__MIN_SCORES entry; without one, no abstention).")
    ] = None,
    baseline: Annotated[
        Path | None, typer.Option("--baseline", help="An earlier run's --out folder: compare this run with it.")
    ] = None,
    ann: Annotated[
        bool, typer.Option("--ann/--no-ann", help="Measure the index's recall against exact search (numpy scan).")
    ] = True,
    tune: Annotated[
        str | None,
        typer.Option("--tune", help="Fit the hybrid fusion on this split (train, dev; never test), write "
                     "<out>/tuned-fusion.json and compare tuned and default fusion on --split."),
    ] = None,
    fusion_file: Annotated[
        Path | None, typer.Option("--fusion", help="Hybrid fusion JSON (e.g. a tuned-fusion.json) for the run.")
    ] = None,
    max_queries: Annotated[
        int | None, typer.Option("--max-queries", min=1, help="Only the split's first N queries (a quick run).")
    ] = None,
    sample: Annotated[
        int | None, typer.Option("--sample", min=1, help="Only N queries drawn at random with --seed (a quick run).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="The seed of --sample (the same seed: the same queries).")] = 0,
    ingest: Annotated[
        bool, typer.Option("--ingest/--no-ingest", help="--no-ingest: evaluate the collection as it is (it must "
                           "exist; built by quarry ingest or an earlier eval), without reading the corpus.")
    ] = True,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print summary.json's object instead of the tables.")
    ] = False,
) -> None:
    """Ingest a BEIR corpus (idempotent), run each mode over a split, write the report (report.md, report.html)."""
    if ctx.invoked_subcommand is not None:
        return
    if beir is None:
        raise InvalidRequest("quarry eval needs --beir DIR (a BEIR folder), or a subcommand: quarry eval compare A B")
    from eval.ann import collection_ann
    from eval.runner import collection_search
    from eval.runner import evaluate as run_eval

    settings = get_settings()
    if answers and not settings.llm.url.strip():
        raise LLMNotConfigured(
            "quarry eval --answers needs an LLM: set QUARRY_LLM__URL (openai+http://host:port/v1?model=NAME)"
        )
    name = collection or f"eval_{_default_name(beir)}"
    wanted = [m.strip() for m in modes.split(",") if m.strip()]
    if tune is not None and tune in ("test", split):
        raise InvalidRequest(f"--tune {tune}: tuning on the test or the reported split is refused; use train or dev")
    if max_queries is not None and sample is not None:
        raise InvalidRequest("--max-queries and --sample choose the queries two ways: give one")
    docs = _check_eval_inputs(beir, split, wanted, out_dir, read_corpus=ingest)
    unanswerable_set = _unanswerable(unanswerable, unanswerable_queries) if answers else {}
    _check_baseline(baseline, beir, split)
    quarry = _quarry(settings)
    if ingest:
        _ingest_corpus(quarry, name, beir, docs, language)
    cfg = quarry.get_collection(name)  # --no-ingest: CollectionNotFound when there is none

    fusion = _read_fusion_file(fusion_file) if fusion_file is not None else None
    if tune is not None:
        _tune(quarry, name, beir, tune, split, out_dir, settings.search.candidates)
    config = {
        "fusion": quarry.searcher.fusion(cfg, fusion).describe(),
        "collection": name, "store": settings.store_url, "embedding": settings.embedding.url,
        "embedding_model": cfg.embedding_model, "language": cfg.language, "chunk_size": cfg.chunk_size,
        "chunk_overlap": cfg.chunk_overlap, "bm25": settings.bm25.model_dump(),
        "rrf_k": settings.search.rrf_k, "rank_window_size": settings.search.candidates, "index": cfg.index,
        "ingested": ingest,
    }
    summary = run_eval(
        collection_search(quarry, name, fusion), beir_dir=beir, split=split, modes=wanted, out_dir=out_dir,
        config=config,
        answers=_answers_section(quarry, name, answers_queries, unanswerable_set, answers_min_score)
        if answers else None,
        ann=collection_ann(quarry, name) if ann else None, baseline=baseline,
        max_queries=max_queries, sample=sample, seed=seed, show_progress=not as_json,
    )
    if as_json:
        out.file.write(json.dumps(summary.to_dict(), ensure_ascii=False, default=str) + "\n")
        return
    _print_summary(summary, beir, baseline, out_dir)
    out.print(f"report: {out_dir / 'report.md'}, {out_dir / 'report.html'}")


def _ingest_corpus(quarry: Any, name: str, beir: Path, docs: list[Any], language: str) -> None:
    """Create the collection (if new) and ingest the corpus into it (idempotent).

    Raises:
        InvalidRequest: The collection holds documents the corpus does not have (before anything is written).
    """
    quarry.create_collection(name, language=language, exist_ok=True)
    # Refused before anything is written: documents that are not in the corpus would be retrieved
    # and scored, and ingesting first would add the corpus to a collection that is then refused.
    stored = quarry.docstore.counts(name)[0]
    foreign = stored - len(quarry.docstore.document_hashes(name, [d.id for d in docs]))
    if foreign:
        raise InvalidRequest(
            f"collection {name!r} holds {foreign} document(s) that {beir} does not have: they would be "
            f"retrieved and scored; drop it (quarry collections drop {name}) or name another with --collection"
        )
    _ingest_with_progress(quarry, name, docs)


def _print_summary(summary: Any, beir: Path, baseline: Path | None, out_dir: Path) -> None:
    """The run's tables: the modes, the answers and ANN lines, the comparison with a baseline."""
    table = Table("mode", "nDCG@10", "Recall@10", "Recall@100", "MRR@10", "p50 ms", "p95 ms", title=str(beir))
    for mode_name, row in summary.to_dict()["modes"].items():
        table.add_row(mode_name, *(f"{row[k]:.4f}" for k in ("ndcg@10", "recall@10", "recall@100", "mrr@10")),
                      f"{row['latency_ms']['p50']:.1f}", f"{row['latency_ms']['p95']:.1f}")
    out.print(table)
    if summary.answers is not None:
        a = summary.answers

        ab = a["abstention"]

        def pct(value: float | None) -> str:
            return "n/a" if value is None else f"{100 * value:.1f}%"

        out.print(
            f"answers: {a['queries']} queries ({a['failed']} failed), cite rate {pct(a['cite_rate'])}, citation "
            f"validity {pct(a['citation_validity'])}, cited relevant {pct(a['cited_relevant'])}, supported "
            f"{pct(a['supported'])}, TTFT p50 {a['ttft_ms']['p50']:.0f} ms, total p50 {a['total_ms']['p50']:.0f} ms"
        )
        out.print(
            f"abstention: {a['unanswerable_queries']} unanswerable questions, min_score {ab['min_score']}, "
            f"precision {pct(ab['precision'])}, recall {pct(ab['recall'])}"
            + (" (not measured: no threshold)" if ab.get("skipped") else "")
        )
    if summary.ann_vs_exact is not None and "recall" in summary.ann_vs_exact:
        recall = ", ".join(f"recall@{k} {v:.4f}" for k, v in summary.ann_vs_exact["recall"].items())
        kind = (summary.ann_vs_exact["index"] or {}).get("kind", "no index")
        out.print(f"ANN vs exact ({escape(str(kind))}): {recall}")
    if baseline is not None:  # the same figures as compare.json (same data, same seed)
        from eval.compare import compare_runs, load_run

        _print_comparison(compare_runs(load_run(baseline, str(baseline)), load_run(out_dir, "this run")))


@eval_app.command("compare")
def compare(
    run_a: Annotated[Path, typer.Argument(help="The base run's --out folder (A).")],
    run_b: Annotated[Path, typer.Argument(help="The compared run's --out folder (B).")],
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Where compare.json and compare.html go (default: RUN_B).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print compare.json's object instead of the tables.")] = False,
) -> None:
    """Per mode and metric: B - A with a paired randomisation test's p-value, a bootstrap CI and W/L/T.

    Then the queries that flipped (their first relevant document in or out of the top 10, with
    its rank in each run) and the settings that differ between the two runs.
    """
    from eval.compare import compare_runs, load_run, write_comparison

    comparison = compare_runs(load_run(run_a, str(run_a)), load_run(run_b, str(run_b)))
    json_path, html_path = write_comparison(comparison, out_dir or run_b)
    if as_json:
        out.file.write(json.dumps(comparison.to_dict(), ensure_ascii=False, default=str) + "\n")
        return
    _print_comparison(comparison)
    for note in comparison.notes:
        err.print(f"[yellow]note[/] {escape(note)}")
    out.print(f"comparison: {json_path}, {html_path}")


def _print_comparison(comparison: Any) -> None:
    """The comparison's tables: the deltas, the flipped queries, the config difference."""
    from eval.compare_tables import comparison_table, diff_table, flips_table

    out.print(comparison_table(comparison))
    out.print(flips_table(comparison) if comparison.flips else "no query flipped")
    out.print(diff_table(comparison) if comparison.config_diff else "the two runs' configs are the same")


def _check_baseline(baseline: Path | None, beir: Path, split: str) -> None:
    """A ``--baseline`` folder is readable and of the same dataset and split (before anything runs)."""
    if baseline is None:
        return
    from eval.compare import RunData, check_same_task, load_run

    here = RunData("this run", {"dataset": beir.resolve().name, "split": split}, {})
    check_same_task(load_run(baseline), here)


def _read_fusion_file(path: Path) -> Any:
    """A :class:`~indexing.collections.FusionConfig` from a JSON file (its ``fusion`` member, or the file itself)."""
    from indexing.collections import FusionConfig

    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return FusionConfig.model_validate(raw.get("fusion", raw) if isinstance(raw, dict) else raw)
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"cannot read the fusion setting {path}: {exc}") from exc


def _tune(quarry: Any, name: str, beir: Path, tune_split: str, report_split: str, out_dir: Path, window: int) -> None:
    """``quarry eval --tune``: fit the fusion on ``tune_split``, write it, show tuned vs default on ``report_split``."""
    from eval.beir import load_split
    from eval.runner import collection_search
    from eval.tune import DEFAULT, Point, channel_runs, default_grid, score, tune, write_setting

    search = collection_search(quarry, name)
    fit = load_split(beir, tune_split)
    candidates = [c for c in (50, 100, 200, 300) if c <= window] or [window]
    out.print(f"tuning on {tune_split}: {len(fit.queries)} queries, each channel searched once, {max(candidates)} deep")
    runs = channel_runs(search, fit.queries, max(candidates))
    best, _ = tune(runs, fit.qrels, tune_split, default_grid(candidates))
    reported = load_split(beir, report_split)
    held = channel_runs(search, reported.queries, max(candidates))
    table = Table("fusion", "candidates", f"{tune_split} nDCG@10", f"{tune_split} R@100",
                  f"{report_split} nDCG@10", f"{report_split} R@100", title="tuned vs default hybrid fusion")
    rows = {}
    for label, point in (("default", Point(DEFAULT, min(window, 100))), ("tuned", best)):
        a, b = score(runs, fit.qrels, point), score(held, reported.qrels, point)
        rows[label] = {"setting": point.describe(), tune_split: a, report_split: b}
        table.add_row(f"{label}: {point.fusion.describe()}", str(point.candidates), f"{a['ndcg@10']:.4f}",
                      f"{a['recall@100']:.4f}", f"{b['ndcg@10']:.4f}", f"{b['recall@100']:.4f}")
    out.print(table)
    path = out_dir / "tuned-fusion.json"
    setting = write_setting(path, best, {"split": tune_split, "objective": "ndcg@10", "dataset": beir.name, **rows})
    out.print_json(data={k: setting[k] for k in ("fusion", "candidates")})
    out.print(f"tuned setting: {path} (quarry eval --fusion {path}; a collection's or a request's \"fusion\"; "
              f"candidates -> QUARRY_SEARCH__CANDIDATES={best.candidates})")


def _unanswerable(path: Path | None, limit: int) -> dict[str, str]:
    """The out-of-corpus questions of ``--unanswerable`` (read before anything is ingested).

    Raises:
        InvalidRequest: The file does not exist.
        InvalidDocument: A line is malformed.
    """
    from eval.answers import UNANSWERABLE_TEST, load_unanswerable

    return load_unanswerable(path or UNANSWERABLE_TEST, limit)


def _answers_section(
    quarry: Any, name: str, limit: int, unanswerable: dict[str, str], min_score: float | None
) -> Any:
    """The ``answers`` callback of :func:`eval.runner.evaluate`: answer ``limit`` queries and the unanswerable ones."""
    from eval.answers import answer_queries
    from eval.beir import BeirSplit

    def run(split: BeirSplit) -> dict[str, Any]:
        section = answer_queries(quarry, name, split.queries, limit=limit, unanswerable=unanswerable,
                                 min_score=min_score)
        return section.to_dict(split.qrels)

    return run


def _check_eval_inputs(beir: Path, split: str, modes: list[str], out_dir: Path, *, read_corpus: bool = True
                       ) -> list[Any]:
    """Everything an evaluation reads or writes, checked before it ingests anything.

    Returns:
        The corpus documents (none read with ``read_corpus`` false: ``--no-ingest``).

    Raises:
        InvalidRequest: Not a BEIR folder, an unknown split or mode, an empty corpus, or an
            ``--out`` that is not a writable folder.
        InvalidDocument: A malformed corpus, queries or qrels file (file and line named).
    """
    from eval.beir import load_split
    from eval.report import ARTIFACTS, require_plots
    from indexing.sources import read_documents
    from retrieval.results import MODES

    require_plots()  # before the ingest, not after the run
    if not (beir / "corpus.jsonl").is_file():
        raise InvalidRequest(f"{beir} is not a BEIR folder (no corpus.jsonl)")
    unknown = [m for m in modes if m not in MODES]
    if not modes or unknown:
        raise InvalidRequest(f"--modes must name some of {', '.join(MODES)}; got {modes}")
    load_split(beir, split)
    docs = read_documents(beir) if read_corpus else []
    if read_corpus and not docs:
        raise InvalidRequest(f"{beir / 'corpus.jsonl'} holds no documents")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as exc:
        raise InvalidRequest(f"--out {out_dir} is not a writable folder: {exc.strerror or exc}") from exc
    blocked = [name for name in ARTIFACTS if (out_dir / name).exists() and not (out_dir / name).is_file()]
    if blocked:
        raise InvalidRequest(f"--out {out_dir}: {blocked} exist and are not files; the report writes them")
    return docs


