"""Collection versions: the live one, reindex to a new one (model, index, chunking), rollback, jobs.

The mechanics (build, verify, swap the alias, replay the writes made meanwhile) are
:mod:`indexing.reindex`'s; this module chooses the model and the index and records the outcome.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from embedding.base import Embedder
from indexing.collections import CollectionConfig
from indexing.docstore import DEFAULT_TENANT, CollectionVersion, Job, StateStore
from indexing.pipeline import Target
from indexing.reindex_build import Build, ReindexReport, new_owner
from indexing.versions import ensure_live, live_config
from quarry.errors import CollectionNotFound, Conflict, EmbeddingError, InvalidRequest, NotFound, clip
from quarry.services.view import View
from quarry.tenancy import SHARED
from retrieval.results import DenseTarget, Mode
from stores.base import IndexSpec

log = logging.getLogger(__name__)

MIN_CHUNK_SIZE = 8  # as QUARRY_INGEST__CHUNK_SIZE and the API's chunk_size


def _config(v: View, name: str) -> CollectionConfig:
    raw = v.docstore.collection_config(name)
    if raw is None:
        raise CollectionNotFound(name)
    return CollectionConfig.model_validate(raw)


def live_version(v: View, name: str) -> CollectionVersion:
    """The version serving ``name`` (a collection made before versions becomes version 1).

    Raises:
        CollectionNotFound: No such collection.
    """
    state = v.docstore.collection_state(name)
    if state is None:
        raise CollectionNotFound(name)
    cache = v.space.versions
    cached = cache.get((name, state.live_version)) if state.live_version else None
    if cached is not None:
        return cached
    with v.space.writing(name):
        cfg = _config(v, name)
        version = ensure_live(v.docstore, cfg, v.engines.models.url_of(cfg.embedding_fingerprint))
    cache[(name, version.version)] = version
    return version


def dense_target(
    v: View, cfg: CollectionConfig, mode: Mode
) -> tuple[CollectionConfig, DenseTarget | None, CollectionVersion]:
    """The live version's config view, unless BM25 only its store collection and query model, and the version."""
    live = live_version(v, cfg.name)
    view = live_config(cfg, live)
    if mode == "bm25":
        return view, None, live
    return view, DenseTarget(live.physical_name, v.engines.models.model_for(live)[1]), live


def write_target(v: View, name: str) -> tuple[CollectionConfig, Target]:
    """The live version's config view, and its store collection and model for a write."""
    live = live_version(v, name)
    return live_config(_config(v, name), live), Target(live.physical_name, v.engines.models.model_for(live)[0])


def reindex(  # noqa: PLR0913 - the request's fields
    v: View,
    name: str,
    *,
    model: str | None = None,
    index: str | IndexSpec | None = None,
    chunk_size: int | None = None,
    chunk_overlap: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    job_id: str | None = None,
    owner: str | None = None,
) -> ReindexReport:
    """Build the next version of ``name`` from the state of record, verify it and swap it in.

    Args:
        v: The caller's view (a shared collection: the operator's only).
        name: The collection.
        model: Another embedding model's URL (re-embeds everything); ``None`` keeps the live one's.
        index: ``auto`` / ``None`` (the planner's choice for the current size), an index kind,
            or a whole :class:`~stores.base.IndexSpec`.
        chunk_size: Re-chunk to this cap in text tokens (``None``: the live version's); the new
            version gets chunks rows of its own (:mod:`indexing.reindex`).
        chunk_overlap: The new overlap (``None``: the live version's, which must then be
            below ``chunk_size``).
        progress: Called with ``(chunks done, total)`` (re-chunking: ``total`` estimated).
        job_id: The job to record progress and the outcome in.
        owner: The lease owner (a caller that took the lease already passes its id).

    Raises:
        CollectionNotFound: No such collection.
        Forbidden: A shared collection, asked by another tenant than the operator's.
        InvalidRequest: A chunk size under 8 or an overlap not in ``[0, chunk_size)``.
        ReindexRunning: Another reindex of it holds the lease.
        ReindexFailed: Verification failed, or a document has no stored text to re-chunk;
            the live version serves.
    """
    cfg = _config(v, name)
    v.ns.require_operator(name, "reindex")
    space, docstore = v.space, v.docstore
    chunking = chunking_asked(live_config(cfg, live_version(v, name)), chunk_size, chunk_overlap)
    owner = owner or new_owner()
    space.reindexer.acquire(name, owner)
    try:
        live = live_version(v, name)
        embedder, url = v.engines.models.for_reindex(live, model)
        embedder.warm_up()  # its dim and fingerprint (a fresh process, `quarry reindex`, had neither: dim 0)
        same = bool(embedder.fingerprint) and embedder.fingerprint == live.model_fingerprint
        vectors = docstore.counts(name)[1]
        spec = index if isinstance(index, IndexSpec) else space.index_spec(index, vectors, embedder.dim, cfg.metric)
        build = Build(live_config(cfg, live), live, embedder, url, same, spec, chunking)
        report = space.reindexer.run(build, owner, _job_progress(v, job_id, progress))
        swapped = live_version(v, name)
        space.monitor.serving(name, swapped.physical_name)  # its recall figures start afresh
        _record_model(v, name, embedder, swapped)
        space.bm25.invalidate(name)  # a new chunking: the BM25 index is rebuilt from its rows now
        if job_id is not None:
            docstore.update_job(job_id, state="done", counters=_counters(report))
        return report
    except Exception as exc:
        if job_id is not None:
            docstore.update_job(job_id, state="failed", error=str(exc))
        raise
    finally:
        docstore.release_lease(f"reindex:{name}", owner)


def _record_model(v: View, name: str, embedder: Embedder, version: CollectionVersion) -> None:
    """Around a swap: the config names ``version``'s model, index and chunking (``list``, version 1)."""
    with v.space.writing(name):
        cfg = _config(v, name)
        dim = version.dim or embedder.dim  # the version's own record first: a cold model says 0
        if dim <= 0:
            raise EmbeddingError(f"collection {clip(name)}: the model of version {version.version} "
                                 "has no known dimension; nothing was changed")
        cfg.embedding_model, cfg.embedding_fingerprint, cfg.dim = (
            embedder.model_id, embedder.fingerprint or version.model_fingerprint, dim)
        cfg.index = {**cfg.index, **version.index_plan}
        size, overlap = version.chunking.get("chunk_size"), version.chunking.get("chunk_overlap")
        if isinstance(size, int) and isinstance(overlap, int):
            cfg.chunk_size, cfg.chunk_overlap = size, overlap
        v.docstore.put_collection(name, cfg.to_json())


def _job_progress(
    v: View, job_id: str | None, progress: Callable[[int, int], None] | None
) -> Callable[[int, int], None] | None:
    if job_id is None:
        return progress

    def both(done: int, total: int) -> None:
        v.docstore.update_job(job_id, state="running", counters={"done": done, "total": total})
        if progress is not None:
            progress(done, total)

    return both


def start_reindex(  # noqa: PLR0913 - the request's fields and who asks
    v: View, name: str, *, model: str | None = None, index: str | None = None, trigger: str = "api",
    reason: str = "", owner: str | None = None, chunk_size: int | None = None, chunk_overlap: int | None = None,
) -> Job:
    """Take the lease now and run :func:`reindex` in a background thread; returns its job.

    Args:
        v: The caller's view (a shared collection: the operator's only).
        name: The collection.
        model: See :func:`reindex`.
        index: See :func:`reindex`.
        chunk_size: See :func:`reindex` (checked here, before the job starts).
        chunk_overlap: See :func:`reindex`.
        trigger: Who asked (``api``, or a trigger of :mod:`quarry.scheduler`), kept in the
            job's ``params`` with ``reason`` and ``by`` (the lease owner).
        reason: Why.
        owner: A lease owner that holds the collection's lease already (the scheduler).

    Raises:
        CollectionNotFound: No such collection.
        Forbidden: See :func:`reindex`.
        InvalidRequest: See :func:`reindex`.
        UnsupportedIndex: ``index`` is not a kind this engine builds (checked before the job starts).
        ReindexRunning: Another reindex of it holds the lease.
    """
    cfg = _config(v, name)
    v.ns.require_operator(name, "reindex")
    chunking_asked(live_config(cfg, live_version(v, name)), chunk_size, chunk_overlap)
    if index is not None:  # an unknown kind, or one this engine cannot build: 400 now, not a failed job
        v.space.index_spec(index, 0, max(cfg.dim, 1), cfg.metric)
    if owner is None:
        owner = new_owner()
        v.space.reindexer.acquire(name, owner)
    params = {"model": model, "index": index, "trigger": trigger, "reason": reason, "by": owner,
              "chunk_size": chunk_size, "chunk_overlap": chunk_overlap}
    try:
        job = v.docstore.create_job("reindex", collection=name, params=params)
    except BaseException:
        v.docstore.release_lease(f"reindex:{name}", owner)
        raise

    def work() -> None:
        try:
            reindex(v, name, model=model, index=index, job_id=job.id, owner=owner,
                    chunk_size=chunk_size, chunk_overlap=chunk_overlap)
        except Exception:  # recorded in the job
            log.exception("reindex job %s of %r failed", job.id, name)

    threading.Thread(target=work, name=f"reindex-{name}", daemon=True).start()
    return job


def get_job(v: View, job_id: str) -> Job:
    """A job's state, progress counters and error.

    Raises:
        NotFound: No such job, or another tenant's (the same answer: ids never reveal a
            job of someone else).
    """
    job = v.docstore.get_job(job_id)
    tenant = v.tenant_id
    mine = (tenant, SHARED) if tenant == DEFAULT_TENANT else (tenant,)
    # the operator's tenant runs the shared collections' jobs; a tenant's own job of a shared
    # collection is recorded there with its tenant in the params
    scoped_here = job is not None and job.tenant_id == SHARED and job.params.get("tenant") == tenant
    if job is None or (job.tenant_id not in mine and not scoped_here):
        raise NotFound(f"job {clip(job_id)} does not exist")
    return job


def rollback(v: View, name: str) -> ReindexReport:
    """Swap back to the most recent retired version still kept.

    Raises:
        CollectionNotFound: No such collection.
        Forbidden: A shared collection, asked by another tenant than the operator's.
        Conflict: No retired version is kept (409: the collection is in no state to roll back).
        ReindexRunning: A reindex of it holds the lease.
    """
    _config(v, name)
    v.ns.require_operator(name, "roll back")
    space = v.space
    owner = new_owner()
    space.reindexer.acquire(name, owner)
    try:
        target = space.reindexer.rollback_target(name)
        if target is None:
            raise Conflict(f"collection {clip(name)} keeps no earlier version to roll back to")
        live = live_version(v, name)
        embedder = v.engines.models.model_for(target)[0]
        embedder.warm_up()  # its dim and fingerprint: a fresh process (`quarry rollback`) had neither
        same = bool(embedder.fingerprint) and embedder.fingerprint == live.model_fingerprint
        build = Build(live_config(_config(v, name), live), live, embedder, target.model_name, same, None)
        report = space.reindexer.rollback(build, target, lambda: _record_model(v, name, embedder, target))
        space.monitor.serving(name, target.physical_name)
        space.bm25.invalidate(name)  # back to the target's chunking: its BM25 index
        return report
    finally:
        v.docstore.release_lease(f"reindex:{name}", owner)


def last_trigger(docstore: StateStore, name: str) -> dict[str, Any] | None:
    """The newest reindex job of ``name``: its id, state, trigger, reason, starter and time."""
    job = next((j for j in docstore.list_jobs(collection=name, limit=50) if j.kind == "reindex"), None)
    if job is None:
        return None
    return {"job": job.id, "state": job.state, "trigger": job.params.get("trigger", "api"),
            "reason": job.params.get("reason", ""), "by": job.params.get("by"), "at": job.created_at}


def chunking_asked(cfg: CollectionConfig, size: int | None, overlap: int | None) -> dict[str, int] | None:
    """The chunking a reindex asks for (``None``: the live one, ``cfg``'s); checked.

    Raises:
        InvalidRequest: ``size`` under 8, or the overlap (``overlap``, else the live one's) not
            in ``[0, size)``.
    """
    if size is None and overlap is None:
        return None
    size = cfg.chunk_size if size is None else size
    if size < MIN_CHUNK_SIZE:
        raise InvalidRequest(f"chunk_size must be >= {MIN_CHUNK_SIZE} text tokens, got {size}")
    if overlap is None:
        overlap = cfg.chunk_overlap
        if overlap >= size:
            raise InvalidRequest(f"chunk_size {size} is not above the collection's overlap {overlap}: "
                                 "give a chunk_overlap below it too")
    if not 0 <= overlap < size:
        raise InvalidRequest(f"chunk_overlap must be >= 0 and < chunk_size ({size}), got {overlap}")
    return {"chunk_size": size, "chunk_overlap": overlap}


def _counters(report: ReindexReport) -> dict[str, int]:
    return {"version": report.version, "previous": report.previous, "done": report.chunks, "total": report.chunks,
            "copied": report.copied, "embedded": report.embedded, "replayed": report.replayed}

