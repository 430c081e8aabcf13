"""Physical versions behind a collection name.

A collection's vectors live in one physical store collection per *version*; the docstore's
``collections.live_version`` names the one that serves it and ``collection_versions`` records,
per version, its store collection, model (URL and fingerprint), dimension, chunking, analyzer,
index plan, state and the change-log position it was built from (docs/design-state.md).

======  ===========================  =====================================================
version store collection             how it came
======  ===========================  =====================================================
1       ``<name>``                   the collection's creation (or, for a collection made
                                     before versions, its first use: :func:`ensure_live`)
N ≥ 2   ``<name>__v<N>``             a reindex (:mod:`indexing.reindex`)
======  ===========================  =====================================================

Quarry's own readers and writers take the store collection *and* the query model from the
same version record (:class:`~retrieval.results.DenseTarget`), so a query vector is never
searched against vectors of another model. The store alias ``<name>`` is kept pointing at the
live version for outside readers once ``<name>`` is no longer a physical collection (after
version 1 is dropped at the end of its retention).

Chunks belong to a *chunking* (the docstore's ``chunks.chunking_id``): ``""`` is the
collection's original one; a reindex that re-chunks (``--chunk-size``) writes version ``N``'s
chunks as ``v<N>s<size>o<overlap>`` beside the live ones. A version records its chunking (size,
overlap and ``id``) and every chunk read (BM25, hit texts, counts) follows the live version's
id; versions with the same chunking share the rows. The rows of a chunking go when the last
version using it is purged.
"""

from __future__ import annotations

import time
from typing import Any

from indexing.collections import CollectionConfig
from indexing.docstore import CollectionVersion, StateStore
from quarry.errors import CollectionNotFound, Conflict

SUFFIX = "__v"


def physical_name(name: str, version: int) -> str:
    """The store collection of ``version`` of collection ``name`` (``name`` itself for version 1)."""
    return name if version == 1 else f"{name}{SUFFIX}{version}"


def chunking_of(cfg: CollectionConfig) -> dict[str, Any]:
    """A collection's chunking as a version records it (without ``id``: the original chunking)."""
    return {"chunk_size": cfg.chunk_size, "chunk_overlap": cfg.chunk_overlap}


def new_chunking(version: int, chunk_size: int, chunk_overlap: int) -> dict[str, Any]:
    """The chunking a re-chunking reindex records for ``version``: its own rows ``v<N>s<size>o<overlap>``."""
    return {"chunk_size": chunk_size, "chunk_overlap": chunk_overlap,
            "id": f"v{version}s{chunk_size}o{chunk_overlap}"}


def same_chunking(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two recorded chunkings cut documents the same (size and overlap; ids aside)."""
    return (a.get("chunk_size"), a.get("chunk_overlap")) == (b.get("chunk_size"), b.get("chunk_overlap"))


def first_version(cfg: CollectionConfig, model_url: str | None) -> CollectionVersion:
    """Version 1: the store collection named as the collection, with the collection's model."""
    return CollectionVersion(
        version=1, physical_name=cfg.name, state="live", model_fingerprint=cfg.embedding_fingerprint,
        model_name=model_url, dim=cfg.dim, chunking=chunking_of(cfg), analyzer=cfg.language,
        index_plan=dict(cfg.index), built_from_seq=0, created_at=cfg.created_at or time.time(),
    )


def ensure_live(docstore: StateStore, cfg: CollectionConfig, model_url: str | None) -> CollectionVersion:
    """The collection's live version; a collection made before versions becomes version 1 here.

    The migration in code: a collection whose ``live_version`` is 0 (no version rows; its
    vectors in the store collection named as it) gets a version-1 row describing that store
    collection with the collection's model and is switched to it. Re-running it is harmless.

    Args:
        docstore: The state of record.
        cfg: The collection's stored configuration.
        model_url: The URL of the model its vectors came from, when known (the service's
            embedder's URL when the fingerprints agree), else ``None``.

    Raises:
        CollectionNotFound: The collection is not in the docstore.
    """
    state = docstore.collection_state(cfg.name)
    if state is None:
        raise CollectionNotFound(cfg.name)
    if state.live_version:
        live = docstore.get_version(cfg.name, state.live_version)
        if live is not None:
            return live
    if docstore.get_version(cfg.name, 1) is None:
        try:
            docstore.create_version(cfg.name, first_version(cfg, model_url))
        except Conflict:  # another process migrated it first
            pass
    docstore.set_live_version(cfg.name, 1)
    live = docstore.get_version(cfg.name, 1)
    if live is None:  # dropped meanwhile
        raise CollectionNotFound(cfg.name)
    return live


def live_config(cfg: CollectionConfig, version: CollectionVersion) -> CollectionConfig:
    """``cfg`` with the model identity and dimension of ``version`` (what queries and writes check).

    A version a reindex built (``>= 2``) is what it records, whatever the collection's config
    says while a swap updates both; version 1 is what the collection was made with, so its
    config stays the authority (a collection made before fingerprints records one on its first
    write, as before versions). A rollback to version 1 writes the config before the swap.
    The chunking (``chunk_size``, ``chunk_overlap``) is every version's own: writes chunk as
    the live version's chunks were cut.
    """
    update: dict[str, Any] = {}
    size, overlap = version.chunking.get("chunk_size"), version.chunking.get("chunk_overlap")
    if isinstance(size, int) and isinstance(overlap, int) and (size, overlap) != (cfg.chunk_size, cfg.chunk_overlap):
        update["chunk_size"], update["chunk_overlap"] = size, overlap
    if version.version == 1:
        return cfg.model_copy(update=update) if update else cfg
    if version.model_fingerprint and version.model_fingerprint != cfg.embedding_fingerprint:
        update["embedding_fingerprint"] = version.model_fingerprint
    if version.dim and version.dim != cfg.dim:
        update["dim"] = version.dim
    return cfg.model_copy(update=update) if update else cfg


def describe_versions(docstore: StateStore, name: str) -> list[dict[str, Any]]:
    """The versions of a collection as ``describe`` shows them, oldest first (failed ones too)."""
    return [
        {
            "version": v.version, "state": v.state, "physical_name": v.physical_name,
            "model": v.model_name, "model_fingerprint": v.model_fingerprint, "dim": v.dim,
            "chunking": v.chunking, "analyzer": v.analyzer, "index": v.index_plan.get("kind"),
            "built_from_seq": v.built_from_seq, "created_at": v.created_at, "swapped_at": v.swapped_at,
            "retire_after": v.retire_after,
        }
        for v in docstore.list_versions(name)
    ]
