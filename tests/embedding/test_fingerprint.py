"""Model fingerprints: the bytes that decide the output, cached by path, size and mtime."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from embedding import fingerprint as fp


def _folder(path: Path, weights: bytes = b"\x01" * 4096) -> Path:
    (path / "1_Pooling").mkdir(parents=True)
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]))
    (path / "config.json").write_text('{"hidden_size": 8}')
    (path / "tokenizer.json").write_text("{}")
    (path / "model.safetensors").write_bytes(weights)
    (path / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (path / "README.md").write_text("a model")
    return path


def test_the_same_files_anywhere_give_the_same_fingerprint_and_any_changed_byte_another(tmp_path: Path) -> None:
    one = _folder(tmp_path / "one" / "all-MiniLM-L6-v2")
    same = fp.folder_fingerprint(one)
    assert same.startswith("sha256:") and fp.folder_fingerprint(shutil.copytree(one, tmp_path / "elsewhere")) == same
    (one / "README.md").write_text("notes do not change what the model computes")
    assert fp.folder_fingerprint(one) == same
    other = _folder(tmp_path / "two" / "all-MiniLM-L6-v2", weights=b"\x01" * 4095 + b"\x02")
    assert fp.folder_fingerprint(other) != same
    (one / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    assert fp.folder_fingerprint(one) != same


def test_digests_are_cached_and_a_rewritten_file_is_hashed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, cache = _folder(tmp_path / "m"), tmp_path / "cache"
    first = fp.folder_fingerprint(folder, cache)
    assert len(json.loads((cache / fp.CACHE_FILE).read_text())) == 5  # modules, 2 configs, tokenizer, weights
    hashed: list[Path] = []
    real = fp._sha256
    monkeypatch.setattr(fp, "_sha256", lambda path: hashed.append(path) or real(path))
    assert fp.folder_fingerprint(folder, cache) == first and hashed == []  # all from the cache
    weights = folder / "model.safetensors"
    weights.write_bytes(b"\x03" * 4096)  # same size, new bytes, new mtime
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert fp.folder_fingerprint(folder, cache) != first and hashed == [weights]


def test_an_unwritable_cache_only_costs_a_rehash(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m")
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    assert fp.folder_fingerprint(folder, blocked) == fp.folder_fingerprint(folder)


def test_a_served_model_is_known_by_the_fingerprint_it_publishes_else_by_name_version_and_config() -> None:
    from embedding.triton import parse_triton_url, served_fingerprint
    from embedding.triton_protocol import ModelSpec

    spec = ModelSpec("text", "embedding", "truncated", 384, 64, {"model_id": "all-MiniLM-L6-v2"})
    latest, v2 = parse_triton_url("triton+grpc://h:8001/minilm"), parse_triton_url("triton+grpc://h:8001/minilm/2")
    assert served_fingerprint(latest, spec).startswith("triton:sha256:")
    assert served_fingerprint(latest, spec) != served_fingerprint(v2, spec)
    other_config = ModelSpec("text", "embedding", "truncated", 384, 64, {"model_id": "all-MiniLM-L6-v2", "x": "1"})
    assert served_fingerprint(latest, other_config) != served_fingerprint(latest, spec)
    published = ModelSpec("text", "embedding", None, 384, 64, {"fingerprint": "sha256:abc"})
    assert served_fingerprint(latest, published) == served_fingerprint(v2, published) == "sha256:abc"
