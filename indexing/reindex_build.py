"""A reindex's inputs (:class:`Build`), its report, its lease, and the helpers of re-chunking.

Used by :class:`indexing.reindex.Reindexer` and the services that start and describe reindexes.

With the chunking unchanged the new version shares the live version's chunks rows (and its BM25
index). A reindex that re-chunks (another ``chunk_size``/``chunk_overlap``) re-cuts every
document's stored text (:func:`~indexing.document_plan.plan_chunks`, sections recovered from the live
chunks' payloads: :func:`indexing.reindex_build.sections_of`) into chunks rows of a new chunking id
(:func:`indexing.versions.new_chunking`), written beside the live ones; vectors are copied for
chunks whose id (hence text) the live version has, the others embedded; the replay re-cuts each
changed document too, so writes made meanwhile reach the new chunking and deleted documents
leave it. Counts are checked against the new chunking's rows. After the swap every chunk read
follows the live version's chunking (the BM25 index is rebuilt from it); a rollback re-cuts the
documents changed since into the target's chunking. A chunking's rows are deleted when the last
version using it fails or is purged (:meth:`indexing.reindex.Reindexer.drop_rows`).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from embedding.base import Embedder
from indexing.collections import CollectionConfig
from indexing.docstore import CollectionVersion, StoredChunk, StoredDocument, chunking_id_of
from indexing.formats import Section
from stores.base import IndexSpec


def lease_name(collection: str) -> str:
    """The lease that admits one reindex (or rollback) of ``collection`` at a time."""
    return f"reindex:{collection}"


def new_owner() -> str:
    """A lease owner id unique to this process and call (``host:pid:random``)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class ReindexReport:
    """What a reindex did.

    Attributes:
        version: The version built (live after a swap).
        previous: The version it replaced.
        chunks: Vectors in the new version.
        copied: Vectors copied from the live version (no model call).
        embedded: Texts embedded by the new version's model.
        replayed: Documents refreshed from the change log.
        recall: recall@10 of the new index against exact search (tie-aware).
        elapsed_s: Wall time, seconds.
    """

    version: int
    previous: int
    chunks: int = 0
    copied: int = 0
    embedded: int = 0
    replayed: int = 0
    recall: float | None = None
    elapsed_s: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Build:
    """One reindex's inputs, fixed at its start.

    ``chunking``: the chunking asked for (``chunk_size``, ``chunk_overlap``; ``None``: the live
    version's); :meth:`Reindexer.run` replaces it by the one recorded (with its ``id``). A
    rollback passes its target's.
    """

    cfg: CollectionConfig
    live: CollectionVersion
    model: Embedder
    model_url: str | None
    same_model: bool
    index: IndexSpec | None  # None: the planner's choice
    chunking: dict[str, Any] | None = None

    @property
    def chunking_id(self) -> str:
        """The chunking id the version being written reads and writes."""
        return chunking_id_of(self.chunking if self.chunking is not None else self.live.chunking)

    @property
    def rechunk(self) -> bool:
        """Whether the version being written has chunks rows of its own (not the live version's)."""
        return self.chunking_id != chunking_id_of(self.live.chunking)


def sections_of(doc: StoredDocument, chunks: Sequence[StoredChunk]) -> tuple[Section, ...]:
    """The sections of a stored document, recovered from its chunks (the docstore keeps no sections).

    A section's metadata is what its chunks' payloads carry beyond the document's metadata
    (``page``, ``section``); a new section starts at the first chunk whose extra metadata
    differs from the previous chunk's, at that chunk's offset in the text (chunks are slices of
    it). Two adjacent sections with the same metadata read as one (their boundary is lost, not
    their metadata). ``()`` (one section) when no chunk carries extra metadata or a chunk is not
    found in the text.
    """
    meta = doc.metadata or {}
    text = doc.text or ""
    out: list[Section] = []
    at = 0
    for chunk in sorted(chunks, key=lambda c: c.position):
        extra = {k: v for k, v in chunk.payload.items() if k != "document_id" and (k not in meta or meta[k] != v)}
        start = text.find(chunk.text, at)
        if start < 0:
            return ()
        if not out or extra != out[-1].metadata:
            out.append(Section(start if out else 0, extra))
        at = start + 1
    if len(out) == 1 and not out[0].metadata:
        return ()
    return tuple(out)


def clip_id(document_id: str) -> str:
    """A document id for a message (at most 80 characters, quoted)."""
    return repr(document_id if len(document_id) <= 80 else document_id[:77] + "...")


def estimate_chunks(chunks: int, live: dict[str, Any], new: dict[str, Any]) -> int:
    """About how many chunks ``chunks`` cut as ``live`` become when cut as ``new`` (by the token step)."""
    try:
        old_step = max(1, int(live["chunk_size"]) - int(live["chunk_overlap"]))
        new_step = max(1, int(new["chunk_size"]) - int(new["chunk_overlap"]))
    except (KeyError, TypeError, ValueError):
        return chunks
    return -(-chunks * old_step // new_step)
