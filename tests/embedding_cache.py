"""Real model output, computed once: a per-text memo of an embedder's vectors, kept on disk.

Tests that need a model's vectors as *data* (the reference other backends are compared with,
the service's embedder in pipeline and quality tests) get them from :class:`CachedEmbedder`:
each distinct text goes through the real model once per machine; later calls, in this run or
the next, read the stored rows. Tests of an embedder's own behaviour use the model itself.

The cache is keyed by a fingerprint of everything that decides the output (:func:`fingerprint`):
the bytes of the model's files (not its folder's name), the source of the embedder's modules,
the versions of the libraries that run it, and its settings; any change is a fresh cache. Rows
live in one SQLite file per fingerprint under ``$QUARRY_TEST_EMBEDDING_CACHE`` (default
``~/.cache/quarry-tests/embeddings``; ``off`` keeps the memo in memory only).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import inspect
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

from embedding.base import Embedder, EmbedderWrapper, Embeddings

CACHE_ENV = "QUARRY_TEST_EMBEDDING_CACHE"
MODEL_CACHE_ENV = "QUARRY_EMBEDDING__CACHE_DIR"  # the setting every Quarry of the suite reads it from
_file_digests: dict[tuple[Path, int, int], str] = {}
_SLICE = 512  # texts a process embeds while it holds a cache's file lock
_TURN_S = 0.05  # pause between slices, so a process waiting for the lock gets it
_UNLOCKED = 16  # at most this many missing texts (a query, a few documents) run without the lock


def cache_dir() -> Path | None:
    """The folder of the on-disk cache, or ``None`` when ``$QUARRY_TEST_EMBEDDING_CACHE`` is ``off``."""
    value = os.environ.get(CACHE_ENV, "")
    if value.lower() in ("off", "0", "none"):
        return None
    if value:
        return Path(value)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "quarry-tests" / "embeddings"


def shared_model_cache() -> Path:
    """The one model cache (ONNX exports, file digests) of the test suite's Quarry instances.

    The default encoder is exported to ONNX on first use (~20 s here): with each test's own
    ``<data_dir>/models`` that export would run once per test (and per child process). Beside
    the vector memo, keyed by the export's code and the libraries that run it, so the suite
    exports once per machine; a temporary folder when the memo is ``off``.
    """
    memo = cache_dir()
    if memo is None:
        import tempfile

        return Path(tempfile.mkdtemp(prefix="quarry-test-models-"))
    from embedding import onnx_export

    digest = fingerprint({}, [onnx_export], ["torch", "transformers", "onnx", "onnxruntime"])
    return memo.parent / "models" / digest[:16]


def _file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, memoised per (path, size, mtime) for this process."""
    stat = path.stat()
    key = (path.resolve(), stat.st_size, stat.st_mtime_ns)
    if key not in _file_digests:
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        _file_digests[key] = digest.hexdigest()
    return _file_digests[key]


def fingerprint(
    files: dict[str, Path], code: Iterable[ModuleType], libraries: Iterable[str], **settings: object
) -> str:
    """A hex digest of what decides an embedder's output.

    Args:
        files: Name -> file (names are relative to the model, so the folder's name is not part
            of the key; the contents are).
        code: Modules whose source computes the vectors.
        libraries: Distributions whose version matters (``torch``, ``onnxruntime``...).
        settings: Anything else that changes the output (quantisation, device...).
    """
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(f"file {name} {_file_digest(files[name])}\n".encode())
    for module in sorted(code, key=lambda m: m.__name__):
        source = inspect.getsource(module).encode()
        digest.update(f"code {module.__name__} {hashlib.sha256(source).hexdigest()}\n".encode())
    for dist in sorted(libraries):
        digest.update(f"lib {dist} {importlib.metadata.version(dist)}\n".encode())
    for key in sorted(settings):
        digest.update(f"set {key} {settings[key]!r}\n".encode())
    return digest.hexdigest()


def folder_files(root: Path) -> dict[str, Path]:
    """Every file under a model folder, by its path relative to the folder."""
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}


def _key(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class CachedEmbedder(EmbedderWrapper):
    """An :class:`Embedder` that runs ``inner`` once per distinct text and remembers the rows.

    Rows are exactly what ``inner.embed`` returned for the text (vector and truncation flag).
    Thread-safe. With a ``path``, rows are also read from and written to that SQLite file
    (several processes may share it).
    """

    def __init__(self, inner: Embedder, path: Path | None) -> None:
        super().__init__(inner)
        self.path = path
        self.model_runs = 0  # texts that went through the model (not found in the cache)
        self._rows: dict[bytes, tuple[np.ndarray, bool]] = {}
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._loaded = False

    def embed_queries(self, texts: Sequence[str]) -> Embeddings:
        """A model whose queries embed as its documents (one prefix or none) shares the rows; else no memo."""
        card = self.inner.card
        if card.query_prefix == card.passage_prefix:
            return self.embed(texts)
        return self.inner.embed_queries(texts)

    def warm_up(self) -> None:
        self.inner.warm_up()
        with self._lock:
            if not self._loaded:
                self._open()
                self._loaded = True

    def _open(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=120, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS rows (key BLOB PRIMARY KEY, vector BLOB NOT NULL, truncated INTEGER NOT"
                " NULL) WITHOUT ROWID"
            )
            for key, blob, truncated in db.execute("SELECT key, vector, truncated FROM rows"):
                vector = np.frombuffer(blob, dtype=np.float32)
                if vector.shape == (self.dim,):
                    self._rows[key] = (vector, bool(truncated))
        except sqlite3.DatabaseError as exc:
            db.close()
            raise RuntimeError(
                f"test embedding cache {self.path} is unreadable ({exc}); delete it or set {CACHE_ENV}=off"
            ) from exc
        self._db = db

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """Rows for ``texts``: from the cache, else from ``inner.embed`` on the missing ones.

        Up to 16 missing texts run at once without the file lock; more run in slices of 512, one
        process at a time.
        """
        self.warm_up()
        if not texts or not all(isinstance(t, str) for t in texts):
            return self.inner.embed(texts)  # nothing to remember (an empty call, or bad input to fail on)
        keys = [_key(t) for t in texts]
        with self._lock:
            missing = {k: t for k, t in zip(keys, texts, strict=True) if k not in self._rows}
        # One process at a time runs the model for this cache, a slice of texts at a time: pytest-xdist
        # workers that need the same texts (the torch SciFact pass of test_quality and test_onnx)
        # read the rows another stored instead of computing them again, and one that needs a few
        # texts waits for one slice, not for another's whole corpus.
        # flock wakes a waiter on release but does not hand it the lock: a holder that takes it again
        # at once keeps it, and a worker needing 1,000 short texts waited 130 s behind the SciFact
        # pass (a cold run, 3 workers). A pause between slices lets a waiter take its turn.
        # A handful of texts (a query) runs without the lock: waiting for another's slice took
        # longer than a REST query's deadline, and two processes embedding one query twice cost
        # nothing (INSERT OR IGNORE keeps the first row, and both then use it).
        todo = list(missing.items())
        if len(todo) <= _UNLOCKED:
            if todo and (remaining := self._stored(dict(todo))):
                self._run(remaining)
                # another process may have stored some first (in a batch padded differently):
                # every process uses the stored row
                self._stored(remaining)
            todo = []
        for start in range(0, len(todo), _SLICE):
            if start:
                time.sleep(_TURN_S)
            with _file_lock(self.path):
                remaining = self._stored(dict(todo[start : start + _SLICE]))
                if remaining:
                    self._run(remaining)
        rows = [self._rows[k] for k in keys]
        vectors = np.vstack([v for v, _ in rows]).astype(np.float32, copy=False)
        return Embeddings(vectors, np.array([t for _, t in rows], dtype=bool))

    def _stored(self, missing: dict[bytes, str]) -> dict[bytes, str]:
        """Take the rows another process stored since this one opened the file; return those still missing."""
        if self._db is None:
            return missing
        keys = list(missing)
        with self._lock:
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                query = f"SELECT key, vector, truncated FROM rows WHERE key IN ({','.join('?' * len(chunk))})"
                for key, blob, truncated in self._db.execute(query, chunk):
                    vector = np.frombuffer(blob, dtype=np.float32)
                    if vector.shape == (self.dim,):
                        self._rows[key] = (vector, bool(truncated))
            return {k: t for k, t in missing.items() if k not in self._rows}

    def _run(self, missing: dict[bytes, str]) -> None:
        result = self.inner.embed(list(missing.values()))
        fresh = {k: (result.vectors[i].copy(), bool(result.truncated[i])) for i, k in enumerate(missing)}
        with self._lock:
            self.model_runs += len(fresh)
            self._rows.update(fresh)
            if self._db is not None:
                self._db.executemany(
                    "INSERT OR IGNORE INTO rows VALUES (?, ?, ?)",
                    [(k, v.tobytes(), int(t)) for k, (v, t) in fresh.items()],
                )

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


@contextlib.contextmanager
def _file_lock(path: Path | None) -> Iterator[None]:
    """An exclusive ``flock`` on ``<path>.lock`` (nothing to hold for a memory-only cache)."""
    if path is None:
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cache_file(model_id: str, digest: str) -> Path | None:
    """Where the rows of the model with this fingerprint live (``None``: memory only)."""
    folder = cache_dir()
    if folder is None:
        return None
    return folder / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', model_id)}-{digest[:32]}.sqlite"


def torch_vectors(model: Embedder) -> CachedEmbedder:
    """The memo of a :class:`~embedding.sentence_transformers.SentenceTransformerEmbedder`'s rows.

    The key ``tests/conftest.py``'s ``minilm_vectors`` uses (the model folder's files, the code,
    the libraries, CPU), so a bench and the tests share rows.
    """
    from embedding import length_batches
    from embedding import sentence_transformers as st

    assert isinstance(model, st.SentenceTransformerEmbedder)
    model.warm_up()
    digest = fingerprint(
        folder_files(model._path), [st, length_batches],
        ["torch", "sentence-transformers", "transformers", "tokenizers", "numpy"], device="cpu",
    )
    return CachedEmbedder(model, cache_file(model.model_id, digest))


def onnx_vectors(embedder: Embedder) -> CachedEmbedder:
    """The memo of an :class:`~embedding.onnx.OnnxEmbedder`'s rows (warmed up: its export exists).

    Keyed by the exported ONNX file's bytes, the tokenizer and pooling files, the code that runs
    them, ONNX Runtime's version and the settings that change a row (int8 rows depend slightly on
    the other texts of their batch, so the batch size is part of the key).
    """
    from embedding import length_batches, onnx
    from embedding.sentence_transformers import resolve_model_path

    assert isinstance(embedder, onnx.OnnxEmbedder)
    embedder.warm_up()
    assert embedder.onnx_path is not None
    files = {f"model/{k}": v for k, v in folder_files(resolve_model_path(embedder.model_id)).items()}
    files["export.onnx"] = embedder.onnx_path
    digest = fingerprint(
        files, [onnx, length_batches], ["onnxruntime", "tokenizers", "numpy"],
        quantize=embedder.quantize, batch_size=embedder._batch_size, threads=embedder._threads,
    )
    return CachedEmbedder(embedder, cache_file(f"{embedder.model_id}-onnx-{embedder.quantize}", digest))
