"""The references of query drift (:mod:`monitoring.drift`) in the state of record: one row per signal.

A reference is written once per (collection, store collection of a version, signal): the first
process to complete it inserts it, and the insert of any later one keeps the row there and answers
it, so every replica and every restart compares its queries with the same reference. Rows of a
version no longer in ``collection_versions`` are deleted at the next insert; a dropped
collection's go with it.
"""

from __future__ import annotations

import json
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy import bindparam as bp

from indexing.schema import collection_versions, collections, query_references
from indexing.state_db import SqlBase, loads, timed
from indexing.state_sql import CID
from quarry.errors import CollectionNotFound

_C, _Q, _V = collections.c, query_references.c, collection_versions.c
_READ = sa.select(_Q.signal, _Q.body).where(_Q.collection_id == CID, _Q.physical == bp("physical"))
_KEPT = sa.select(_Q.body).where(
    _Q.collection_id == bp("cid"), _Q.physical == bp("physical"), _Q.signal == bp("signal"),
)
_INSERT = sa.text(
    "INSERT INTO query_references (collection_id, physical, signal, body, updated_at) "
    "VALUES (:cid, :physical, :signal, :body, :at) ON CONFLICT (collection_id, physical, signal) DO NOTHING"
)


class SqlQueryReferences(SqlBase):
    """A collection version's query-drift references."""

    @timed
    def get_query_references(self, name: str, physical: str) -> dict[str, dict[str, Any]]:
        """``signal -> reference`` (``{"sum": [...], "n": int}``) of store collection ``physical`` of ``name``."""
        with self._read() as conn:
            rows = conn.execute(_READ, {"tenant": self.tenant, "cname": name, "physical": physical}).all()
        return {str(signal): loads(body) for signal, body in rows}

    @timed
    def put_query_reference(self, name: str, physical: str, signal: str, body: dict[str, Any]) -> dict[str, Any]:
        """Insert ``body`` as the ``signal`` reference of ``physical`` unless one is there; the one kept.

        Raises:
            CollectionNotFound: No such collection.
        """
        with self._write(notify=False) as conn:
            cid = conn.execute(
                sa.select(_C.id).where(_C.tenant_id == bp("tenant"), _C.name == bp("cname")),
                {"tenant": self.tenant, "cname": name},
            ).scalar()
            if cid is None:
                raise CollectionNotFound(name)
            versions = sa.select(_V.physical_name).where(_V.collection_id == int(cid))
            conn.execute(query_references.delete().where(
                _Q.collection_id == int(cid), _Q.physical != physical, _Q.physical.not_in(versions)))
            conn.execute(_INSERT, {"cid": int(cid), "physical": physical, "signal": signal,
                                   "body": json.dumps(body), "at": time.time()})
            kept = conn.execute(_KEPT, {"cid": int(cid), "physical": physical, "signal": signal}).scalar_one()
        return loads(kept)  # type: ignore[no-any-return]
