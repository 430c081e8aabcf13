"""The queries of a collection's rollout (:mod:`indexing.rollout`): one row per collection, cached.

Every search of a collection under rollout reads its row to route the query, so the read is
cached with the change token (:func:`indexing.state_db.cached`) and a write moves the token:
every replica sharing the state reads the new row on its next search.
"""

from __future__ import annotations

import json
import time

import sqlalchemy as sa
from sqlalchemy import bindparam as bp

from indexing.rollout import Rollout
from indexing.schema import collections, rollouts
from indexing.state_db import SqlBase, cached, loads, timed
from indexing.state_sql import CID
from quarry.errors import CollectionNotFound

_C, _R = collections.c, rollouts.c
_ROLLOUT = sa.select(_R.body).where(_R.collection_id == CID)
_UPSERT = sa.text(
    "INSERT INTO rollouts (collection_id, candidate, state, body, updated_at) "
    "VALUES (:cid, :candidate, :state, :body, :at) ON CONFLICT (collection_id) DO UPDATE SET "
    "candidate = excluded.candidate, state = excluded.state, body = excluded.body, updated_at = excluded.updated_at"
)


class SqlRollouts(SqlBase):
    """A collection's rollout record."""

    @cached("rollout")
    def get_rollout(self, name: str) -> Rollout | None:
        """The collection's newest rollout (any state), or ``None`` (cached until a commit)."""
        with self._read() as conn:
            body = conn.execute(_ROLLOUT, {"tenant": self.tenant, "cname": name}).scalar()
        return None if body is None else Rollout.from_json(loads(body))

    @timed
    def put_rollout(self, rollout: Rollout, *, expect: Rollout | None = None) -> bool:
        """Write the collection's rollout row (replacing the one there), unless it changed meanwhile.

        Args:
            rollout: The new record.
            expect: The record the caller read (``None``: write whatever is there); when the row
                holds another one (a replica changed it), nothing is written.

        Returns:
            Whether it was written.

        Raises:
            CollectionNotFound: No such collection.
        """
        with self._write() as conn:
            cid = conn.execute(
                sa.select(_C.id).where(_C.tenant_id == bp("tenant"), _C.name == bp("cname")),
                {"tenant": self.tenant, "cname": rollout.collection},
            ).scalar()
            if cid is None:
                raise CollectionNotFound(rollout.collection)
            if expect is not None:
                body = conn.execute(_ROLLOUT, {"tenant": self.tenant, "cname": rollout.collection}).scalar()
                if body is None or Rollout.from_json(loads(body)) != expect:
                    return False
            conn.execute(_UPSERT, {"cid": int(cid), "candidate": rollout.candidate, "state": rollout.state,
                                   "body": json.dumps(rollout.to_json()), "at": time.time()})
        return True
