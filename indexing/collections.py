"""Collection configuration: what a collection was built with, kept in the docstore.

A collection fixes its BM25 language, embedding model and dimension, metric and chunking at
creation, so indexing and querying always agree. Its metadata ``schema`` (field -> type) grows
as documents bring new fields; a field never changes type, and filters are checked against it.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from indexing.text import Language
from quarry.errors import InvalidRequest, ModelMismatch
from stores.base import Metric
from stores.filters import FieldType

NAME = re.compile(r"\A[A-Za-z][A-Za-z0-9_]{0,62}\Z")
MAX_NAME_CHARS = 63  # NAME's length: no collection has a longer name


def check_name_length(name: str) -> None:
    """Refuse a collection name no collection can have, before any store or file is asked about it.

    Raises:
        InvalidRequest: ``name`` is longer than :data:`MAX_NAME_CHARS`.
    """
    if len(name) > MAX_NAME_CHARS:
        raise InvalidRequest(
            f"collection name is {len(name):,} characters; a collection name has at most {MAX_NAME_CHARS}"
        )
BUILTIN_FIELDS: dict[str, FieldType] = {"document_id": "str"}
Weight = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _FusionSetting(Protocol):
    """What :meth:`FusionConfig.over` reads of a fusion setting (:class:`retrieval.fusion.Fusion`, a dataclass)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def method(self) -> str: ...  # noqa: D102
    @property
    def k(self) -> int: ...  # noqa: D102
    @property
    def weights(self) -> Mapping[str, float]: ...  # noqa: D102
    @property
    def normalization(self) -> str: ...  # noqa: D102


_F = TypeVar("_F", bound=_FusionSetting)


class FusionConfig(BaseModel):
    """How hybrid search fuses its two channels (:mod:`retrieval.fusion`); unset fields inherit.

    A search's fusion is its request's ``fusion`` over the collection's ``fusion`` over the
    server's ``QUARRY_SEARCH__RRF_K``/``BM25_WEIGHT``/``DENSE_WEIGHT`` (method ``rrf``,
    normalisation ``minmax``), field by field (``weights`` channel by channel).
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    method: Literal["rrf", "weighted"] | None = Field(
        None,
        description="rrf: sum of weight / (k + rank) (Cormack et al. 2009); weighted: sum of weight × normalised "
        "channel score (a convex combination when the weights sum to 1; Bruch et al. 2023).",
    )
    k: int | None = Field(None, ge=1, le=100_000, description="RRF constant (rrf only).")
    weights: dict[Literal["bm25", "dense"], Weight] | None = Field(
        None, description='Channel weights, e.g. {"bm25": 0.5, "dense": 0.5}; 0 drops a channel.'
    )
    normalization: Literal["minmax", "zscore", "dbsf"] | None = Field(
        None,
        description="weighted only: minmax (Elasticsearch linear retriever), zscore, or dbsf (Qdrant's "
        "distribution-based score fusion: (s - (mean - 3 sd)) / 6 sd, clipped to [0, 1]).",
    )

    def over(self, base: _F) -> _F:
        """``base`` (a :class:`retrieval.fusion.Fusion`) with this config's set fields applied (weights per channel)."""
        return dataclasses.replace(
            base,
            method=self.method or base.method,
            k=base.k if self.k is None else self.k,
            weights={**base.weights, **{str(c): w for c, w in (self.weights or {}).items()}},
            normalization=self.normalization or base.normalization,
        )


class FusionOrigin(BaseModel):
    """Where a collection's default fusion came from (:func:`indexing.fusion_default.choose_fusion`).

    Attributes:
        source: ``request``: the creator's ``fusion``; ``language``: the collection's language is
            one its embedding model does not declare, so the default leans on BM25; ``settings``:
            the server's settings (``QUARRY_SEARCH__RRF_K``/``BM25_WEIGHT``/``DENSE_WEIGHT``).
        reason: One sentence for people (``describe``, the create response).
    """

    source: Literal["request", "language", "settings"]
    reason: str


class CollectionConfig(BaseModel):
    """A collection's fixed configuration and its growing metadata schema.

    Attributes:
        name: Collection name (letters, digits, ``_``; starts with a letter; ≤ 63 chars).
        language: BM25 analysis (``en``, ``zh`` or ``auto``).
        embedding_model: ``model_id`` of the embedder the vectors came from (its friendly name).
        embedding_fingerprint: The embedder's fingerprint (:mod:`embedding.fingerprint`): what
            identifies the model. ``None`` in collections made before fingerprints; their first
            upsert records it (see :func:`model_mismatch`).
        dim: Vector dimension.
        metric: Vector similarity.
        chunk_size: Chunk cap in text tokens.
        chunk_overlap: Tokens shared by consecutive chunks.
        schema_: Metadata field -> type, including the built-in ``document_id``.
        index: The vector index spec and the planner's reason, for ``describe``.
        created_at: Unix time of creation.
        fusion: The collection's default hybrid fusion (``None``: the server's settings).
        fusion_origin: Why ``fusion`` is what it is (``None`` in collections made before it was
            recorded): the creator's, the language default or the server's settings.
        tenancy: ``shared``: a collection of every tenant, each one's documents carrying its
            ``tenant_id`` (:mod:`quarry.services.namespace`); ``tenant``: the tenant's own.
        cache_threshold: Least cosine for a semantic-cache hit on this collection's answers
            (``None``: ``QUARRY_CACHE__THRESHOLD``); :mod:`generation.cache`.
        tenant_schemas: In a shared collection, whether ``schema_`` holds each tenant's fields
            under its own keys (``<tenant>__m_<field>``, :func:`quarry.services.namespace.stored_field`), so that
            every tenant has a schema of its own; set when a shared collection is created.
    """

    name: str
    language: Language = "auto"
    embedding_model: str
    embedding_fingerprint: str | None = None
    dim: int = Field(gt=0)
    metric: Metric = "cosine"
    chunk_size: int = Field(gt=0)
    chunk_overlap: int = Field(ge=0)
    schema_: dict[str, FieldType] = Field(default_factory=lambda: dict(BUILTIN_FIELDS), alias="schema")
    index: dict[str, Any] = Field(default_factory=dict)
    created_at: float = Field(default_factory=time.time)
    fusion: FusionConfig | None = Field(None, description="The collection's default hybrid fusion.")
    fusion_origin: FusionOrigin | None = Field(
        None, description="Why the default fusion is what it is: the creator's (request), chosen for a language the "
        "embedding model does not declare (language), or the server's settings (settings).",
    )
    tenancy: Literal["tenant", "shared"] = Field(
        "tenant", description="tenant: one tenant's own; shared: every tenant's, each seeing its own documents."
    )
    tenant_schemas: bool = Field(
        False,
        description="shared only: each tenant has its own metadata schema (its fields are stored under keys of "
        "its own, and the schema shown is the caller's); false in shared collections made before per-tenant "
        "schemas, whose one schema every tenant sees.",
    )

    cache_threshold: float | None = Field(
        None, gt=0, le=1, allow_inf_nan=False,
        description="Least cosine between a question and a cached one for the cached answer to be served "
        "(the lexical guard must pass too); null: the server's QUARRY_CACHE__THRESHOLD.",
    )

    model_config = {"populate_by_name": True}

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form (as stored and as the API shows it)."""
        return self.model_dump(by_alias=True)


def model_mismatch(cfg: CollectionConfig, model_id: str, fingerprint: str) -> ModelMismatch | None:
    """Whether an embedder's vectors can go into (or be compared with) a collection's.

    Args:
        cfg: The collection.
        model_id: The embedder's friendly name.
        fingerprint: The embedder's fingerprint (after its ``warm_up``).

    Returns:
        ``None`` when the collection's fingerprint is the embedder's, or, for a collection that
        recorded only a name (made before fingerprints), when the names match; else the
        :class:`~quarry.errors.ModelMismatch` to raise (409) or to degrade with.
    """
    if cfg.embedding_fingerprint is not None:
        if cfg.embedding_fingerprint == fingerprint:
            return None
    elif cfg.embedding_model == model_id:
        return None
    return ModelMismatch(
        cfg.name, cfg.embedding_model, model_id,
        stored_fingerprint=cfg.embedding_fingerprint, current_fingerprint=fingerprint,
    )
