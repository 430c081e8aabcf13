"""A model's identity: a digest of what it computes, not the name of its folder.

Two sentence-transformers folders give comparable vectors when the files that decide the
computation are the same: the module list, the configs, the tokenizer and the weights. The
fingerprint is ``sha256:<hex>`` over those files' relative paths and SHA-256 digests, so
another model saved under the folder name ``all-MiniLM-L6-v2`` has another fingerprint, and the
packaged model has the same one whether it is run by torch, exported to ONNX or served by
``quarry triton serve``.

Hashing MiniLM's 90 MB of weights takes a few hundred milliseconds, so each file's digest is
cached in ``<cache_dir>/file-digests.json`` under its path, size and modification time; a
file that changed is hashed again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from embedding.st_layout import WEIGHT_FILES

log = logging.getLogger(__name__)

# Files of a module folder that decide what the model computes (configs, tokenizer, weights);
# READMEs, training notes and other exports (onnx/, openvino/) do not.
CONFIG_FILES = frozenset({
    "modules.json", "config.json", "config_sentence_transformers.json", "sentence_bert_config.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model",
})
CACHE_FILE = "file-digests.json"
_cache_lock = threading.Lock()


def model_files(root: Path) -> list[Path]:
    """The files of a sentence-transformers (or plain Hugging Face) folder that decide its output.

    The root and every module folder listed in ``modules.json`` contribute their config and
    tokenizer files and their first weight file in :data:`~embedding.st_layout.WEIGHT_FILES`
    order (the one that loads).
    """
    folders = [root]
    try:
        modules = json.loads((root / "modules.json").read_text(encoding="utf-8"))
        folders += [root / str(m.get("path", "")) for m in modules if isinstance(m, dict)]
    except (OSError, ValueError, TypeError, AttributeError):
        pass  # no modules.json: a plain Hugging Face folder, read as a whole by sentence-transformers
    files: list[Path] = []
    for folder in dict.fromkeys(f.resolve() for f in folders):
        if not folder.is_dir():
            continue
        files += sorted(p for p in folder.iterdir() if p.name in CONFIG_FILES and p.is_file())
        weights = next((folder / w for w in WEIGHT_FILES if (folder / w).is_file()), None)
        if weights is not None:
            files.append(weights)
    return files


def folder_fingerprint(root: Path, cache_dir: Path | None = None) -> str:
    """``sha256:<64 hex>`` of a model folder's :func:`model_files` (relative paths and bytes).

    Args:
        root: The model folder.
        cache_dir: Where :data:`CACHE_FILE` keeps file digests between runs; ``None``: no cache.

    Returns:
        The fingerprint; the same files give the same value wherever the folder lies.

    Raises:
        OSError: A model file cannot be read.
    """
    root = root.resolve()
    files = model_files(root)
    digests = file_digests(files, cache_dir)
    outer = hashlib.sha256()
    for path in files:
        outer.update(f"{Path(os.path.relpath(path, root)).as_posix()}\t{digests[path]}\n".encode())
    return f"sha256:{outer.hexdigest()}"


def spec_fingerprint(kind: str, fields: dict[str, Any]) -> str:
    """``<kind>:sha256:<hex>`` of a JSON-able description of a model (e.g. a served model's config)."""
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return f"{kind}:sha256:{hashlib.sha256(blob.encode()).hexdigest()}"


def file_digests(files: Iterable[Path], cache_dir: Path | None) -> dict[Path, str]:
    """SHA-256 (hex) of each file, read from the cache when its size and mtime are unchanged."""
    cache_path = cache_dir / CACHE_FILE if cache_dir is not None else None
    with _cache_lock:
        cache = _load(cache_path)
        out, changed = {}, False
        for path in files:
            stat = path.stat()
            key, stamp = str(path.resolve()), [stat.st_size, stat.st_mtime_ns]
            hit = cache.get(key)
            if isinstance(hit, dict) and hit.get("stamp") == stamp and isinstance(hit.get("sha256"), str):
                out[path] = hit["sha256"]
                continue
            out[path] = _sha256(path)
            cache[key] = {"stamp": stamp, "sha256": out[path]}
            changed = True
        if changed and cache_path is not None:
            _store(cache_path, cache)
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _load(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _store(path: Path, cache: dict[str, Any]) -> None:
    """Write the cache atomically; a cache that cannot be written only costs a re-hash next time."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(cache, indent=0, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("cannot write the model digest cache %s: %s", path, exc)
        with contextlib.suppress(OSError):  # e.g. NotADirectoryError: there is no tmp to remove
            tmp.unlink(missing_ok=True)
