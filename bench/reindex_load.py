"""Benchmark a reindex under load (issue 22, acceptance 1: zero downtime).

For each store (the embedded default, Milvus Lite + SQLite, and pgvector), a real
``quarry serve`` process over SciFact's first ``--docs`` documents:

1. answers the 300 SciFact test queries (hybrid and dense, ``top_k`` 10) one at a time: the
   "before" answers;
2. is driven by 32 concurrent hybrid clients (wrk, bench/search.py's script: each non-2xx and
   each 200 whose ``degraded`` is not empty is counted) for ``--seconds``; ``--pre`` seconds in,
   ``POST /v1/collections/{name}/reindex`` starts an unchanged-model reindex, followed at
   ``GET /v1/jobs/{id}`` until it is done; the load must outlast it (``covered``);
3. answers the 300 queries again: the "after" answers, compared with the "before" ones up to
   ANN ties: a query's top-10 is the same when its ids are the same, or when every id in one
   list and not the other scores within ``--tie`` of that list's 10th score (a neighbour at the
   boundary that an equal score could swap).

Printed per round and store: requests, non-2xx, transport errors, degraded answers, req/s, the
reindex's wall time, whether the load covered it, and the top-10 comparison (identical, same up
to ties, different) for hybrid and dense. Zero downtime means 0 non-2xx, 0 errors, 0 degraded,
and 300/300 same.

    python bench/reindex_load.py [--docs 600] [--stores milvus-lite,pgvector,milvus-server] [--rounds 1]
                                 [--seconds 60] [--data-dir DIR] [--json FILE]

``--writes`` measures writes during a reindex build instead (no search load): one writer sends
write requests back to back, ``--write-gap`` seconds apart, alternately deleting a document
(``POST .../documents/delete``) and writing it back (``POST .../documents``, one model call),
first while the server is idle ("idle" phase, ``--idle-s`` seconds), then while an
unchanged-model reindex runs, from its start until its job is done ("build" phase); the next
round takes the phases in the other order (the machine drifts). Printed per phase: the writes,
their p50, p99 and max latency (ms), and for the build phase the writes still running when the
build ended; per round the p99 ratio build/idle, and pooled over the rounds. After the last
round the collection's document count must be what it was (every delete was written back). A
build that has not ended after ``--build-cap-s`` (writes that keep it replaying) stops the
writer; ``writer_capped`` and how long the build took after that are printed.

    python bench/reindex_load.py --writes --stores milvus-server --docs 1000 --rounds 4 --data-dir DIR

``--data-dir`` keeps each store's data (``DIR/<store>``, the collection name in
``DIR/<store>/collection.txt``, a marker ``ingested-<docs>``) so that a re-run ingests nothing;
other ``QUARRY_*`` settings are inherited.

Measured 2026-12-03 (shared 2-core machine, torch MiniLM, default settings)::

    python bench/reindex_load.py --docs 600 --stores milvus-lite --seconds 40 --pre 5 --data-dir DIR

Milvus Lite + SQLite, 600 docs / 854 chunks: 2,605 requests at 65.0 req/s (p99 949 ms), 0 non-2xx,
0 transport errors, 0 degraded; the reindex took 2.66 s inside the load; top-10 of the 300
queries identical before and after (hybrid 300/300, dense 300/300). pgvector (``--docs 300
--stores pgvector``), 437 chunks: 3,307 requests at 82.6 req/s (p99 689 ms), 0 non-2xx, 0
transport, 0 degraded; reindex 0.99 s inside the load; top-10 300/300 identical (hybrid, dense).

``--writes`` on the Milvus server 2.3.5 (SQLite docstore, 1,000 docs, 4 rounds, builds of
17.9-18.7 s): write p99 idle 482 ms, during a build 880 ms, pooled ratio 1.82 (rounds 2.17, 2.04,
1.83, 1.80); p50 68 vs 87 ms; 0 failed writes; document count unchanged.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.monitor import ingest  # noqa: E402
from bench.search import load_wrk  # noqa: E402
from eval.beir import load_split  # noqa: E402
from indexing.sources import iter_jsonl  # noqa: E402
from tests.serve import QuarryServer  # noqa: E402

PG_URL = "postgresql://postgres@127.0.0.1:5433/quarry"
MILVUS_URL = "milvus://127.0.0.1:19530"
Answers = list[list[tuple[str, float]]]  # per query: (chunk id, score), best first


def answers(base: str, queries: list[str], mode: str) -> Answers:
    """Each query's top-10 ``(chunk_id, score)`` in ``mode``, asked one at a time.

    Raises:
        RuntimeError: An answer was not a 200 or was degraded.
    """
    out = []
    with httpx.Client(timeout=60) as http:
        for q in queries:
            r = http.post(f"{base}/search", json={"query": q, "top_k": 10, "mode": mode})
            if r.status_code != 200 or r.json()["degraded"]:
                raise RuntimeError(f"{mode} query {q!r}: {r.status_code} {r.json().get('degraded') or r.text[:300]}")
            out.append([(h["chunk_id"], h["score"]) for h in r.json()["hits"]])
    return out


def same_up_to_ties(a: list[tuple[str, float]], b: list[tuple[str, float]], tie: float) -> bool:
    """Whether two top-k lists hold the same ids, but for neighbours tied at the boundary."""
    ids_a, ids_b = {i for i, _ in a}, {i for i, _ in b}
    if ids_a == ids_b:
        return True
    if len(a) != len(b):
        return False
    for mine, other in ((a, ids_b), (b, ids_a)):
        kth = mine[-1][1]
        if any(abs(s - kth) > tie for i, s in mine if i not in other):
            return False
    return True


def compare(before: Answers, after: Answers, tie: float) -> dict[str, int]:
    """Counts of queries whose top-10 is identical (ids and order), the same up to ties, different."""
    identical = sum(1 for a, b in zip(before, after, strict=True) if [i for i, _ in a] == [i for i, _ in b])
    same = sum(1 for a, b in zip(before, after, strict=True) if same_up_to_ties(a, b, tie))
    return {"queries": len(before), "identical": identical, "same_up_to_ties": same, "different": len(before) - same}


def reindex(base_url: str, collection: str, delay_s: float, out: dict[str, Any]) -> None:
    """After ``delay_s``, start a reindex and follow its job; its state and wall time go into ``out``."""
    time.sleep(delay_s)
    with httpx.Client(base_url=base_url, timeout=60) as http:
        started = time.perf_counter()
        r = http.post(f"/v1/collections/{collection}/reindex", json={})
        r.raise_for_status()
        job = r.json()
        while job["state"] in ("queued", "running"):
            time.sleep(0.25)
            job = http.get(f"/v1/jobs/{job['id']}").json()
        out.update(reindex_s=round(time.perf_counter() - started, 2), state=job["state"], error=job["error"],
                   counters=job["counters"], ended=time.perf_counter())


def store_env(store: str, data_dir: Path) -> tuple[dict[str, str], str]:
    """The server's environment for ``store`` and its collection name (kept in the data folder)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "QUARRY_DATA_DIR": str(data_dir)}
    if store == "pgvector":
        env["QUARRY_STORE__URL"] = os.environ.get("QUARRY_BENCH_PG_URL", PG_URL)
    elif store == "milvus-server":
        env["QUARRY_STORE__URL"] = os.environ.get("QUARRY_BENCH_MILVUS_URL", MILVUS_URL)
    data_dir.mkdir(parents=True, exist_ok=True)
    name_file = data_dir / "collection.txt"
    if not name_file.exists():  # a name of its own: the pgvector database is shared
        name_file.write_text(f"reindex_load_{uuid.uuid4().hex[:8]}")
    return env, name_file.read_text().strip()


def one_round(args: argparse.Namespace, store: str, queries: list[str]) -> dict[str, Any]:
    """One store's round: before answers, reindex under load, after answers (see the module docstring)."""
    env, collection = store_env(store, args.data_dir / store)
    marker = args.data_dir / store / f"ingested-{args.docs}"
    if not marker.exists():  # a re-run embeds nothing, but starting the CLI's model costs minutes on a busy machine
        ingest(args.scifact, args.docs, env, collection)
        marker.touch()
    server = QuarryServer(env).wait_ready()
    try:
        root = server.url
        base = f"{root}/v1/collections/{collection}"
        for q in queries[:32]:  # warm-up: the first calls load the model and the collection (a cold start
            httpx.post(f"{base}/search", json={"query": q, "top_k": 10}, timeout=60)  # may degrade on a busy host)
        before = {m: answers(base, queries, m) for m in args.modes.split(",")}
        job: dict[str, Any] = {}
        worker = threading.Thread(target=reindex, args=(root, collection, args.pre, job))
        started = time.perf_counter()
        worker.start()
        load = load_wrk(f"{base}/search", queries, 32, args.seconds)
        load_end = time.perf_counter()
        worker.join()
        after = {m: answers(base, queries, m) for m in args.modes.split(",")}
        return {
            "store": store, "docs": args.docs, "chunks": job.get("counters", {}).get("total"),
            "requests": load["requests"], "rps": round(load["rps"], 1), "errors": load["errors"],
            "non2xx": load["non2xx"], "transport": load["transport"], "degraded": load["degraded"],
            "p99_ms": load["p99_ms"], "reindex_s": job.get("reindex_s"), "job": job.get("state"),
            "job_error": job.get("error"), "covered": job.get("ended", load_end + 1) <= load_end,
            "load_s": round(load_end - started, 1),
            **{f"{m}_top10": compare(before[m], after[m], args.tie) for m in before},
        }
    finally:
        server.stop()


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; 0 when empty."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def summary(latencies: list[float]) -> dict[str, Any]:
    """Count, p50, p99 and max of write latencies (ms)."""
    return {"writes": len(latencies), "p50_ms": round(percentile(latencies, 0.5), 1),
            "p99_ms": round(percentile(latencies, 0.99), 1), "max_ms": round(max(latencies, default=0.0), 1)}


class Writer:
    """Deletes a document and writes it back, alternately, one request at a time (see ``--writes``)."""

    def __init__(self, base: str, docs: list[dict[str, Any]], gap_s: float) -> None:
        self.base, self.docs, self.gap_s = base, docs, gap_s
        self.turn = 0
        self.http = httpx.Client(timeout=300)

    def one(self) -> tuple[float, float]:
        """Send the next write; returns its start and end (``time.perf_counter`` seconds).

        Raises:
            RuntimeError: The write was not a 200.
        """
        doc = self.docs[(self.turn // 2) % len(self.docs)]
        delete = self.turn % 2 == 0
        self.turn += 1
        started = time.perf_counter()
        if delete:
            r = self.http.post(f"{self.base}/documents/delete", json={"ids": [doc["id"]]})
        else:
            r = self.http.post(f"{self.base}/documents", json={"documents": [doc]})
        if r.status_code != 200:
            raise RuntimeError(f"write {'delete' if delete else 'upsert'} {doc['id']}: {r.status_code} {r.text[:300]}")
        return started, time.perf_counter()

    def until(self, stop: threading.Event | None, cap: float) -> list[tuple[float, float]]:
        """Write until ``stop`` is set or the ``perf_counter`` time ``cap`` passes, then finish the pair."""
        out = []
        while not (stop is not None and stop.is_set()) and time.perf_counter() < cap:
            out.append(self.one())
            time.sleep(self.gap_s)
        if self.turn % 2:  # a deleted document is written back
            out.append(self.one())
        return out


def write_phases(args: argparse.Namespace, store: str, round_no: int) -> dict[str, Any]:
    """One round of ``--writes``: an idle phase and a build phase, in turns (see the module docstring)."""
    env, collection = store_env(store, args.data_dir / store)
    marker = args.data_dir / store / f"ingested-{args.docs}"
    if not marker.exists():
        ingest(args.scifact, args.docs, env, collection)
        marker.touch()
    docs = [{"id": d.id, "title": d.title, "text": d.text}
            for d in itertools.islice(iter_jsonl(args.scifact / "corpus.jsonl"), 0, args.docs, 7)]
    server = QuarryServer(env).wait_ready()
    try:
        root = server.url
        base = f"{root}/v1/collections/{collection}"
        writer = Writer(base, docs, args.write_gap)
        writer.until(None, time.perf_counter() + 5)  # warm-up: the model, the collection, the connections
        count = httpx.get(base, timeout=60).json()["documents"]
        phases: dict[str, Any] = {}
        raw: dict[str, list[float]] = {}
        for phase in ("idle", "build") if round_no % 2 == 0 else ("build", "idle"):
            if phase == "idle":
                writes = writer.until(None, time.perf_counter() + args.idle_s)
                raw["idle"] = [(e - s) * 1000 for s, e in writes]
                phases["idle"] = summary(raw["idle"])
                continue
            job: dict[str, Any] = {}
            built = threading.Event()

            def follow(out: dict[str, Any] = job, done: threading.Event = built) -> None:
                try:
                    reindex(root, collection, 0.0, out)
                finally:
                    done.set()

            watcher = threading.Thread(target=follow)
            watcher.start()
            cap = time.perf_counter() + args.build_cap_s
            writes = writer.until(built, cap)
            capped = not built.is_set()
            watcher.join()
            ended = job.get("ended", time.perf_counter())
            raw["build"] = [(e - s) * 1000 for s, e in writes if s < ended]
            phases["build"] = {
                **summary(raw["build"]),
                "still_running_at_end": sum(1 for s, e in writes if s < ended < e),
                "writer_capped": capped,
                "ended_after_writes_stopped_s": round(max(0.0, ended - cap), 1) if capped else 0.0,
                "reindex_s": job.get("reindex_s"), "job": job.get("state"), "job_error": job.get("error"),
                "replayed": job.get("counters", {}).get("replayed"),
            }
        after = httpx.get(base, timeout=60).json()["documents"]
        idle, build = phases["idle"]["p99_ms"], phases["build"]["p99_ms"]
        return {"round": round_no + 1, "store": store, "docs": args.docs, **phases,
                "p99_ratio": round(build / idle, 2) if idle else None, "documents_before": count,
                "documents_after": after, "latencies_ms": raw}
    finally:
        server.stop()


def main() -> None:
    """Run the benchmark (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scifact", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--docs", type=int, default=600, help="SciFact's first N documents")
    parser.add_argument("--stores", default="milvus-lite,pgvector")
    parser.add_argument("--rounds", type=int, default=1, help="rounds, each running every store in turn")
    parser.add_argument("--seconds", type=float, default=60.0, help="duration of the load (must outlast the reindex)")
    parser.add_argument("--pre", type=float, default=5.0, help="seconds of load before the reindex starts")
    parser.add_argument("--tie", type=float, default=1e-4, help="score tolerance of a tie at the 10th place")
    parser.add_argument("--modes", default="hybrid,dense", help="modes whose top-10 are compared")
    parser.add_argument("--data-dir", type=Path, default=None, help="kept data (default: a temporary folder)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--writes", action="store_true", help="measure write latency during a build vs idle")
    parser.add_argument("--write-gap", type=float, default=0.05, help="seconds between two writes")
    parser.add_argument("--idle-s", type=float, default=20.0, help="length of the idle write phase")
    parser.add_argument("--build-cap-s", type=float, default=120.0,
                        help="stop writing after this long if the build has not ended (it may wait for the writes)")
    args = parser.parse_args()
    args.data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="quarry-reindex-load-"))
    queries = list(load_split(args.scifact, "test").queries.values())
    stores = args.stores.split(",")
    rounds = []
    if args.writes:
        for r in range(args.rounds):
            for store in stores:
                rounds.append(write_phases(args, store, r))
                print(json.dumps({k: v for k, v in rounds[-1].items() if k != "latencies_ms"}), flush=True)
        for store in stores:
            mine = [r for r in rounds if r["store"] == store]
            pooled = {ph: summary([x for r in mine for x in r["latencies_ms"][ph]]) for ph in ("idle", "build")}
            ratios = sorted(r["p99_ratio"] for r in mine if r["p99_ratio"] is not None)
            ratio = pooled["build"]["p99_ms"] / max(pooled["idle"]["p99_ms"], 1e-9)
            print(json.dumps({"store": store, "pooled": pooled, "pooled_p99_ratio": round(ratio, 2),
                              "median_round_ratio": ratios[len(ratios) // 2] if ratios else None}), flush=True)
        if args.json:
            args.json.write_text(json.dumps({"rounds": rounds}, indent=2))
        return
    for r in range(args.rounds):
        for store in stores if r % 2 == 0 else stores[::-1]:
            rounds.append({"round": r + 1, **one_round(args, store, queries)})
            print(json.dumps(rounds[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
