"""Benchmark the cost of a rollout's shadow mode: 32-client search throughput with shadowing on vs off.

One process, one real service (Milvus Lite by default, or ``--store`` / ``--state`` URLs), the
packaged MiniLM (its vectors memoised per machine as the tests' are: ``tests/embedding_cache.py``),
``--docs`` SciFact documents. A candidate version (same model, same index) is built with
``quarry.services.rollout.start(mode="shadow")``; then ``--rounds`` rounds each run two phases of
``--seconds``, alternated (off, on, off, on, ...; the order flips every round): ``off`` is the
rollout with ``shadow_rate`` 0 (routing only), ``on`` with ``--rate`` (default 5 %): each sampled
query also runs on the candidate in the rollout's background thread. ``--clients`` threads search
(hybrid, top 10) SciFact's queries as fast as they can. Printed per phase: searches/s; then the
ratio on/off per round, its median and the pooled ratio (all on searches over all off ones; the
acceptance: shadowing costs <= 10 %, ratio >= 0.90), and the CPU seconds per search of each arm
(this process and Milvus Lite's server: a measure the other work of a shared machine moves less).

    python bench/rollout_shadow.py [--docs 300] [--queries 300] [--clients 32] [--seconds 15] [--rounds 3] [--rate 0.05]
                                   [--store milvus://127.0.0.1:19530 --state postgresql://...] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from embedding import sentence_transformers as st  # noqa: E402
from embedding.sentence_transformers import resolve_model_path  # noqa: E402
from indexing.sources import read_documents  # noqa: E402
from quarry.service import Quarry  # noqa: E402
from quarry.services import rollout  # noqa: E402
from quarry.settings import DocstoreSettings, Settings, StoreSettings  # noqa: E402
from tests.embedding_cache import torch_vectors  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "scifact"


def cpu_s() -> float:
    """CPU seconds (user + system) of this process and its children (Milvus Lite's server) so far."""
    me = psutil.Process()
    own = me.cpu_times()
    kids = 0.0
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            t = child.cpu_times()
            kids += t.user + t.system
    return float(own.user + own.system + kids)


def phase(service: Quarry, name: str, queries: list[str], clients: int, seconds: float) -> float:
    """Searches per second of ``clients`` threads over ``seconds``."""
    stop = threading.Event()
    counts = [0] * clients
    failures: list[BaseException] = []

    def client(i: int) -> None:
        for j in itertools.count(i * 7):
            if stop.is_set():
                return
            try:
                service.search(name, queries[j % len(queries)], top_k=10)
                counts[i] += 1
            except BaseException as exc:  # noqa: BLE001 - counted and reported
                failures.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    if failures:
        raise RuntimeError(f"{len(failures)} searches failed: {failures[0]!r}")
    return sum(counts) / (time.perf_counter() - started)


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=300)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=0.05)
    ap.add_argument("--queries", type=int, default=300, help="SciFact queries searched in turn")
    ap.add_argument("--store", default="")
    ap.add_argument("--state", default="")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    model = torch_vectors(st.SentenceTransformerEmbedder(str(resolve_model_path("all-MiniLM-L6-v2"))))
    extra: dict[str, Any] = {}
    if args.store:
        extra["store"] = StoreSettings(url=args.store)
    if args.state:
        extra["docstore"] = DocstoreSettings(url=args.state)
    service = Quarry(Settings(data_dir=Path(tempfile.mkdtemp(prefix="bench-shadow-")), **extra), embedder=model)
    name = f"shadow_{uuid.uuid4().hex[:6]}"
    service.create_collection(name)
    try:
        service.upsert(name, list(itertools.islice(read_documents(DATA), args.docs)))
        queries = [json.loads(line)["text"] for line in (DATA / "queries.jsonl").open()][: args.queries]
        started = rollout.start(service.view, name, mode="shadow", step_samples=10**9, shadow_rate=0.0)
        for query in queries:  # warm: every query embedded once (memoised), both versions loaded
            service.search(name, query, top_k=10)
        phase(service, name, queries, args.clients, 3.0)
        rows: list[dict[str, Any]] = []
        current = started
        load = [os.getloadavg()[0]]
        for r in range(args.rounds):
            order = ("off", "on") if r % 2 == 0 else ("on", "off")
            got: dict[str, float] = {}
            for arm in order:
                fresh = replace(current, shadow_rate=args.rate if arm == "on" else 0.0, updated_at=time.time())
                assert service.docstore.put_rollout(fresh)
                current = fresh
                used = cpu_s()
                got[arm] = phase(service, name, queries, args.clients, args.seconds)
                got[f"{arm}_cpu_ms"] = (cpu_s() - used) * 1000.0 / (got[arm] * args.seconds)
                print(f"round {r}: shadow {arm:3s} {got[arm]:8.1f} searches/s, {got[f'{arm}_cpu_ms']:.2f} ms CPU "
                      "per search (process and Milvus Lite)", flush=True)
            rows.append({"round": r, **got, "ratio": got["on"] / got["off"]})
            print(f"round {r}: on/off {rows[-1]['ratio']:.3f}", flush=True)
        load.append(os.getloadavg()[0])
        info = rollout.describe(service.view, name) or {}
        pooled = sum(x["on"] for x in rows) / sum(x["off"] for x in rows)  # equal phase lengths: total searches
        cpu = sum(x["on_cpu_ms"] for x in rows) / sum(x["off_cpu_ms"] for x in rows)
        summary = {"median_ratio": statistics.median(x["ratio"] for x in rows), "pooled_ratio": pooled,
                   "cpu_per_search_ratio": cpu, "rounds": rows, "load_1min": load,
                   "shadow": info.get("shadow"), "window": info.get("window"), "clients": args.clients,
                   "rate": args.rate, "docs": args.docs, "seconds": args.seconds}
        print(f"median on/off {summary['median_ratio']:.3f}, pooled {pooled:.3f}; CPU per search on/off {cpu:.3f}; "
              f"load {load[0]:.1f} -> {load[1]:.1f}; shadow searches run/skipped: {summary['shadow']}")
        if args.json:
            args.json.write_text(json.dumps(summary, indent=2))
        rollout.abort(service.view, name, wait=True)
    finally:
        service.drop_collection(name)
        service.close()


if __name__ == "__main__":
    main()
