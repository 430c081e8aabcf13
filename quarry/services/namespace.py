"""Namespaces: how a request's names map to the stored ones, by value (no subclass of the service).

Every service path (:mod:`quarry.services.documents`, :mod:`~quarry.services.query`,
:mod:`~quarry.services.collections`, :mod:`~quarry.services.versions`, ingestion jobs) passes
its ids, documents, filters and answers through the view's :class:`Namespace`, so a collection
kind that rewrites names is covered on every path at once.

* :data:`OWN` — a tenant's own collections: names as stored, identity everywhere.
* :class:`SharedNamespace` — a shared collection (one for every tenant) scoped to tenant ``T``:

  - **Writes**: each document is stored as ``T/<id>`` with ``tenant_id: T`` in its metadata, so
    two tenants' ``d1`` never collide. A document that sets ``tenant_id`` itself is refused (400
    ``InvalidDocument``): the field is the server's.
  - **Reads**: every search (BM25, dense, hybrid, rerank, the answer path) runs with
    ``tenant_id == T`` AND-ed to the caller's filter in both channels, and so do the recall
    monitor's exact re-runs. BM25 scores with the tenant's own N, avgdl and df
    (:meth:`SharedNamespace.bm25_within`). A filter naming ``tenant_id`` anywhere is refused
    (403 ``Forbidden``): it can narrow the scope, never name or widen it. Hits, documents and
    listings show ids without ``T/`` and metadata without ``tenant_id``.
  - **Metadata schemas**: with ``tenant_schemas: true`` each tenant has its own: tenant ``T``'s
    field ``price`` is stored as ``T__m_price`` (:func:`stored_field`), so two tenants' fields of
    one name may hold different types; ``T``'s filters are checked against ``T``'s own schema
    (:func:`tenant_schema`) and rewritten to the stored keys.
  - **By id**: get and delete address ``T/<id>`` only; another tenant's id is the same answer as a
    missing one (get: 404; delete: ``deleted: 0``).
  - **Admin**: drop, reindex, rollback and recall figures are the operator's (tenant
    ``default``); any other tenant's key gets 403.

  Fails closed: a tenant id that is empty or malformed is a 403, never an unscoped view.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from indexing.collections import BUILTIN_FIELDS, CollectionConfig
from indexing.docstore import DEFAULT_TENANT
from indexing.document_rules import SourceDocument
from quarry.errors import Forbidden, InvalidDocument, InvalidFilter, clip
from quarry.tenancy import TENANT_FIELD, TENANT_ID
from retrieval.results import Hit, SearchResult
from stores.filters import And, Eq, FieldType, Filter, In, Ne, Nin, Or, Prefix

log = logging.getLogger(__name__)

MAX_STORED_METADATA_BYTES = 48 * 1024
"""Most bytes of a chunk's metadata as stored, as JSON (clients may send 32 KiB: ``indexing.sources``)."""
FIELD_MARK = "__m_"
"""Between the tenant and the field name in a stored metadata key (:func:`stored_field`)."""


def stored_field(tenant_id: str, field: str) -> str:
    """The payload key of tenant ``tenant_id``'s metadata field ``field`` in a shared collection.

    ``<tenant>__m_<field>`` (at most 32 + 4 + 64 characters: :data:`stores.filters.PAYLOAD_KEY`).
    Two tenants' keys are never equal: a tenant id holds no ``__`` (``quarry.api.keys.TENANT``), so
    the first ``__`` of a key ends its tenant; nor equal to a server field (``document_id``,
    ``tenant_id``: no ``__``).
    """
    return f"{tenant_id}{FIELD_MARK}{field}"


def tenant_schema(cfg: CollectionConfig, tenant_id: str) -> dict[str, FieldType]:
    """The metadata schema tenant ``tenant_id`` sees of shared collection ``cfg``: its own fields only.

    ``document_id`` plus every field this tenant wrote, by the name it wrote; a collection
    without per-tenant schemas (``tenant_schemas: false``, made before them) has one schema for all.
    """
    if not cfg.tenant_schemas:
        return dict(cfg.schema_)
    mine = stored_field(tenant_id, "")
    own = {key.removeprefix(mine): kind for key, kind in cfg.schema_.items() if key.startswith(mine)}
    return {**BUILTIN_FIELDS, **own}


def tenant_view(cfg: CollectionConfig, tenant_id: str) -> CollectionConfig:
    """``cfg`` as tenant ``tenant_id`` sees it; any other collection unchanged.

    Its own schema (:func:`tenant_schema`), and, for any tenant but the operator's, no ``index``
    record: the planner's plan is sized by every tenant's vectors, so it would tell a tenant how
    much the others store.
    """
    if cfg.tenancy != "shared":
        return cfg
    update: dict[str, Any] = {}
    if cfg.tenant_schemas:
        update["schema_"] = tenant_schema(cfg, tenant_id)
    if tenant_id != DEFAULT_TENANT:
        update["index"] = {}
    return cfg.model_copy(update=update) if update else cfg


def refuse_tenant_field(raw: Any, path: str = "filters") -> None:
    """Refuse a JSON filter naming :data:`~quarry.tenancy.TENANT_FIELD` anywhere (in ``$and``/``$or`` too).

    Raises:
        Forbidden: It does.
    """
    if isinstance(raw, Mapping):
        for key, value in raw.items():
            if key == TENANT_FIELD:
                raise Forbidden(
                    f"{path} names {TENANT_FIELD!r}: in a shared collection the server scopes every request to "
                    "the API key's tenant; a filter can narrow that scope, never name or widen it",
                    reason="tenant",
                )
            refuse_tenant_field(value, path)
    elif isinstance(raw, list):
        for item in raw:
            refuse_tenant_field(item, path)


class Namespace:
    """A tenant's own collections: every name as stored (the identity on every hook).

    Attributes:
        tenant_id: The tenant the namespace scopes to (``None``: none, names are the view's own).
        prefix: What stored ids start with (``""``: every id).
    """

    tenant_id: str | None = None
    prefix: str = ""

    @property
    def shared(self) -> bool:
        """Whether this namespace scopes a shared collection to one tenant."""
        return self.tenant_id is not None

    def check_filter(self, raw: Any) -> None:
        """Refuse a raw filter this namespace cannot take (see :func:`refuse_tenant_field`)."""

    @contextmanager
    def messages(self) -> Iterator[None]:
        """Errors raised inside, in the caller's names."""
        yield

    def filter_schema(self, cfg: CollectionConfig) -> Mapping[str, FieldType]:
        """The fields a filter may name."""
        return cfg.schema_

    def stored_filter(self, cfg: CollectionConfig, flt: Filter) -> Filter:
        """``flt`` in the names the stores hold."""
        return flt

    def scoped(self, flt: Filter | None) -> Filter | None:
        """``flt`` narrowed to the namespace's rows (``None``: every row)."""
        return flt

    def bm25_within(self) -> str | None:
        """The stored ids whose statistics BM25 scores with (``None``: the whole collection)."""
        return None

    def qualify(self, document_id: str) -> str:
        """The stored id of the caller's ``document_id``."""
        return document_id

    def unqualify(self, stored_id: str) -> str:
        """The caller's id of ``stored_id``."""
        return stored_id

    def document(self, doc: SourceDocument, name: str) -> SourceDocument:
        """``doc`` as stored in collection ``name``."""
        return doc

    def shown(self, meta: Mapping[str, Any], name: str) -> dict[str, Any]:
        """Stored metadata of collection ``name`` as the caller wrote it."""
        return dict(meta)

    def result(self, name: str, result: SearchResult) -> SearchResult:
        """A search's answer in the caller's names."""
        return result

    def require_operator(self, name: str, action: str) -> None:
        """Refuse an operator's action (drop, reindex, recall) on collection ``name`` to another tenant."""


OWN = Namespace()
"""The namespace of every tenant's own collections."""


class SharedNamespace(Namespace):
    """A shared collection scoped to tenant ``tenant_id`` (see the module doc).

    Args:
        tenant_id: The key's tenant (``[a-z][a-z0-9_]{0,31}``, no ``__``).
        tenant_schemas: Whether collection ``name`` keeps a schema per tenant (read once per
            name for this namespace: one is made per request).

    Raises:
        Forbidden: ``tenant_id`` is empty or not a tenant id (fails closed).
    """

    def __init__(self, tenant_id: str, tenant_schemas: Callable[[str], bool]) -> None:  # noqa: D107
        if not tenant_id or not TENANT_ID.fullmatch(tenant_id) or "__" in tenant_id:  # see stored_field
            raise Forbidden(f"tenant {clip(tenant_id)} cannot be scoped: refusing an unscoped request",
                            reason="tenant")
        self.tenant_id = self.tenant = tenant_id
        self.scope = Eq(TENANT_FIELD, tenant_id)
        self.prefix = f"{tenant_id}/"
        self.fields = stored_field(tenant_id, "")
        self._read_schemas = tenant_schemas
        self._tenant_schemas: dict[str, bool] = {}

    def own_schema(self, name: str) -> bool:
        """Whether collection ``name`` keeps a schema per tenant (read once)."""
        if name not in self._tenant_schemas:
            self._tenant_schemas[name] = self._read_schemas(name)
        return self._tenant_schemas[name]

    def check_filter(self, raw: Any) -> None:
        """Refuse a filter naming ``tenant_id``.

        Raises:
            Forbidden: It does.
        """
        refuse_tenant_field(raw)

    @contextmanager
    def messages(self) -> Iterator[None]:
        """Errors about documents and filters raised inside, in the caller's names (:meth:`own_text`)."""
        try:
            yield
        except (InvalidDocument, InvalidFilter) as exc:
            exc.message = self.own_text(exc.message)
            exc.args = (exc.message,)
            raise

    def own_text(self, text: str) -> str:
        """A message of the pipeline or the store in the caller's names (ids without ``T/``, keys without ``T__m_``)."""
        for quote in ("'", '"'):
            text = text.replace(quote + self.prefix, quote)
        return text.replace(self.fields, "")

    def filter_schema(self, cfg: CollectionConfig) -> Mapping[str, FieldType]:
        """This tenant's own fields (:func:`tenant_schema`): another tenant's field is an unknown one."""
        self._tenant_schemas[cfg.name] = cfg.tenant_schemas
        return tenant_schema(cfg, self.tenant)

    def stored_filter(self, cfg: CollectionConfig, flt: Filter) -> Filter:
        """``flt`` on the stored ids (``T/<id>``) and, with per-tenant schemas, the stored keys (``T__m_<f>``)."""
        return _qualified(flt, self.prefix, self.fields if cfg.tenant_schemas else "")

    def scoped(self, flt: Filter | None) -> Filter:
        """The caller's filter AND this tenant: narrower than the scope, never wider."""
        return self.scope if flt is None else And((self.scope, flt))

    def bm25_within(self) -> str:
        """This tenant's rows (``T/<id>``): BM25's N, avgdl and df are its own, never moved by other tenants'."""
        return self.prefix

    def qualify(self, document_id: str) -> str:
        """``T/<document_id>``."""
        return self.prefix + document_id

    def unqualify(self, stored_id: str) -> str:
        """``stored_id`` without ``T/``."""
        return stored_id.removeprefix(self.prefix)

    def mine(self, stored_id: str) -> bool:
        """Whether ``stored_id`` is this tenant's."""
        return stored_id.startswith(self.prefix)

    def document(self, doc: SourceDocument, name: str) -> SourceDocument:
        """``doc`` as stored: id ``T/<id>``, ``tenant_id: T``, and (per-tenant schemas) keys ``T__m_<f>``.

        Raises:
            InvalidDocument: It sets ``tenant_id``, or its metadata as stored is over
                :data:`MAX_STORED_METADATA_BYTES`.
        """
        if TENANT_FIELD in doc.metadata or any(TENANT_FIELD in s.metadata for s in doc.sections):
            # a section's metadata overrides the document's in its chunks' payloads
            # (indexing.document_plan.plan_chunks): in a collection of one schema its tenant_id was B's scope
            raise InvalidDocument(
                f"document {clip(doc.id)}: metadata field {TENANT_FIELD!r} is set by the server in a shared "
                "collection (from the API key's tenant); leave it out"
            )
        if not self.own_schema(name):
            meta = {**doc.metadata, TENANT_FIELD: self.tenant}
            return dataclasses.replace(doc, id=self.qualify(doc.id), metadata=meta)
        meta = {**self._stored(doc.metadata), TENANT_FIELD: self.tenant}
        sections = tuple(dataclasses.replace(s, metadata=self._stored(s.metadata)) for s in doc.sections)
        largest = max((_json_bytes({**meta, **s.metadata}) for s in sections), default=_json_bytes(meta))
        if largest > MAX_STORED_METADATA_BYTES:  # each key grew by len(self.fields): Milvus holds 64 KiB of JSON
            raise InvalidDocument(
                f"document {clip(doc.id)}: its metadata is {largest:,} bytes as stored in a shared collection (each "
                f"field name carries the tenant); the limit is {MAX_STORED_METADATA_BYTES:,}: use fewer fields"
            )
        return dataclasses.replace(doc, id=self.qualify(doc.id), metadata=meta, sections=sections)

    def _stored(self, meta: Mapping[str, Any]) -> dict[str, Any]:
        return {self.fields + key: value for key, value in meta.items()}

    def shown(self, meta: Mapping[str, Any], name: str) -> dict[str, Any]:
        """Stored metadata as this tenant wrote it: its own keys by their names, no ``tenant_id``.

        With per-tenant schemas, a key of another tenant (never in this tenant's documents) is
        left out rather than shown.
        """
        if not self.own_schema(name):
            return {k: v for k, v in meta.items() if k != TENANT_FIELD}
        shown = {}
        for key, value in meta.items():
            if key.startswith(self.fields):
                shown[key.removeprefix(self.fields)] = value
            elif FIELD_MARK not in key and key != TENANT_FIELD:  # the server's (document_id)
                shown[key] = value
        return shown

    def _hit(self, hit: Hit, name: str) -> Hit | None:
        if not self.mine(hit.document_id) or hit.metadata.get(TENANT_FIELD) != self.tenant_id:
            log.error("shared collection hit outside tenant %s's scope dropped", self.tenant_id)
            return None
        explain = {  # each channel's chunk id too: the caller's ids everywhere, never the stored T/ ones
            k: {**v, "chunk_id": v["chunk_id"].removeprefix(self.prefix)}
            if isinstance(v, dict) and isinstance(v.get("chunk_id"), str) else v
            for k, v in hit.explain.items()
        }
        return dataclasses.replace(
            hit, document_id=self.unqualify(hit.document_id), chunk_id=self.unqualify(hit.chunk_id),
            metadata=self.shown(hit.metadata, name), explain=explain,
        )

    def result(self, name: str, result: SearchResult) -> SearchResult:
        """Hits of this tenant only, in its names; a channel's error in its names."""
        result.hits = [h for h in (self._hit(hit, name) for hit in result.hits) if h is not None]
        result.degraded = [self.own_text(reason) for reason in result.degraded]
        return result

    def require_operator(self, name: str, action: str) -> None:
        """Refuse ``action`` on shared collection ``name`` unless this tenant is the operator's.

        Raises:
            Forbidden: This tenant is not the operator's (``default``).
        """
        if self.tenant_id != DEFAULT_TENANT:
            raise Forbidden(
                f"collection {clip(name)} is shared by every tenant; only the operator's tenant "
                f"({DEFAULT_TENANT!r}) may {action} it", reason="tenant",
            )


def _json_bytes(meta: Mapping[str, Any]) -> int:
    return len(json.dumps(meta, ensure_ascii=False).encode())


def _qualified(flt: Filter, prefix: str, fields: str = "") -> Filter:
    """``flt`` as stored: ``document_id`` values ``T/<id>``, and other fields ``fields + name`` (``T__m_<f>``).

    A filter on ids or fields then works as in an own collection; ``fields=""`` keeps the names.
    """
    if isinstance(flt, And | Or):
        return type(flt)(tuple(_qualified(sub, prefix, fields) for sub in flt.items))
    if flt.field != "document_id":
        return dataclasses.replace(flt, field=fields + flt.field) if fields else flt
    if isinstance(flt, Eq | Ne):
        return type(flt)(flt.field, prefix + flt.value if isinstance(flt.value, str) else flt.value)
    if isinstance(flt, In | Nin):
        return type(flt)(flt.field, tuple(prefix + v if isinstance(v, str) else v for v in flt.values))
    if isinstance(flt, Prefix):
        return Prefix(flt.field, prefix + flt.prefix)
    return flt
