"""Collection aliases for :mod:`stores.milvus`: native on a server, a side table on Milvus Lite.

Milvus Lite 2.5.1 answers every alias RPC with ``UNIMPLEMENTED``, so on Lite the aliases live in
a hidden ``_quarry_meta`` collection of the same database file and are resolved in process. A
Lite file can be opened by one process only, so the in-process table is the only view; a swap is
one upsert of one row (atomic). On a server, Milvus' own ``create_alias``/``alter_alias`` are
used, so every process sees a swap at once.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from pymilvus import DataType, MilvusClient, MilvusException

from quarry.errors import StoreUnavailable
from stores.milvus_expr import decode_id, encode_id, ids_expr
from stores.milvus_mapping import EXACT_INDEX, MAX_ID_LEN, READ_S, WRITE_S, index_params, wrapped

META_COLLECTION = "_quarry_meta"


class Aliases(Protocol):
    """Alias bookkeeping as :class:`stores.milvus.MilvusStore` needs it."""

    def target(self, alias: str) -> str | None:
        """The collection ``alias`` points at, or ``None`` when it is not an alias."""
        ...

    def point(self, alias: str, collection: str) -> None:
        """Create ``alias`` or swap it to ``collection``."""
        ...

    def remove(self, alias: str) -> None:
        """Drop ``alias`` (it exists)."""
        ...

    def of(self, collection: str) -> list[str]:
        """Every alias pointing at ``collection``."""
        ...


class ServerAliases:
    """Native Milvus aliases (server)."""

    def __init__(self, client: Any) -> None:
        """Use the connected ``MilvusClient``."""
        self._client = client

    def target(self, alias: str) -> str | None:
        """The collection of ``alias`` (``describe_alias``), ``None`` when unknown."""
        try:
            desc = self._client.describe_alias(alias, timeout=READ_S)
        except MilvusException:
            return None
        except Exception as exc:
            raise StoreUnavailable("Milvus describe_alias failed", detail=str(exc)) from exc
        return str(desc["collection_name"])

    def point(self, alias: str, collection: str) -> None:
        """``create_alias``, or ``alter_alias`` (atomic swap) when it exists."""
        with wrapped("set_alias"):
            if self.target(alias) is None:
                self._client.create_alias(collection, alias, timeout=WRITE_S)
            else:
                self._client.alter_alias(collection, alias, timeout=WRITE_S)

    def remove(self, alias: str) -> None:
        """``drop_alias``."""
        with wrapped("drop_alias"):
            self._client.drop_alias(alias, timeout=WRITE_S)

    def of(self, collection: str) -> list[str]:
        """``list_aliases`` of ``collection``."""
        with wrapped("list_aliases", collection):
            res = self._client.list_aliases(collection_name=collection, timeout=READ_S)
        return list(res.get("aliases", []))


class LiteAliases:
    """Aliases kept in the hidden ``_quarry_meta`` collection (Milvus Lite)."""

    def __init__(self, client: Any) -> None:
        """Create the side table when missing and load it."""
        self._client = client
        self._lock = threading.Lock()
        with wrapped("load aliases"):
            if not client.has_collection(META_COLLECTION, timeout=READ_S):
                self._create_table()
            rows = client.query(META_COLLECTION, filter='id != ""', output_fields=["id", "target"], timeout=READ_S)
        self._table = {decode_id(r["id"]): str(r["target"]) for r in rows}

    def _create_table(self) -> None:
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=MAX_ID_LEN)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=2)  # Milvus needs a vector field
        schema.add_field("target", DataType.VARCHAR, max_length=MAX_ID_LEN)
        index = index_params(self._client, EXACT_INDEX, "FLAT", "l2")
        self._client.create_collection(
            META_COLLECTION, schema=schema, index_params=index, consistency_level="Strong", timeout=WRITE_S
        )

    def target(self, alias: str) -> str | None:
        """The collection of ``alias`` from the in-process table."""
        with self._lock:
            return self._table.get(alias)

    def point(self, alias: str, collection: str) -> None:
        """Upsert the alias row, then update the table."""
        row = {"id": encode_id(alias), "vector": [0.0, 0.0], "target": collection}
        with self._lock, wrapped("set_alias"):
            self._client.upsert(META_COLLECTION, [row], timeout=WRITE_S)
            self._table[alias] = collection

    def remove(self, alias: str) -> None:
        """Delete the alias row, then update the table."""
        with self._lock, wrapped("drop_alias"):
            self._client.delete(META_COLLECTION, filter=ids_expr([encode_id(alias)]), timeout=WRITE_S)
            self._table.pop(alias, None)

    def of(self, collection: str) -> list[str]:
        """Aliases whose target is ``collection``."""
        with self._lock:
            return [a for a, c in self._table.items() if c == collection]
