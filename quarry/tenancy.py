"""Tenants: one service's view per tenant, whose every path sees that tenant's collections only.

:meth:`quarry.service.Quarry.for_tenant` builds (once per tenant) a :class:`~quarry.service.Quarry`
sharing the models and the store connections, with

* the state of record's :meth:`~indexing.docstore.StateStore.for_tenant` view (collections keyed
  ``(tenant_id, name)``: configuration, documents, chunks, change log, write locks);
* a :class:`TenantStore` over the vector store, naming each collection ``t_<tenant>__<name>``
  there (the default tenant keeps the plain names of a server without tenants);
* its own BM25 registry under ``<data_dir>/bm25@<tenant>`` and its own searcher and ingestor.

So BM25, dense, hybrid, rerank, the answer path, describe/count/list, get and the deletes all go
through the tenant's view and cannot name another tenant's data: a name of another tenant is
absent (404) like any missing one. A default-tenant collection named like another tenant's
physical name (``t_acme__docs``) cannot be created while that one exists (409, the store has it).

Shared collections (every tenant's, each document carrying its tenant) are :mod:`quarry.services.namespace`'s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from stores.base import IndexSpec, Metric, ScoredId, StoreCapabilities, VectorRecord, VectorStore
from stores.filters import Filter

PREFIX = "t_"
SHARED = "_shared"
"""The state of record's tenant of the shared collections (no key can name it: tenant ids start with a letter)."""
TENANT_FIELD = "tenant_id"
"""The payload field of a shared collection's documents: the tenant that wrote it (:mod:`quarry.services.namespace`)."""
TENANT_ID = re.compile(r"\A[a-z][a-z0-9_]{0,31}\Z")  # quarry.api.keys.TENANT


def physical_name(tenant_id: str, name: str) -> str:
    """The vector store's name of tenant ``tenant_id``'s collection ``name``."""
    return f"{PREFIX}{tenant_id}__{name}"


class TenantStore:
    """A :class:`~stores.base.VectorStore` whose names are one tenant's (see the module doc).

    ``close`` does nothing: the connections belong to the wrapped store.
    """

    def __init__(self, inner: VectorStore, tenant_id: str) -> None:
        """Wrap ``inner`` for ``tenant_id`` (a validated tenant id: ``[a-z][a-z0-9_]*``)."""
        self.inner = inner
        self.tenant_id = tenant_id
        self._prefix = physical_name(tenant_id, "")
        check = getattr(inner, "check_filter", None)
        if check is not None:
            self.check_filter = check

    def _p(self, name: str) -> str:
        return self._prefix + name

    def capabilities(self) -> StoreCapabilities:
        """The wrapped store's."""
        return self.inner.capabilities()

    def create_collection(self, name: str, dim: int, metric: Metric = "cosine") -> None:
        """See :meth:`stores.base.VectorStore.create_collection`."""
        self.inner.create_collection(self._p(name), dim, metric)

    def drop_collection(self, name: str) -> None:
        """See :meth:`stores.base.VectorStore.drop_collection`."""
        self.inner.drop_collection(self._p(name))

    def has_collection(self, name: str) -> bool:
        """See :meth:`stores.base.VectorStore.has_collection`."""
        return self.inner.has_collection(self._p(name))

    def list_collections(self) -> list[str]:
        """This tenant's collections (names without the prefix)."""
        n = len(self._prefix)
        return sorted(c[n:] for c in self.inner.list_collections() if c.startswith(self._prefix))

    def collection_dim(self, name: str) -> int:
        """See :meth:`stores.base.VectorStore.collection_dim`."""
        return self.inner.collection_dim(self._p(name))

    def upsert(self, name: str, records: Sequence[VectorRecord]) -> None:
        """See :meth:`stores.base.VectorStore.upsert`."""
        self.inner.upsert(self._p(name), records)

    def delete(self, name: str, ids: Sequence[str]) -> None:
        """See :meth:`stores.base.VectorStore.delete`."""
        self.inner.delete(self._p(name), ids)

    def delete_by_filter(self, name: str, flt: Filter) -> None:
        """See :meth:`stores.base.VectorStore.delete_by_filter`."""
        self.inner.delete_by_filter(self._p(name), flt)

    def get(self, name: str, ids: Sequence[str]) -> list[VectorRecord]:
        """See :meth:`stores.base.VectorStore.get`."""
        return self.inner.get(self._p(name), ids)

    def count(self, name: str, flt: Filter | None = None) -> int:
        """See :meth:`stores.base.VectorStore.count`."""
        return self.inner.count(self._p(name), flt)

    def search(  # noqa: PLR0913 - the Protocol's signature
        self, name: str, queries: Any, top_k: int, flt: Filter | None = None,
        search_params: dict[str, Any] | None = None, *, with_payload: bool = True,
    ) -> list[list[ScoredId]]:
        """See :meth:`stores.base.VectorStore.search`."""
        return self.inner.search(self._p(name), queries, top_k, flt, search_params, with_payload=with_payload)

    def search_exact(self, name: str, queries: Any, top_k: int, flt: Filter | None = None) -> list[list[ScoredId]]:
        """See :meth:`stores.base.VectorStore.search_exact` (the recall monitor's exact re-runs)."""
        return self.inner.search_exact(self._p(name), queries, top_k, flt)

    def build_index(self, name: str, spec: IndexSpec, timeout_s: float = 600.0) -> None:
        """See :meth:`stores.base.VectorStore.build_index`."""
        self.inner.build_index(self._p(name), spec, timeout_s)

    def describe_index(self, name: str) -> IndexSpec | None:
        """See :meth:`stores.base.VectorStore.describe_index`."""
        return self.inner.describe_index(self._p(name))

    def drop_index(self, name: str) -> None:
        """See :meth:`stores.base.VectorStore.drop_index`."""
        self.inner.drop_index(self._p(name))

    def set_alias(self, alias: str, collection: str) -> None:
        """See :meth:`stores.base.VectorStore.set_alias` (both names this tenant's)."""
        self.inner.set_alias(self._p(alias), self._p(collection))

    def drop_alias(self, alias: str) -> None:
        """See :meth:`stores.base.VectorStore.drop_alias`."""
        self.inner.drop_alias(self._p(alias))

    def resolve(self, name: str) -> str:
        """The physical collection (without the tenant's prefix) ``name`` refers to."""
        return self.inner.resolve(self._p(name)).removeprefix(self._prefix)

    def close(self) -> None:
        """Nothing: the wrapped store is the service's, closed with it."""


def _conforms(store: TenantStore) -> VectorStore:
    """Never called: mypy checks here that :class:`TenantStore` has every method of the Protocol.

    (A missing method fails here, not in a tenant's recall-monitor re-run at run time.)
    """
    return store
