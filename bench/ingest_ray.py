"""Throughput of ``quarry ingest --engine ray`` against the local pipeline, alternated in one run.

Each round ingests the first ``--docs`` SciFact documents into a fresh collection twice, once per
engine, the order alternating between rounds; both embed with the real torch MiniLM (the local
pipeline in process, Ray in ``--workers`` actors of one CPU each). A run's time is
``Run.execute`` (what ``quarry ingest`` does after opening the service): for Ray it includes the
actor start and model load of that run's pool, which a Ray Data run pays each time. Ray's own
start-up (``ray.init``) is paid once per process and reported apart. Prints each round and the
median ratio (Ray docs/s over local docs/s).

    python bench/ingest_ray.py --docs 200 --rounds 3 --workers 1

Measured here (2026-12-03, 2 CPU cores shared by ~8 agents, ``ray.init(num_cpus=2)``, 1 actor):
see docs/ingestion.md ("Ingestion on Ray"). On 2 cores Ray cannot be faster: the actor's model
runs on one core (Ray sets its threads to its ``num_cpus``) while the local pipeline's torch uses
both, and the actor's start and model load are added to every run.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import ray  # noqa: E402

from indexing.sources import Source  # noqa: E402
from quarry.ingest_run import Options, Run  # noqa: E402
from quarry.service import Quarry  # noqa: E402
from quarry.settings import Settings  # noqa: E402


def _corpus(docs: int, folder: Path) -> Path:
    folder.mkdir(parents=True)
    with (REPO.parent / "shared" / "data" / "scifact" / "corpus.jsonl").open() as src:
        (folder / "corpus.jsonl").write_text("".join(next(src) for _ in range(docs)))
    return folder


def _run(engine: str, corpus: Path, data_dir: Path, workers: int) -> tuple[float, dict[str, object]]:
    quarry = Quarry(Settings(data_dir=data_dir))
    try:
        quarry.create_collection("scifact")  # loads the driver's model: not timed
        out = io.StringIO()
        options = Options(as_json=True, engine=engine, workers=workers)
        run = Run(quarry, "scifact", Source(corpus), options, Console(file=out), Console(file=io.StringIO()))
        started = time.perf_counter()
        code = run.execute()
        elapsed = time.perf_counter() - started
    finally:
        quarry.close()
    report: dict[str, object] = json.loads(out.getvalue().splitlines()[-1])
    assert code == 0, report
    return elapsed, report


def main() -> None:
    """Alternate the two engines for ``--rounds`` rounds; print each round and the median ratio."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1, help="embedding actors")
    parser.add_argument("--cpus", type=int, default=2, help="ray.init(num_cpus=...)")
    parser.add_argument("--torch-threads", type=int, default=0, help="the local pipeline's torch threads (0: torch's)")
    args = parser.parse_args()
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)  # this process only: each Ray actor runs 1 (its num_cpus)
    root = Path(tempfile.mkdtemp(prefix="quarry-bench-ray-"))
    corpus = _corpus(args.docs, root / "scifact")
    started = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    print(f"ray.init(num_cpus={args.cpus}): {time.perf_counter() - started:.1f} s (once per process)")
    ratios = []
    try:
        for round_no in range(args.rounds):
            order = ("local", "ray") if round_no % 2 == 0 else ("ray", "local")
            rates = {}
            for engine in order:
                elapsed, report = _run(engine, corpus, root / f"r{round_no}-{engine}", args.workers)
                rates[engine] = args.docs / elapsed
                print(
                    f"round {round_no + 1} {engine:5}: {elapsed:6.1f} s, {rates[engine]:5.1f} docs/s, "
                    f"{report['chunks_written']} chunks, {report['embedded']} embedded", flush=True,
                )
            ratios.append(rates["ray"] / rates["local"])
            print(f"round {round_no + 1} ratio ray/local: {ratios[-1]:.2f}", flush=True)
    finally:
        ray.shutdown()
    print(f"median ratio ray/local over {args.rounds} rounds: {statistics.median(ratios):.2f} ({args.docs} docs)")


if __name__ == "__main__":
    main()
