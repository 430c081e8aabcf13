"""How closely an ingestion job can be watched: its progress cadence and its cancel latency, over HTTP.

A real ``quarry serve`` (the embedded default: Milvus Lite, SQLite, the packaged ONNX MiniLM) runs
one ingest job of the first ``--docs`` SciFact documents (a path job under ``QUARRY_INGEST__ROOTS``,
batches of ``QUARRY_INGEST__BATCH_SIZE`` = 512 by default). The client polls ``GET /v1/jobs/{id}``
every ``--poll-s`` and records when the record changed:

* **progress gap**: the longest time between two changes of any counter (documents parsed,
  chunks embedded inside the batch in flight, batches written) while the job runs: what a
  watcher sees move;
* **batch gap**: the longest time between two changes of ``done`` (committed documents only),
  which was all a job showed before progress inside a batch: the baseline of the same run;
* **cancel latency**: after ``--cancel-after-s`` of a second, identical job, the time from
  ``DELETE /v1/jobs/{id}`` to the record saying ``cancelled``.

    python bench/job_progress.py --docs 2000 --json /tmp/job_progress.json

Wall-clock figures of a shared machine: run it on an idle one for numbers to quote.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.serve import QuarryServer  # noqa: E402

SCIFACT = Path("/work/shared/data/scifact/corpus.jsonl")


def _watch(client: httpx.Client, job_id: str, poll_s: float, until: float | None = None) -> dict[str, Any]:
    """Poll the job until it ends (or ``until``, a monotonic time); the changes seen."""
    changes: list[float] = []
    done_changes: list[float] = []
    last: dict[str, int] | None = None
    start = time.monotonic()
    body: dict[str, Any] = {}
    while until is None or time.monotonic() < until:
        body = client.get(f"/v1/jobs/{job_id}").json()
        now = time.monotonic() - start
        counters = body["counters"]
        if last is None or counters != last:
            changes.append(now)
        if last is None or counters.get("done") != last.get("done"):
            done_changes.append(now)
        last = counters
        if body["state"] in ("done", "partial", "failed", "cancelled"):
            break
        time.sleep(poll_s)
    end = time.monotonic() - start

    def gap(times: list[float]) -> float:
        marks = [*times, end]
        return max(b - a for a, b in zip(marks, marks[1:], strict=False)) if len(marks) > 1 else end

    return {"state": body.get("state"), "seconds": round(end, 1), "progress_gap_s": round(gap(changes), 2),
            "batch_gap_s": round(gap(done_changes), 2), "updates_seen": len(changes), "counters": body.get("counters")}


def main() -> None:
    """Run the two jobs, print (and with ``--json`` write) the figures."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--poll-s", type=float, default=0.25)
    ap.add_argument("--cancel-after-s", type=float, default=20.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="job-progress-"))
    source = work / "root" / "scifact.jsonl"
    source.parent.mkdir()
    with SCIFACT.open(encoding="utf-8") as f:
        source.write_text("".join(line for _, line in zip(range(args.docs), f, strict=False)), encoding="utf-8")
    roots = json.dumps([str(source.parent)])
    env = {**os.environ, "QUARRY_DATA_DIR": str(work / "data"), "QUARRY_INGEST__ROOTS": roots}
    out: dict[str, Any] = {"docs": args.docs, "poll_s": args.poll_s}
    with QuarryServer(env, log=work / "serve.log").wait_ready() as server, httpx.Client(
        base_url=server.url, timeout=60
    ) as client:
        for name in ("watched", "cancelled"):
            assert client.post("/v1/collections", json={"name": name}).status_code == 201
        job = client.post("/v1/collections/watched/jobs", json={"path": source.name}).json()
        out["progress"] = _watch(client, job["id"], args.poll_s)
        job = client.post("/v1/collections/cancelled/jobs", json={"path": source.name}).json()
        _watch(client, job["id"], args.poll_s, until=time.monotonic() + args.cancel_after_s)
        asked = time.monotonic()
        client.delete(f"/v1/jobs/{job['id']}")
        while (body := client.get(f"/v1/jobs/{job['id']}").json())["state"] not in ("cancelled", "done"):
            time.sleep(0.05)
        out["cancel"] = {"latency_s": round(time.monotonic() - asked, 2), "state": body["state"],
                         "kept_documents": body["counters"].get("done"), "after_s": args.cancel_after_s}
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
