"""``quarry ingest --engine ray``: read, parse, chunk and embed on Ray Data; the driver writes.

The stages that cost CPU or GPU time run on a Ray cluster (or a local Ray started for the run)::

    read      JSONL / BEIR corpus: ray.data.read_text (the file's blocks read in parallel);
              a folder: its file list, made on the driver, parsed in tasks (sources.read_file)
    prepare   tasks: the content hash against a snapshot of the collection's stored hashes
              (ray.put once); an unchanged document passes on without chunks, the others are
              chunked (pipeline.plan_chunks: the same chunk ids as the local pipeline)
    embed     an actor pool (ActorPoolStrategy(min_size=1, max_size=workers)); each actor
              opens the embedder of QUARRY_EMBEDDING__URL once and embeds its documents' chunks
    write     the driver: Ingestor.upsert_stream, the local pipeline's path (atomic batches,
              the docstore's hash check and change log, BM25), with the chunks and vectors
              the workers made instead of its own (``vectors=``)

So a run gives what the local pipeline gives, and a re-run embeds nothing (the snapshot skips
unchanged documents before the embed stage; the driver's hash check stays the authority: a
document changed by another writer since the snapshot is embedded on the driver).

Rows travel as pickled records in one binary column: documents' metadata are heterogeneous,
which an Arrow schema per field would not hold. On a cluster (``--address`` or
``RAY_ADDRESS``) every node needs Quarry, the model and the source path (a shared file system).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from embedding.factory import open_embedder
from indexing.collections import CollectionConfig
from indexing.docstore import DocStore, StoredChunk
from indexing.document_plan import document_hash, plan_chunks
from indexing.document_rules import check_sizes, parse_document
from indexing.pipeline import FloatVector, Precomputed
from indexing.sources import READ_SUFFIXES, Source, read_file
from indexing.versions import live_config
from quarry.errors import ConfigError, InvalidDocument, InvalidRequest, PayloadTooLarge, QuarryError, missing_extra
from quarry.settings import Settings

try:
    import pyarrow as pa
    import ray
    import ray.data
except ImportError as exc:  # the ``ray`` extra
    raise missing_extra(exc.name or "ray", "ray") from exc

PARSE_BATCH = 256  # documents per parse/prepare task call
EMBED_BATCH = 64  # documents per actor call (their chunks are embedded in model batches)


@dataclass
class _Item:
    """One record between stages: a document (planned, then embedded) or a file's outcome."""

    kind: str  # "doc", "error" (a file skipped or failing the run), "empty", "fatal"
    path: str = ""  # a folder's file, relative to the folder
    doc: Any = None  # SourceDocument
    error: BaseException | None = None
    reason: str = ""  # why a file was skipped
    planned: list[tuple[StoredChunk, str]] = field(default_factory=list)
    vectors: Any = None  # (n chunks, dim) float32
    embed_calls: int = 0
    truncated: int = 0
    fingerprint: str = ""


def _items(batch: pa.Table) -> list[_Item]:
    return [pickle.loads(b) for b in batch.column("item").to_pylist()]


def _table(items: list[_Item]) -> pa.Table:
    return pa.table({"item": pa.array([pickle.dumps(i) for i in items], pa.binary())})


def _parse_lines(batch: pa.Table) -> pa.Table:
    """JSONL lines (already validated by :class:`Source`) to documents."""
    items = []
    for line in batch.column("text").to_pylist():
        try:
            items.append(_Item("doc", doc=parse_document(json.loads(line))))
        except (InvalidDocument, ValueError) as exc:  # the file changed since it was validated
            items.append(_Item("fatal", error=InvalidDocument(f"a line changed during the run: {exc}")))
    return _table(items)


def _parse_files(batch: pa.Table, *, root: str, max_document_chars: int, max_token_chars: int) -> pa.Table:
    """A folder's files to documents, as :func:`indexing.sources.iter_folder` reads them."""
    items = []
    for rel in batch.column("path").to_pylist():
        file = Path(root) / rel
        try:
            doc = read_file(file, rel, max_document_chars=max_document_chars)
            if doc is not None:
                check_sizes([doc], max_document_chars=max_document_chars, max_token_chars=max_token_chars)
        except (InvalidDocument, PayloadTooLarge) as exc:
            items.append(_Item("error", path=rel, error=exc, reason=exc.message.removeprefix(f"{file}: ")))
        except OSError as exc:
            reason = f"cannot be read: {exc.strerror or exc}"
            items.append(_Item("error", path=rel, error=InvalidDocument(reason, source=str(file)), reason=reason))
        except QuarryError as exc:  # the formats extra missing on a worker: no file can be read
            items.append(_Item("fatal", error=exc))
        else:
            items.append(_Item("empty", path=rel) if doc is None else _Item("doc", doc=doc))
    return _table(items)


_SNAPSHOTS: dict[str, Mapping[str, str]] = {}  # per worker process: the snapshot, fetched once


def _snapshot(ref: ray.ObjectRef[Any]) -> Mapping[str, str]:
    key = ref.hex()
    if key not in _SNAPSHOTS:
        _SNAPSHOTS.clear()  # one run's at a time
        _SNAPSHOTS[key] = ray.get(ref)
    return _SNAPSHOTS[key]


def _prepare(batch: pa.Table, *, cfg: CollectionConfig, hashes_ref: ray.ObjectRef[Any]) -> pa.Table:
    """Chunk the documents whose content hash is not the stored one (unchanged: no chunks)."""
    items = _items(batch)
    hashes = _snapshot(hashes_ref)
    for item in items:
        if item.kind == "doc" and hashes.get(item.doc.id) != document_hash(item.doc, cfg):
            item.planned = plan_chunks(cfg, item.doc)
    return _table(items)


class _Embed:
    """An embedding actor: the model loads once per actor, at its first chunk to embed.

    Loading at the first chunk, not in the constructor, keeps a re-run that embeds nothing from
    loading the model at all.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._model: Any = None

    def _open(self) -> Any:
        if self._model is None:
            self._model = open_embedder(self._settings.embedding.url, self._settings)
            self._model.warm_up()
        return self._model

    def __call__(self, batch: pa.Table) -> pa.Table:
        items = _items(batch)
        texts = [text for item in items for _, text in item.planned]
        if not texts:
            return _table(items)
        model, size = self._open(), self._settings.embedding.batch_size
        parts: list[FloatVector] = []
        for start in range(0, len(texts), size):
            result = model.embed(texts[start : start + size])
            parts.append(result.vectors)
            items[0].embed_calls += 1
            items[0].truncated += int(result.truncated.sum())
        vectors, offset = np.concatenate(parts), 0
        for item in items:
            item.vectors, offset = vectors[offset : offset + len(item.planned)], offset + len(item.planned)
            item.fingerprint = model.fingerprint
        return _table(items)


def _quarry_cause(exc: BaseException) -> QuarryError | None:
    """The :class:`QuarryError` a worker raised (an ``EmbeddingUnavailable``), under Ray's wrappers."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None or isinstance(seen, QuarryError):
            return seen
        seen = seen.__cause__ or getattr(seen, "cause", None)
    return None


def stored_hashes(docstore: DocStore, name: str, page: int = 10_000) -> dict[str, str]:
    """``document id -> content hash`` of a whole collection, read a page at a time (the snapshot)."""
    out: dict[str, str] = {}
    after: str | None = None
    while ids := docstore.document_ids(name, after=after, limit=page):
        out.update(docstore.document_hashes(name, ids))
        after = ids[-1]
    return out


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[None]:
    """Connect to ``address`` (``ray://host:10001``, ``auto``) or ``RAY_ADDRESS``, else start a local Ray.

    A Ray already initialised in this process (a test's, a notebook's) is used and left running;
    one started here is shut down on exit.
    """
    if ray.is_initialized():
        yield
        return
    ray.init(address=address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


class RaySource:
    """A :class:`Source` read through the Ray pipeline: documents in, their chunks' vectors beside.

    Iterating yields each document after putting its planned chunks and vectors in
    :attr:`vectors` (for ``Ingestor.upsert_stream(..., vectors=)``, which pops them) and
    recording in :attr:`report` what a folder's reading skipped, as :class:`Source` does.

    Attributes:
        path, format, total, report: As :class:`Source`'s.
        vectors: Document id -> planned chunks with vectors, for documents yielded and not yet written.
        embedded, embed_calls, truncated: Chunks embedded, model calls and truncated chunks, on the workers.
    """

    def __init__(
        self, source: Source, cfg: CollectionConfig, settings: Settings, hashes: Mapping[str, str], *,
        fingerprint: str, workers: int | None = None, gpus_per_worker: float = 0.0,
    ) -> None:
        """Bind the stages' inputs; nothing runs until iteration (inside :func:`ray_session`)."""
        self.path, self.format, self.total, self.report = source.path, source.format, source.total, source.report
        self._cfg, self._settings, self._hashes = cfg, settings, hashes
        self._fingerprint, self._workers, self._gpus = fingerprint, workers, gpus_per_worker
        self.vectors: Precomputed = {}
        self.embedded = self.embed_calls = self.truncated = 0

    def _read(self) -> ray.data.Dataset:
        limits = self._settings.ingest
        if self.format != "folder":
            jsonl = self.path / "corpus.jsonl" if self.format == "beir" else self.path
            return ray.data.read_text(str(jsonl.resolve())).map_batches(
                _parse_lines, batch_format="pyarrow", batch_size=PARSE_BATCH
            )
        files = sorted(p for p in self.path.rglob("*") if p.is_file())
        readable = [f.relative_to(self.path).as_posix() for f in files if f.suffix.lower() in READ_SUFFIXES]
        if not readable:
            raise InvalidRequest(f"{self.path}: no {', '.join(READ_SUFFIXES)} files found")
        self.report.not_read.extend(
            f.relative_to(self.path).as_posix() for f in files if f.suffix.lower() not in READ_SUFFIXES
        )
        parse = partial(
            _parse_files, root=str(self.path.resolve()), max_document_chars=limits.max_document_chars,
            max_token_chars=limits.max_token_chars,
        )
        return ray.data.from_items([{"path": r} for r in readable]).map_batches(
            parse, batch_format="pyarrow", batch_size=16
        )

    def dataset(self) -> ray.data.Dataset:
        """The lazy read -> prepare -> embed dataset (executes when iterated)."""
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # quarry's own progress lines say where the run is
        context.print_on_execution_start = False
        hashes = ray.put(dict(self._hashes))
        return (
            self._read()
            .map_batches(
                partial(_prepare, cfg=self._cfg, hashes_ref=hashes), batch_format="pyarrow", batch_size=PARSE_BATCH
            )
            .map_batches(
                _Embed, batch_format="pyarrow", batch_size=EMBED_BATCH,
                compute=ray.data.ActorPoolStrategy(min_size=1, max_size=self._workers),
                num_cpus=1, num_gpus=self._gpus or None, fn_constructor_kwargs={"settings": self._settings},
            )
        )

    def __iter__(self) -> Iterator[Any]:
        """The documents, in the order the workers finish them.

        Raises:
            InvalidDocument: Under ``on_error="fail"``, a file that cannot be read (named).
            ConfigError: The workers' model is not the driver's (another fingerprint).
            QuarryError: A stage failed on a worker (re-raised as it was raised there).
        """
        try:
            for batch in self.dataset().iter_batches(batch_format="pyarrow", batch_size=None):
                for item in _items(batch):
                    yield from self._take(item)
        except ray.exceptions.RayError as exc:  # a worker's error: ours, typed (exit codes, retryable) if it is one
            cause = _quarry_cause(exc)
            if cause is None:
                raise
            raise cause from exc

    def _take(self, item: _Item) -> Iterator[Any]:
        self.embed_calls += item.embed_calls
        self.truncated += item.truncated
        if item.kind == "fatal" or (item.kind == "error" and self._settings.ingest.on_error == "fail"):
            assert item.error is not None
            raise item.error
        if item.kind == "error":
            self.report.errors.append((str(self.path / item.path), item.reason))
            return
        if item.kind == "empty":
            self.report.empty.append(item.path)
            return
        if item.planned:
            if item.fingerprint != self._fingerprint:
                raise ConfigError(
                    f"the Ray workers' model (fingerprint {item.fingerprint}) is not the driver's "
                    f"({self._fingerprint}): give every node the same QUARRY_EMBEDDING__URL and model files"
                )
            self.embedded += len(item.planned)
            self.vectors[item.doc.id] = [(c, t, v) for (c, t), v in zip(item.planned, item.vectors, strict=True)]
        self.report.read += 1
        yield item.doc


def upsert_with_ray(  # noqa: PLR0913 - upsert_stream's arguments and the pool's
    quarry: Any, name: str, source: Source, progress: Any = None, *, stop: Any = None, seen: set[str] | None = None,
    workers: int | None = None, gpus_per_worker: float = 0.0,
) -> Any:
    """Ingest ``source`` into collection ``name`` on Ray (inside :func:`ray_session`).

    Args:
        quarry: The service (:class:`quarry.service.Quarry`): its settings name the model the
            workers open; its embedder (the driver's) must have the same fingerprint.
        name: An existing collection.
        source: The opened source (validated, as for the local pipeline).
        progress: Called with the documents finished after each batch.
        stop: Asked after each batch; ``True`` ends the run there.
        seen: When given, every document id read is added to it (for ``--prune``).
        workers: Most embedding actors (``None``: as many as the cluster's CPUs or GPUs allow).
        gpus_per_worker: GPUs each actor reserves (1: one actor per GPU; set
            ``QUARRY_EMBEDDING__DEVICE=cuda``).

    Returns:
        The :class:`~indexing.pipeline.IngestReport`; ``embedded`` and ``truncated`` count the
        workers' chunks too, ``extra`` holds ``engine``, ``ray_embedded`` and ``ray_embed_calls``.

    Raises:
        As :meth:`quarry.service.Quarry.upsert_stream` and :meth:`RaySource.__iter__`.
    """
    cfg = live_config(quarry.get_collection(name), quarry.live_version(name))  # the live version's chunking
    quarry.embedder.warm_up()
    ray_source = RaySource(
        source, cfg, quarry.settings, stored_hashes(quarry.docstore, name),
        fingerprint=quarry.embedder.fingerprint, workers=workers, gpus_per_worker=gpus_per_worker,
    )
    report = quarry.upsert_stream(name, ray_source, progress, stop=stop, seen=seen, vectors=ray_source.vectors)
    report.embedded += ray_source.embedded
    report.truncated += ray_source.truncated
    report.extra |= {"engine": "ray", "ray_embedded": ray_source.embedded, "ray_embed_calls": ray_source.embed_calls}
    return report
