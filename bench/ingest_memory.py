"""Peak memory of ``quarry ingest`` on a small and a 10x larger synthetic corpus (issue 23, bounded memory).

Ingestion streams its source (:class:`indexing.sources.Source`) and writes batch by batch, so
the peak resident set of the ``quarry ingest`` process should not grow with the corpus. This
writes two JSONL corpora of short synthetic documents (``--small``, default 10,000, and
``--large``, default 100,000; ~12 words each from a 5,000-word vocabulary, deterministic), runs
``python -m quarry.cli ingest FILE --json`` on each in a fresh data dir (Milvus Lite, the
default store) with the ONNX int8 embedder (``QUARRY_EMBEDDING__URL=onnx://all-MiniLM-L6-v2?quantize=int8``,
exported once into a shared cache dir before the timed runs), and reports for each:

* ``peak_rss_mib``: ``ru_maxrss`` of the ``quarry ingest`` process from ``os.wait4`` (the
  kernel's high-water mark for that process; Milvus Lite's server is a child it does not wait
  for, so this is the Python process itself);
* ``stream_peak_rss_mib``: the process's RSS high-water mark (polled every 0.2 s) when the last
  batch was reported: reading, chunking, embedding and writing, before the run's end, where the
  BM25 snapshot of the whole collection is rebuilt in memory (bm25s holds the index in RAM, so
  that step grows with the collection by design; it is what separates the two peaks);
* ``tree_peak_rss_mib``: the largest sum of RSS over the process and its descendants seen by
  polling every 0.2 s (psutil), which includes the Milvus Lite server and grows with the data it
  holds: reported, not the target;
* wall seconds and documents per second.

The figure of merit is ``ratio = peak_rss(large) / peak_rss(small)``; the target is <= 1.2.

Measured 2026-12-03 (2 shared cores, load from other agents): 10k vs 100k documents, whole-run
peak 279.8 vs 494.8 MiB (ratio 1.768: the target is not met), 51.5 and 49.2 docs/s; the 100k
process sat at ~285 MiB during streaming (ps at ~90k docs). 2k vs 20k with the split: streaming
peak 266.8 vs 267.8 MiB (stream_ratio 1.004), whole run 267.4 vs 300.9 MiB (1.125). The growth is
the end-of-run BM25 rebuild (``BM25Registry.invalidate`` reads every row of the collection).

Re-measured 2026-12-03 after BM25 became incremental (indexing/bm25_live.py), same command:
before the fix 321.0 vs 614.1 MiB (ratio 1.913; streaming 302.6 vs 318.5, 1.053): the live index
was still built whole from the docstore's rows at the run's end. ``quarry ingest`` now marks its
registry lazy (``BM25Registry.lazy``: a process that does not search leaves an index it never
loaded to the next reader, a server's start, which loads its snapshot and replays the change log
or builds it). After: 302.8 vs 319.0 MiB, **ratio 1.054** (target <= 1.2), stream_ratio 1.054,
tree_ratio 1.478 (Milvus Lite's server, which holds the data); 66.6 and 54.4 docs/s (contended).

    python bench/ingest_memory.py [--small 10000] [--large 100000] [--json FILE] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ONNX_URL = "onnx://all-MiniLM-L6-v2?quantize=int8"


def write_corpus(path: Path, n: int, seed: int = 7) -> Path:
    """``n`` documents ``{"id", "text"}`` of 8-16 words each (one line each, streamed to disk)."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ter", "sun", "dar", "vel", "op", "ri", "na", "quo", "ze"]
    vocab = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) for _ in range(8000)})[:5000]
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            words = " ".join(rng.choice(vocab) for _ in range(rng.randint(8, 16)))
            fh.write(json.dumps({"id": f"doc{i:07d}", "text": words}) + "\n")
    return path


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def run_ingest(corpus: Path, data_dir: Path, cache_dir: Path, collection: str) -> dict[str, Any]:
    """One ``quarry ingest --json`` child: its peak RSS (wait4), the tree's polled peak, its report."""
    env = {
        **os.environ, "QUARRY_DATA_DIR": str(data_dir), "QUARRY_EMBEDDING__URL": ONNX_URL,
        "QUARRY_EMBEDDING__CACHE_DIR": str(cache_dir), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
    }
    started = time.perf_counter()
    child = subprocess.Popen(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "quarry.cli", "ingest", str(corpus), "-c", collection, "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    tree_peak, own_peak = [0], [0]
    done = threading.Event()

    def poll() -> None:
        proc = psutil.Process(child.pid)
        while not done.wait(0.2):
            try:
                own_peak[0] = max(own_peak[0], proc.memory_info().rss)
                tree_peak[0] = max(tree_peak[0], _tree_rss(proc))
            except psutil.Error:
                return

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    assert child.stdout is not None
    lines, stream_peak = [], 0
    for line in child.stdout:  # the peak seen when the last batch is reported: the streaming phase
        lines.append(line)
        if '"event": "progress"' in line:
            stream_peak = own_peak[0]
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    poller.join()
    wall = time.perf_counter() - started
    report = json.loads(lines[-1]) if lines else {}
    if child.returncode != 0:
        raise SystemExit(f"quarry ingest {corpus} exited {child.returncode}: {lines[-1:] or 'no output'}")
    return {
        "documents": report.get("kept"), "embedded": report.get("embedded"),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),  # ru_maxrss is KiB on Linux
        "stream_peak_rss_mib": round(stream_peak / 2**20, 1),
        "tree_peak_rss_mib": round(tree_peak[0] / 2**20, 1), "wall_s": round(wall, 1),
        "docs_per_s": round((report.get("kept") or 0) / wall, 1),
    }


def warm_cache(cache_dir: Path, work: Path) -> None:
    """Export the ONNX int8 model into ``cache_dir`` once, outside the measured runs."""
    run_ingest(write_corpus(work / "warm.jsonl", 10), work / "warm-data", cache_dir, "warm")


def main() -> None:
    """Run both sizes and print (and optionally write) the figures and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--json", type=Path, help="Write the results here.")
    parser.add_argument("--keep", type=Path, help="Work in this folder and keep it (default: a temp dir).")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="quarry-ingest-mem-"))
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "models"
    warm_cache(cache, work)
    results: dict[str, Any] = {"embedder": ONNX_URL, "store": "milvus lite (default)", "cpus": os.cpu_count()}
    for label, n in (("small", args.small), ("large", args.large)):
        corpus = write_corpus(work / f"corpus-{n}.jsonl", n)
        results[label] = {"corpus_docs": n, **run_ingest(corpus, work / f"data-{n}", cache, f"mem{n}")}
        print(json.dumps({label: results[label]}), flush=True)
    results["ratio"] = round(results["large"]["peak_rss_mib"] / results["small"]["peak_rss_mib"], 3)
    results["stream_ratio"] = round(
        results["large"]["stream_peak_rss_mib"] / results["small"]["stream_peak_rss_mib"], 3
    )
    results["tree_ratio"] = round(results["large"]["tree_peak_rss_mib"] / results["small"]["tree_peak_rss_mib"], 3)
    results["target"] = "ratio <= 1.2"
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
