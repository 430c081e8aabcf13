"""``quarry serve --workers N``: refused on one-process backends, served on shared ones.

The served case runs two uvicorn workers on a PostgreSQL docstore (a schema of its own) and the
pgvector store (a collection of its own), each worker with the packaged MiniLM: a document
written through one request is found by the next requests, whichever worker answers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from quarry.api.workers import share_cores
from tests.embedding_cache import MODEL_CACHE_ENV
from tests.serve import QuarryServer
from tests.state.conftest import PG_URL, pg_schema

REPO = Path(__file__).resolve().parents[2]


def _serve(args: list[str], data_dir: Path, **extra_env: str) -> QuarryServer:
    """``quarry serve *args`` on ``data_dir``, started (not yet ready); its output goes to ``data_dir/serve.log``."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("QUARRY_") or k == MODEL_CACHE_ENV},
        "QUARRY_DATA_DIR": str(data_dir), "HF_HUB_OFFLINE": "1", "COLUMNS": "80", "PYTHONPATH": str(REPO),
        **extra_env,
    }
    return QuarryServer(env, args=args, log=data_dir / "serve.log", cwd=REPO)


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({}, "needs a vector store server"),
        ({"QUARRY_STORE__URL": "milvus://127.0.0.1:19530"}, "needs a shared docstore: set QUARRY_DOCSTORE__URL"),
    ],
)
def test_workers_on_one_process_backends_are_one_error_line(tmp_path: Path, env: dict[str, str], needle: str) -> None:
    done = _serve(["--workers", "2"], tmp_path, **env)
    done.proc.wait(timeout=120)
    out = done.output()
    assert done.proc.returncode == 2, out
    errors = [line for line in out.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "error (ConfigError): --workers > 1" in errors[0] and needle in out, out


@pytest.mark.integration
def test_two_workers_on_shared_backends_serve_each_others_writes(tmp_path: Path) -> None:
    with pg_schema() as state_url:
        _two_workers(tmp_path, state_url)


def _two_workers(tmp_path: Path, state_url: str) -> None:
    name = f"workers_{uuid.uuid4().hex[:10]}"
    server = _serve(
        ["--workers", "2"], tmp_path, QUARRY_STORE__URL=PG_URL, QUARRY_DOCSTORE__URL=state_url,
        # each read checks the change log (by default the other worker may lag up to 1 s: test_replicas.py)
        QUARRY_BM25__MAX_STALENESS_S="0",
    )
    try:
        server.wait_ready(timeout_s=400, poll_s=1)
        # a connection per request, so that the kernel hands each to either worker
        no_reuse = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=server.url, timeout=60, limits=no_reuse) as client:
            assert client.post("/v1/collections", json={"name": name, "language": "en"}).status_code == 201
            try:
                for i in range(6):  # writes land on either worker
                    docs = [{"id": f"d{i}", "text": f"zebra{i} grazes near the river number {i}"}]
                    r = client.post(f"/v1/collections/{name}/documents", json={"documents": docs})
                    assert r.status_code == 200, r.text
                    for _ in range(4):  # and each is read by whichever worker answers next
                        hits = client.post(
                            f"/v1/collections/{name}/search", json={"query": f"zebra{i}", "mode": "bm25"}
                        ).json()["hits"]
                        assert [h["document_id"] for h in hits][:1] == [f"d{i}"], hits
            finally:
                client.delete(f"/v1/collections/{name}")
    finally:
        server.stop()
    out = server.output()
    assert out.count("Application startup complete") == 2, out  # two workers served


@pytest.mark.parametrize(("workers", "cores", "before", "after"), [
    (2, 2, None, "1"), (1, 2, None, "2"), (3, 2, None, "1"), (2, 16, None, "8"), (2, 2, "2", "2"),
])
def test_each_worker_gets_its_share_of_the_cores(workers: int, cores: int, before: str | None, after: str) -> None:
    """N workers with all cores each spin N x cores torch threads; an operator's own value stays."""
    environ = {} if before is None else {"OMP_NUM_THREADS": before}
    assert share_cores(workers, environ, cores=cores) == int(after)
    assert environ == {"OMP_NUM_THREADS": after}


def test_a_worker_process_starts_torch_with_its_share(tmp_path: Path) -> None:
    environ = dict(os.environ)
    environ.pop("OMP_NUM_THREADS", None)
    share_cores(2, environ, cores=2)
    code = "import torch; print(torch.get_num_threads())"
    out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
