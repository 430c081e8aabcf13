"""Issue 23, no downtime on the embedded default: ``quarry ingest LOCAL --server`` against a real ``quarry serve``.

One server (Milvus Lite, SQLite docstore, the packaged MiniLM) holds the data dir; the CLI, in
another process, reads a local ``.jsonl`` file and streams it through the jobs API (an NDJSON
upload job): exit 0, every document written, no spool left. A local folder with a file that
cannot be decoded, under ``QUARRY_INGEST__ON_ERROR=fail``, stops the upload mid-body: exit 2,
nothing of it kept on the server, and the server logs no 500 for a client that went away.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.core.test_ingest_jobs_kill import REPO, Server


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "quarry.cli", "ingest", *args], capture_output=True, text=True, timeout=300,
        check=False, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def test_the_cli_streams_a_local_source_to_a_running_server(tmp_path: Path) -> None:
    data, root = tmp_path / "data", tmp_path / "root"
    root.mkdir()
    server = Server(data, root, tmp_path / "server.log")
    try:
        url = server.server.url
        assert server.client.post("/v1/collections", json={"name": "nightly"}).status_code == 201
        local = tmp_path / "local.jsonl"
        local.write_text("".join(
            json.dumps({"id": f"n{i}", "text": f"Nightly note {i} on tides, harbours and ferry number {i}."}) + "\n"
            for i in range(40)
        ), encoding="utf-8")
        done = _cli(str(local), "-c", "nightly", "--server", url, "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout.splitlines()[-1])
        assert (report["status"], report["added"], report["total"]) == ("ok", 40, 40), report
        assert server.client.get("/v1/collections/nightly").json()["documents"] == 40
        deadline = time.monotonic() + 10  # the spool goes as the worker lets the job go, just after "done"
        while list((data / "jobs").iterdir()):
            assert time.monotonic() < deadline, list((data / "jobs").iterdir())
            time.sleep(0.1)

        folder = tmp_path / "folder"
        folder.mkdir()
        (folder / "a.txt").write_text("Readable notes about estuaries.", encoding="utf-8")
        (folder / "b.txt").write_bytes(b"\xff\xfe not utf-8")
        failed = _cli(str(folder), "-c", "nightly", "--server", url, env={"QUARRY_INGEST__ON_ERROR": "fail"})
        assert failed.returncode == 2, failed.stderr
        assert "b.txt" in failed.stderr and "UTF-8" in failed.stderr
        assert server.client.get("/v1/collections/nightly").json()["documents"] == 40
        assert list((data / "jobs").iterdir()) == []  # the half-sent body was not kept
        assert server.client.get("/v1/collections/nightly/documents/a.txt").status_code == 404
    finally:
        server.stop()
    log = (tmp_path / "server.log").read_text(encoding="utf-8")
    assert "Exception in ASGI application" not in log and "ClientDisconnect" not in log, log[-3000:]
