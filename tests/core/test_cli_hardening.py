"""Regression tests of issue 20, finding 11 and acceptance 4: one error line, unknown variables, config show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from quarry.settings import Settings, setting_fields, unknown_env
from tests.embedding_cache import MODEL_CACHE_ENV

REPO = Path(__file__).resolve().parents[2]


def _script(args: list[str], data_dir: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    """Run ``quarry`` as the installed console script does: ``pyproject.toml``'s entry point, called."""
    entry = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]["quarry"]
    module, function = entry.split(":")
    code = f"import sys; from {module} import {function}; sys.argv[0] = 'quarry'; sys.exit({function}())"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("QUARRY_") or k == MODEL_CACHE_ENV},
        "QUARRY_DATA_DIR": str(data_dir), "HF_HUB_OFFLINE": "1", "COLUMNS": "80", **extra_env,
    }
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300, cwd=REPO
    )


def _one_error_line(done: subprocess.CompletedProcess[str], needle: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and needle in errors[0], done.stderr


def test_a_bad_setting_is_one_error_line_from_every_command(tmp_path: Path) -> None:
    for args in (["collections", "list"], ["serve"], ["search", "x", "-c", "c"], ["config", "show"]):
        done = _script(args, tmp_path, QUARRY_SEARCH__CANDIDATES="abc")
        _one_error_line(done, "error (ConfigError): invalid settings: QUARRY_SEARCH__CANDIDATES")


def test_a_locked_store_is_one_error_line(tmp_path: Path) -> None:
    """Milvus Lite serves one process: a second one is told so in one line, not a 77-line traceback."""
    db = tmp_path / "quarry.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from stores.factory import open_store; import time; "
         f"open_store('milvus://{db}'); print('open', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        for args in (["collections", "list"], ["collections", "describe", "c"], ["serve", "--port", "18731"]):
            _one_error_line(_script(args, tmp_path), "error (StoreUnavailable): the Milvus Lite file")
    finally:
        holder.kill()
        holder.wait()


def test_unknown_quarry_variables_are_warned_about(tmp_path: Path) -> None:
    done = _script(["config", "show"], tmp_path, QUARRY_STORE_URL="postgresql://x", QUARRY_TEST_PG_URL="y")
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if line.startswith("warning")]
    assert warned == [
        "warning QUARRY_STORE_URL is not a Quarry setting and is ignored (did you mean QUARRY_STORE__URL?)"
    ]
    assert "QUARRY_STORE__URL=\n" in done.stdout  # the misspelt value set nothing


def test_known_variables_come_from_the_settings_model() -> None:
    known = {variable for variable, _ in setting_fields()}
    leaves = {
        f"QUARRY_{group.upper()}__{name.upper()}"
        for group, info in Settings.model_fields.items() if hasattr(info.annotation, "model_fields")
        for name in info.annotation.model_fields  # type: ignore[union-attr]
    }
    assert leaves <= known and {"QUARRY_DATA_DIR", "QUARRY_STORE", "QUARRY_API__MAX_BODY_BYTES"} <= known
    env = {"quarry_api__port": "1", "QUARRY_SEARCH__CANDIDATE": "5", "QUARRY_SERVICES_DIR": "/x", "PATH": "/"}
    assert unknown_env(env) == [("QUARRY_SEARCH__CANDIDATE", "QUARRY_SEARCH__CANDIDATES")]


def test_version(tmp_path: Path) -> None:
    done = _script(["--version"], tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("quarry "), done.stderr


def test_config_show_prints_the_effective_settings_with_secrets_redacted(tmp_path: Path) -> None:
    env = {"QUARRY_STORE__URL": "postgresql://quarry:hunter2@db:5432/q?api_key=k3y", "QUARRY_API__PORT": "9000"}
    done = _script(["config", "show"], tmp_path, **env)
    assert done.returncode == 0, done.stderr
    assert "hunter2" not in done.stdout and "k3y" not in done.stdout
    lines = done.stdout.splitlines()
    assert "QUARRY_STORE__URL=postgresql://quarry:***@db:5432/q?api_key=***" in lines
    assert "QUARRY_API__PORT=9000" in lines and "QUARRY_INGEST__MAX_TOKEN_CHARS=1024" in lines
    assert "QUARRY_RERANK__BUDGET_MS=2000.0" in lines  # a default
    as_json = json.loads(_script(["config", "show", "--json"], tmp_path, **env).stdout)
    assert as_json["settings"]["QUARRY_API__PORT"] == 9000
    assert as_json["effective"]["store"] == "postgresql://quarry:***@db:5432/q?api_key=***"


def test_an_unreadable_or_non_utf8_source_is_one_error_line(tmp_path: Path) -> None:
    """Review of issue 20: bytes that are not UTF-8, or a file that fails to read, used to be a traceback (exit 1)."""
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"id": "a", "text": "fine"}\n{"id": "b", "text": "\xff\xfe"}\n')
    _one_error_line(_script(["ingest", str(bad), "-c", "c"], tmp_path), "line 2")
    unreadable = tmp_path / "io.jsonl"
    unreadable.symlink_to("/proc/self/mem")  # readable by name, every read is an I/O error (even for root)
    _one_error_line(_script(["ingest", str(unreadable), "-c", "c"], tmp_path), "cannot be read")


def test_an_embedding_folder_that_is_not_a_model_is_one_error_line(tmp_path: Path) -> None:
    """Review of issue 20: ``QUARRY_EMBEDDING__URL=torch://<a folder without a model>`` was a traceback (exit 1)."""
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}", encoding="utf-8")
    source = tmp_path / "docs.jsonl"
    source.write_text('{"id": "a", "text": "some text"}\n', encoding="utf-8")
    done = _script(["ingest", str(source), "-c", "c"], tmp_path / "data", QUARRY_EMBEDDING__URL=f"torch://{folder}")
    _one_error_line(done, "error (ConfigError): cannot load the embedding model at")


def test_a_damaged_docstore_is_one_error_line_naming_it(tmp_path: Path) -> None:
    """Review of issue 20: a docstore.sqlite that is not a database was a 'DatabaseError' traceback (exit 1)."""
    tmp_path.joinpath("docstore.sqlite").write_bytes(b"\x8f not SQLite " * 400)
    for args in (["collections", "list"], ["serve", "--port", "18733"]):
        done = _script(args, tmp_path)
        _one_error_line(done, "error (StoreError): cannot open the docstore")
        assert "docstore.sqlite" in done.stderr


def test_no_variable_the_projects_own_scripts_read_is_warned_about() -> None:
    """A QUARRY_* variable of scripts/, model_repository/ or the compose files is known, not 'unknown'."""
    import re

    repo = Path(__file__).resolve().parents[2]
    files = [*repo.joinpath("scripts").rglob("*"), *repo.joinpath("model_repository").rglob("*.py")]
    files += [repo / "Dockerfile", repo / "docker-compose.yml", repo / ".ci" / "run"]
    named = set()
    for path in files:
        if path.is_file():
            named |= set(re.findall(r"\bQUARRY_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))
    assert len(named) > 20
    assert unknown_env({name: "1" for name in sorted(named)}) == []


def test_stored_data_that_no_longer_validates_is_not_called_a_setting() -> None:
    """A collection config with ``dim: 0`` (left by a cold `quarry rollback`) was reported as
    ``invalid settings: QUARRY_DIM``, a variable that does not exist."""
    from pydantic import ValidationError

    from indexing.collections import CollectionConfig
    from quarry.cli import settings_error, stored_error

    try:
        CollectionConfig.model_validate(
            {"name": "c", "dim": 0, "embedding_model": "m", "chunk_size": 256, "chunk_overlap": 32})
    except ValidationError as exc:
        stored = stored_error(exc)
    else:
        raise AssertionError("dim 0 validated")
    assert stored.startswith("stored CollectionConfig is invalid: dim: ") and "QUARRY_" not in stored
    try:
        Settings.model_validate({"search": {"candidates": "abc"}})
    except ValidationError as exc:
        assert settings_error(exc).startswith("invalid settings: QUARRY_SEARCH__CANDIDATES")
