"""Collections: create, list, describe, drop, and the index the planner picks as they grow."""

from __future__ import annotations

from typing import Any

from indexing.collections import NAME, CollectionConfig, FusionConfig
from indexing.docstore import DEFAULT_TENANT, chunking_id_of
from indexing.fusion_default import choose_fusion
from indexing.planner import IndexPlan
from indexing.text import LANGUAGES, Language
from indexing.versions import describe_versions, live_config
from quarry.errors import CollectionExists, CollectionNotFound, Conflict, Forbidden, InvalidRequest, clip
from quarry.services import rollout, versions
from quarry.services.namespace import tenant_view
from quarry.services.view import View, for_collection, shared_space
from quarry.tenancy import SHARED
from stores.base import redact_url


def create(  # noqa: PLR0913 - the request's fields
    v: View,
    name: str,
    *,
    language: Language = "auto",
    chunk_size: int | None = None,
    chunk_overlap: int | None = None,
    exist_ok: bool = False,
    fusion: FusionConfig | None = None,
    shared: bool = False,
    cache_threshold: float | None = None,
) -> CollectionConfig:
    """Create a collection in the store and the state of record.

    ``fusion`` is the collection's default hybrid fusion (``None``: the server's settings, or,
    for a language the embedding model does not declare, a BM25-leaning one:
    :func:`indexing.fusion_default.choose_fusion`); ``describe`` shows it and its
    ``fusion_origin``, and each search request may override it. ``shared``: a collection
    every tenant uses, each seeing its own documents only (:mod:`quarry.services.namespace`).
    ``cache_threshold``: the least cosine for a semantic-cache hit on its answers (``None``:
    ``QUARRY_CACHE__THRESHOLD``).

    Raises:
        InvalidRequest: Bad name, language, chunking or cache threshold.
        CollectionExists: The name is taken (unless ``exist_ok``), by a shared collection too.
        Forbidden: ``shared`` asked by a tenant other than the operator's (``default``).
        Conflict: ``shared`` with a name some tenant's own collection has.
    """
    if not NAME.fullmatch(name):
        raise InvalidRequest(
            f"invalid collection name {clip(name)}: start with a letter; letters, digits and '_' only; at most 63"
        )
    if language not in LANGUAGES:
        raise InvalidRequest(f"unknown language {clip(language)}; use one of {', '.join(LANGUAGES)}")
    if cache_threshold is not None and not 0 < cache_threshold <= 1:
        raise InvalidRequest(f"cache_threshold must be > 0 and <= 1 (a cosine), got {cache_threshold!r}")
    if shared:
        return _create_shared(v, name, language=language, chunk_size=chunk_size, chunk_overlap=chunk_overlap,
                              exist_ok=exist_ok, fusion=fusion, cache_threshold=cache_threshold)
    if for_collection(v, name) is not v:
        raise CollectionExists(name)  # a shared collection has the name
    with v.space.writing(name):
        return _create(v, name, language, chunk_size, chunk_overlap, exist_ok, fusion, cache_threshold)


def _create(  # noqa: PLR0913 - the request's fields
    v: View,
    name: str,
    language: Language,
    chunk_size: int | None,
    chunk_overlap: int | None,
    exist_ok: bool,
    fusion: FusionConfig | None = None,
    cache_threshold: float | None = None,
) -> CollectionConfig:
    settings, store, docstore, embedder = v.settings, v.store, v.docstore, v.engines.embedder
    existing = docstore.collection_config(name)
    if existing is not None:
        if not exist_ok:
            raise CollectionExists(name)
        if not store.has_collection(name):
            raise Conflict(
                f"collection {name!r} is in the docstore of {settings.data_dir} but not in the vector "
                f"store {redact_url(settings.store_url)}: this data dir was used with another store. "
                "Keep one QUARRY_DATA_DIR per store (or drop the collection to start it again)"
            )
        return CollectionConfig.model_validate(existing)
    for other in docstore.list_collections():
        if other.lower() == name.lower():
            raise CollectionExists(name, existing=other)
    if store.has_collection(name):
        raise Conflict(
            f"collection {name!r} exists in the vector store {redact_url(settings.store_url)} but not in "
            f"the docstore of {settings.data_dir}: another data dir or deployment made it. "
            "Pick another name, or drop it with the store's own tools"
        )
    size = chunk_size or settings.ingest.chunk_size
    overlap = settings.ingest.chunk_overlap if chunk_overlap is None else chunk_overlap
    if size < 1 or not 0 <= overlap < size:
        raise InvalidRequest(f"chunk_overlap must be >= 0 and < chunk_size ({size}), got {overlap}")
    embedder.warm_up()
    fusion, origin = choose_fusion(language, embedder.card, embedder.model_id, fusion)
    cfg = CollectionConfig(
        name=name, language=language, embedding_model=embedder.model_id,
        embedding_fingerprint=embedder.fingerprint or None,
        dim=embedder.dim, chunk_size=size, chunk_overlap=overlap, fusion=fusion, fusion_origin=origin,
        cache_threshold=cache_threshold,
    )
    store.create_collection(name, cfg.dim, cfg.metric)
    try:
        plan = v.space.plan(0, cfg.dim)
        store.build_index(name, plan.spec, timeout_s=settings.store.index_build_timeout_s)
        cfg.index = index_record(plan)
        # rows a write left under this name while another process dropped it are not inherited
        docstore.drop_collection(name)
        docstore.put_collection(name, cfg.to_json())
    except BaseException:
        store.drop_collection(name)
        raise
    return cfg


def _create_shared(  # noqa: PLR0913 - create's fields
    v: View, name: str, *, language: Language, chunk_size: int | None, chunk_overlap: int | None,
    exist_ok: bool, fusion: FusionConfig | None, cache_threshold: float | None = None,
) -> CollectionConfig:
    """Create shared collection ``name`` (``v`` is the asking tenant's view).

    Raises:
        Forbidden: ``v``'s tenant is not the operator's (``default``).
        Conflict: Some tenant has a collection of its own named ``name``.
        CollectionExists: A shared collection is named so (unless ``exist_ok``).
    """
    if v.tenant_id != DEFAULT_TENANT:
        raise Forbidden(
            f"only the operator's tenant ({DEFAULT_TENANT!r}) creates shared collections; tenant "
            f"{clip(v.tenant_id)} may create its own", reason="tenant",
        )
    for tenant, _ in v.docstore.list_tenants():
        if v.docstore.for_tenant(tenant).collection_config(name) is not None:
            raise Conflict(f"tenant {tenant!r} has a collection named {clip(name)}: pick another shared name")
    shared = View(v.engines, shared_space(v.engines))
    with shared.space.writing(name):
        cfg = create(shared, name, language=language, chunk_size=chunk_size, chunk_overlap=chunk_overlap,
                     exist_ok=exist_ok, fusion=fusion, cache_threshold=cache_threshold)
        if cfg.tenancy != "shared":  # made now (an existing one keeps its schemas as they are)
            cfg.tenancy = "shared"
            cfg.tenant_schemas = True
            shared.docstore.put_collection(name, cfg.to_json())
    return tenant_view(cfg, v.tenant_id)


def get(v: View, name: str) -> CollectionConfig:
    """A collection's configuration (as stored: a shared one's whole schema).

    Raises:
        CollectionNotFound: No such collection.
    """
    raw = v.docstore.collection_config(name)
    if raw is None:
        raise CollectionNotFound(name)
    return CollectionConfig.model_validate(raw)


def list_all(v: View) -> list[CollectionConfig]:
    """All collections, by name: this tenant's own, then the shared ones (``tenancy: shared``)."""
    own = [get(v, n) for n in v.docstore.list_collections()]
    if v.space.tenant_id == SHARED:
        return own
    shared = View(v.engines, shared_space(v.engines))
    # each tenant sees its own fields of a shared collection
    return own + [tenant_view(get(shared, n), v.tenant_id) for n in shared.docstore.list_collections()]


def describe(v: View, name: str) -> dict[str, Any]:
    """Configuration plus document/chunk/vector counts (a shared collection's: the caller's own).

    Raises:
        CollectionNotFound: No such collection.
    """
    if v.ns.shared:
        return _describe_scoped(v, name)
    cfg = get(v, name)
    live = versions.live_version(v, name)
    documents, chunks = v.docstore.counts(name)
    found = [ver for ver in describe_versions(v.docstore, name) if ver["state"] != "failed"]
    counted: dict[str, int] = {}
    for ver in found:  # each version's chunks (versions of one chunking share its rows)
        chunking = chunking_id_of(ver["chunking"])
        if chunking not in counted:
            counted[chunking] = v.docstore.counts(name, chunking=chunking)[1]
        ver["chunks"] = counted[chunking]
    scheduler = v.space.scheduler
    return {
        **live_config(cfg, live).to_json(), "documents": documents, "chunks": chunks,
        "vectors": v.store.count(live.physical_name), "live_version": live.version,
        "versions": found,
        "reindex": {"next_run": scheduler.next_run(name) if scheduler is not None else None,
                    "last_trigger": versions.last_trigger(v.docstore, name)},
        "rollout": rollout.describe(v, name),
    }


def _describe_scoped(v: View, name: str) -> dict[str, Any]:
    """Configuration (with this tenant's own schema) plus this tenant's document, chunk and vector counts."""
    cfg = get(v, name)
    live = versions.live_version(v, name)
    ids = own_ids(v, name)
    chunks = sum(len(c) for c in v.docstore.chunk_ids_of(name, ids).values())
    return {
        **tenant_view(live_config(cfg, live), v.tenant_id).to_json(), "documents": len(ids), "chunks": chunks,
        "vectors": v.store.count(live.physical_name, v.ns.scoped(None)), "live_version": live.version,
        "versions": [],  # the physical versions are the operator's business
    }


def own_ids(v: View, name: str, limit: int | None = None, after: str = "", page: int = 1000) -> list[str]:
    """The namespace's stored ids after ``after`` (the caller's id), in order: one key range.

    Read ``page`` ids at a time, stopping at the first id past the range: reading to the end
    would read every later tenant's ids of a shared collection too.
    """
    prefix = v.ns.prefix
    found: list[str] = []
    cursor = prefix + after
    while limit is None or len(found) < limit:
        size = page if limit is None else min(page, limit - len(found))
        ids = v.docstore.document_ids(name, after=cursor, limit=size)
        mine = [i for i in ids if i.startswith(prefix)]  # the range is contiguous: the rest are later tenants'
        found.extend(mine)
        if len(mine) < len(ids) or len(ids) < size:
            break
        cursor = ids[-1]
    return found


def drop(v: View, name: str) -> None:
    """Drop a collection everywhere (a shared one: the operator's only).

    Raises:
        CollectionNotFound: No such collection.
        Forbidden: A shared collection, asked by another tenant than the operator's.
    """
    get(v, name)
    v.ns.require_operator(name, "drop")
    with v.space.writing(name):
        get(v, name)
        for version in v.docstore.list_versions(name):
            v.store.drop_collection(version.physical_name)
        v.store.drop_alias(name)
        v.store.drop_collection(name)
        v.space.bm25.drop(name)
        v.docstore.drop_collection(name)
        v.space.monitor.forget(name)
        v.space.drift.forget(name)


def replan_index(v: View, name: str) -> IndexPlan | None:
    """Re-plan the index for the collection's current size; rebuild it if the kind changed.

    Called after every ingestion that wrote vectors, so a collection moves from exact search
    to HNSW (or IVF) as it grows, as the planner decides for this engine.

    Returns:
        The new plan when the index was rebuilt, else ``None``. When the kind stays, the
        recorded plan (its reason, size and memory estimate, as ``describe`` shows them) is
        refreshed if its index spec is the one built; a spec that changed within the kind
        (e.g. IVF ``nlist``) keeps the record of what is built.
    """
    with v.space.writing(name):
        cfg = get(v, name)
        plan = v.space.plan(v.store.count(versions.live_version(v, name).physical_name), cfg.dim)
        if plan.spec.kind != cfg.index.get("kind"):
            apply_index(v, name, plan)
            return plan
        record = index_record(plan)
        same_spec = all(record[k] == cfg.index.get(k) for k in ("kind", "params", "search_params"))
        if same_spec and record != cfg.index:
            cfg.index = record
            v.docstore.put_collection(name, cfg.to_json())
        return None


def apply_index(v: View, name: str, plan: IndexPlan) -> None:
    """Build a planned index on a collection and record it (and the planner's reasons).

    Raises:
        UnsupportedIndex: The engine cannot build the plan's index.
        IndexBuildFailed: The build failed or timed out (rolled back by the store).
    """
    with v.space.writing(name):
        cfg = get(v, name)
        physical = versions.live_version(v, name).physical_name
        v.store.build_index(physical, plan.spec, timeout_s=v.settings.store.index_build_timeout_s)
        cfg.index = index_record(plan)
        v.docstore.put_collection(name, cfg.to_json())


def index_record(plan: IndexPlan) -> dict[str, Any]:
    """What a collection's description shows of its index: the spec, the plan and why."""
    return {
        "kind": plan.spec.kind, "params": plan.spec.params, "search_params": plan.spec.search_params,
        "ideal": plan.ideal, "reason": plan.reason, "fallback_reason": plan.fallback_reason,
        "planned_for_vectors": plan.n_vectors, "estimated_bytes": plan.estimated_bytes, "engine": plan.engine,
    }
