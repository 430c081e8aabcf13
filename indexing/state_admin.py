"""The queries of the state of record's other tables: versions, leases, jobs, tenants, keys, audit.

Plain records in and out (:mod:`indexing.docstore`); what a state or scope means is the callers'
business. Leases compare and set against the database's clock (``self.now``), so hosts whose
clocks differ agree on when one lapsed. Leases, jobs and the audit log change often and no
cached read depends on them: their writes do not move the change token.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import sqlalchemy as sa
from sqlalchemy import bindparam as bp

from indexing.docstore import ApiKeyRecord, AuditEntry, CollectionVersion, Job, Lease, VersionState
from indexing.schema import api_keys, audit_log, collection_versions, collections, jobs, leases, tenants
from indexing.state_db import SqlBase, loads, timed
from indexing.state_sql import CID
from quarry.errors import CollectionNotFound, Conflict, NotFound

_C, _V, _J, _K, _A, _L = collections.c, collection_versions.c, jobs.c, api_keys.c, audit_log.c, leases.c
_VERSION_COLUMNS = (
    _V.version, _V.physical_name, _V.state, _V.model_fingerprint, _V.model_name, _V.dim, _V.chunking, _V.analyzer,
    _V.index_plan, _V.built_from_seq, _V.created_at, _V.swapped_at, _V.retire_after,
)
_VERSIONS = sa.select(*_VERSION_COLUMNS).where(_V.collection_id == CID)
_JOBS = sa.select(
    _J.id, _J.kind, _C.name, _J.tenant_id, _J.state, _J.params, _J.cursor, _J.counters, _J.error, _J.lease_owner,
    _J.lease_expires_at, _J.created_at, _J.updated_at,
).select_from(jobs.outerjoin(collections, _C.id == _J.collection_id))
_KEY_COLUMNS = (
    _K.id, _K.tenant_id, _K.prefix, _K.hash, _K.name, _K.scopes, _K.collections, _K.rate, _K.priority, _K.created_at,
    _K.expires_at, _K.revoked_at, _K.token_rate,
)
_KEYS = sa.select(*_KEY_COLUMNS)
_RETIRE = bp("b_retire", type_=sa.Float)
_CID = sa.select(_C.id).where(_C.tenant_id == bp("tenant"), _C.name == bp("cname"))


class SqlAdmin(SqlBase):
    """Versions, leases, jobs, tenants, API keys and the audit log."""

    def _cid(self, conn: sa.Connection, name: str) -> int:
        cid = conn.execute(_CID, {"tenant": self.tenant, "cname": name}).scalar()
        if cid is None:
            raise CollectionNotFound(name)
        return int(cid)

    # --- physical versions ---------------------------------------------------------------
    @timed
    def create_version(self, name: str, version: CollectionVersion) -> None:
        """Record a new physical version.

        Raises:
            CollectionNotFound: No such collection.
            Conflict: The collection already has a version of that number.
        """
        v = version
        with self._write() as conn:
            cid = self._cid(conn, name)
            taken = sa.select(sa.literal(1)).where(_V.collection_id == cid, _V.version == v.version)
            if conn.execute(taken).first():
                raise Conflict(f"collection {name!r} already has a version {v.version}")
            conn.execute(collection_versions.insert().values(
                collection_id=cid, version=v.version, physical_name=v.physical_name, state=v.state,
                model_fingerprint=v.model_fingerprint, model_name=v.model_name, dim=v.dim,
                chunking=json.dumps(v.chunking), analyzer=v.analyzer, index_plan=json.dumps(v.index_plan),
                built_from_seq=v.built_from_seq, created_at=v.created_at or time.time(), swapped_at=v.swapped_at,
                retire_after=v.retire_after,
            ))

    @timed
    def list_versions(self, name: str) -> list[CollectionVersion]:
        """The collection's versions, oldest first (``[]`` for an unknown collection)."""
        with self._read() as conn:
            rows = conn.execute(_VERSIONS.order_by(_V.version), {"tenant": self.tenant, "cname": name}).all()
        return [_version(r) for r in rows]

    @timed
    def get_version(self, name: str, version: int) -> CollectionVersion | None:
        """One version, or ``None``."""
        with self._read() as conn:
            row = conn.execute(
                _VERSIONS.where(_V.version == bp("b_version")),
                {"tenant": self.tenant, "cname": name, "b_version": version},
            ).first()
        return None if row is None else _version(row)

    @timed
    def set_version_state(
        self, name: str, version: int, state: VersionState, *, retire_after: float | None = None
    ) -> None:
        """Set a version's state (and its ``retire_after``, when given).

        Raises:
            NotFound: No such collection or version.
        """
        with self._write() as conn:
            changed = conn.execute(
                collection_versions.update()
                .where(_V.collection_id == CID, _V.version == bp("b_version"))
                .values(state=bp("b_state"), retire_after=sa.func.coalesce(_RETIRE, _V.retire_after)),
                {"tenant": self.tenant, "cname": name, "b_version": version, "b_state": state,
                 "b_retire": retire_after},
            ).rowcount
            if not changed:
                raise NotFound(f"collection {name!r} has no version {version}")

    @timed
    def set_live_version(self, name: str, version: int, *, retire_after: float | None = None) -> None:
        """Make ``version`` the live one, in one transaction.

        The collection's ``live_version`` becomes ``version``, that version ``live`` (``swapped_at``
        now), the previous live one ``retired`` with ``retire_after``. Version ``0`` (the original
        store collection, named as the collection) has no row.

        Raises:
            NotFound: No such collection, or no such version (other than 0).
        """
        now = time.time()
        with self._write() as conn:
            row = conn.execute(
                sa.select(_C.id, _C.live_version).where(_C.tenant_id == self.tenant, _C.name == name)
            ).first()
            if row is None:
                raise CollectionNotFound(name)
            cid, previous = int(row[0]), int(row[1])
            of = collection_versions.update().where(_V.collection_id == cid)
            if version != 0 and not conn.execute(
                of.where(_V.version == version).values(state="live", swapped_at=now)
            ).rowcount:
                raise NotFound(f"collection {name!r} has no version {version}")
            if previous != version:
                conn.execute(of.where(_V.version == previous).values(state="retired", retire_after=retire_after))
            conn.execute(collections.update().where(_C.id == cid).values(live_version=version))

    # --- leases --------------------------------------------------------------------------
    @timed
    def acquire_lease(self, name: str, owner: str, ttl_s: float) -> bool:
        """Take the lease if it is free, lapsed, or already ``owner``'s (then it is renewed).

        One compare-and-set statement: of two processes racing for it, exactly one wins.

        Returns:
            Whether ``owner`` holds it now, until the database's now + ``ttl_s``.
        """
        now = self._now_sql
        with self._write(notify=False) as conn:
            row = conn.execute(sa.text(
                f"INSERT INTO leases (name, owner, expires_at) VALUES (:name, :owner, {now} + :ttl) "  # noqa: S608
                "ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at "
                f"WHERE leases.owner = excluded.owner OR leases.expires_at < {now} RETURNING owner"
            ), {"name": name, "owner": owner, "ttl": ttl_s}).first()
        return row is not None

    @timed
    def renew_lease(self, name: str, owner: str, ttl_s: float) -> bool:
        """Extend ``owner``'s lease to now + ``ttl_s``; ``False`` if another holds it or none exists."""
        with self._write(notify=False) as conn:
            return bool(conn.execute(
                leases.update().where(_L.name == name, _L.owner == owner).values(expires_at=self.now + ttl_s)
            ).rowcount)

    @timed
    def release_lease(self, name: str, owner: str) -> bool:
        """Drop ``owner``'s lease; ``False`` if it was not theirs."""
        with self._write(notify=False) as conn:
            return bool(conn.execute(leases.delete().where(_L.name == name, _L.owner == owner)).rowcount)

    @timed
    def get_lease(self, name: str) -> Lease | None:
        """The lease row (lapsed or not), or ``None``."""
        with self._read() as conn:
            row = conn.execute(sa.select(_L.name, _L.owner, _L.expires_at).where(_L.name == name)).first()
        return None if row is None else Lease(row[0], row[1], float(row[2]))

    # --- jobs ----------------------------------------------------------------------------
    @timed
    def create_job(
        self, kind: str, *, collection: str | None = None, params: dict[str, Any] | None = None,
        state: str = "queued", job_id: str | None = None,
    ) -> Job:
        """Insert a job (a random hex id unless ``job_id``).

        Raises:
            CollectionNotFound: ``collection`` is named but does not exist.
            Conflict: ``job_id`` exists.
        """
        job_id = job_id or uuid.uuid4().hex
        now = time.time()
        with self._write(notify=False) as conn:
            cid = None if collection is None else self._cid(conn, collection)
            if conn.execute(sa.select(_J.id).where(_J.id == job_id)).first():
                raise Conflict(f"job {job_id!r} exists")
            conn.execute(jobs.insert().values(
                id=job_id, kind=kind, collection_id=cid, tenant_id=self.tenant, state=state,
                params=json.dumps(params or {}), counters="{}", created_at=now, updated_at=now,
            ))
            return self._job(conn, job_id)

    @timed
    def get_job(self, job_id: str) -> Job | None:
        """One job, or ``None``."""
        with self._read() as conn:
            row = conn.execute(_JOBS.where(_J.id == job_id)).first()
        return None if row is None else _job(row)

    def _job(self, conn: sa.Connection, job_id: str) -> Job:
        row = conn.execute(_JOBS.where(_J.id == job_id)).first()
        if row is None:
            raise NotFound(f"no job {job_id!r}")
        return _job(row)

    @timed
    def update_job(
        self, job_id: str, *, state: str | None = None, cursor: str | None = None,
        counters: dict[str, int] | None = None, error: str | None = None,
    ) -> Job:
        """Set the given fields (``None`` keeps one; counters replace the stored ones).

        Raises:
            NotFound: No such job.
        """
        given = {"state": state, "cursor": cursor, "counters": None if counters is None else json.dumps(counters),
                 "error": error}
        with self._write(notify=False) as conn:
            conn.execute(jobs.update().where(_J.id == job_id).values(
                updated_at=time.time(), **{k: v for k, v in given.items() if v is not None}
            ))
            return self._job(conn, job_id)

    @timed
    def list_jobs(self, *, collection: str | None = None, state: str | None = None, limit: int = 100) -> list[Job]:
        """Jobs of this tenant, newest first, optionally of one collection or state."""
        query = _JOBS.where(_J.tenant_id == self.tenant)
        if collection is not None:
            query = query.where(_C.name == collection)
        if state is not None:
            query = query.where(_J.state == state)
        with self._read() as conn:
            rows = conn.execute(query.order_by(_J.created_at.desc(), _J.id).limit(limit)).all()
        return [_job(r) for r in rows]

    @timed
    def claim_job(self, job_id: str, owner: str, ttl_s: float) -> bool:
        """The job's lease, as :meth:`acquire_lease` (renews when ``owner`` holds it)."""
        free = sa.or_(_J.lease_owner.is_(None), _J.lease_owner == owner, _J.lease_expires_at < self.now)
        with self._write(notify=False) as conn:
            return bool(conn.execute(
                jobs.update().where(_J.id == job_id, free).values(lease_owner=owner, lease_expires_at=self.now + ttl_s)
            ).rowcount)

    @timed
    def release_job(self, job_id: str, owner: str) -> bool:
        """Drop ``owner``'s lease on the job; ``False`` if it was not theirs."""
        with self._write(notify=False) as conn:
            return bool(conn.execute(
                jobs.update().where(_J.id == job_id, _J.lease_owner == owner)
                .values(lease_owner=None, lease_expires_at=None)
            ).rowcount)

    # --- tenants, API keys, audit ----------------------------------------------------------
    @timed
    def create_tenant(self, tenant_id: str, name: str) -> None:
        """Insert a tenant.

        Raises:
            Conflict: It exists.
        """
        with self._write() as conn:
            if conn.execute(sa.select(tenants.c.id).where(tenants.c.id == tenant_id)).first():
                raise Conflict(f"tenant {tenant_id!r} exists")
            conn.execute(tenants.insert().values(id=tenant_id, name=name, created_at=time.time()))

    @timed
    def list_tenants(self) -> list[tuple[str, str]]:
        """``[(id, name), ...]`` sorted by id."""
        with self._read() as conn:
            rows = conn.execute(sa.select(tenants.c.id, tenants.c.name).order_by(tenants.c.id)).all()
        return [(r[0], r[1]) for r in rows]

    @timed
    def insert_api_key(self, key: ApiKeyRecord) -> None:
        """Store a key record (``created_at`` 0 means now).

        Raises:
            Conflict: A key with that id exists.
        """
        k = key
        with self._write() as conn:
            if conn.execute(sa.select(_K.id).where(_K.id == k.id)).first():
                raise Conflict(f"API key {k.id!r} exists")
            conn.execute(api_keys.insert().values(
                id=k.id, tenant_id=k.tenant_id, prefix=k.prefix, hash=k.hash, name=k.name,
                scopes=json.dumps(k.scopes), collections=None if k.collections is None else json.dumps(k.collections),
                rate=k.rate, priority=k.priority, created_at=k.created_at or time.time(), expires_at=k.expires_at,
                revoked_at=k.revoked_at, token_rate=k.token_rate,
            ))

    @timed
    def get_api_key(self, key_id: str) -> ApiKeyRecord | None:
        """A key by id, revoked or not."""
        with self._read() as conn:
            row = conn.execute(_KEYS.where(_K.id == key_id)).first()
        return None if row is None else _key(row)

    @timed
    def find_api_keys(self, prefix: str) -> list[ApiKeyRecord]:
        """The keys with this display prefix, revoked too (the caller checks)."""
        with self._read() as conn:
            rows = conn.execute(_KEYS.where(_K.prefix == prefix).order_by(_K.id)).all()
        return [_key(r) for r in rows]

    @timed
    def list_api_keys(self, tenant_id: str | None = None) -> list[ApiKeyRecord]:
        """Keys, oldest first, optionally of one tenant."""
        query = _KEYS if tenant_id is None else _KEYS.where(_K.tenant_id == tenant_id)
        with self._read() as conn:
            rows = conn.execute(query.order_by(_K.created_at, _K.id)).all()
        return [_key(r) for r in rows]

    @timed
    def any_api_key(self) -> bool:
        """Whether any key exists (revoked ones too)."""
        with self._read() as conn:
            return conn.execute(sa.select(_K.id).limit(1)).first() is not None

    @timed
    def revoke_api_key(self, key_id: str) -> bool:
        """Set ``revoked_at`` to now; ``False`` if unknown or already revoked."""
        with self._write() as conn:
            return bool(conn.execute(
                api_keys.update().where(_K.id == key_id, _K.revoked_at.is_(None)).values(revoked_at=time.time())
            ).rowcount)

    @timed
    def append_audit(self, entry: AuditEntry) -> int:
        """Append an audit row (``at`` 0 means now); returns its id."""
        e = entry
        with self._write(notify=False) as conn:
            new = conn.execute(audit_log.insert().values(
                at=e.at or time.time(), key_id=e.key_id, tenant_id=e.tenant_id, action=e.action, target=e.target,
                detail=json.dumps(e.detail),
            ).returning(_A.id)).scalar_one()
        return int(new)

    @timed
    def list_audit(
        self, *, tenant_id: str | None = None, since: float = 0.0, limit: int = 100, after_id: int = 0,
    ) -> list[AuditEntry]:
        """Audit rows at or after ``since`` (Unix seconds) with an id over ``after_id``, optionally of one tenant.

        In the order they were appended (their ids), so ``after_id`` = the last id of a page gives
        the next page without a gap or a repeat.
        """
        query = sa.select(_A.action, _A.key_id, _A.tenant_id, _A.target, _A.detail, _A.at, _A.id).where(
            _A.at >= since, _A.id > after_id
        )
        if tenant_id is not None:
            query = query.where(_A.tenant_id == tenant_id)
        with self._read() as conn:
            rows = conn.execute(query.order_by(_A.id).limit(limit)).all()
        return [AuditEntry(r[0], r[1], r[2], r[3], loads(r[4]), float(r[5]), int(r[6])) for r in rows]


def _version(r: Any) -> CollectionVersion:
    return CollectionVersion(
        int(r[0]), r[1], r[2], r[3], r[4], r[5], loads(r[6]), r[7], loads(r[8]), r[9],
        float(r[10]), r[11], r[12],
    )


def _job(r: Any) -> Job:
    return Job(
        r[0], r[1], r[2], r[3], r[4], loads(r[5]), r[6], loads(r[7]), r[8], r[9],
        None if r[10] is None else float(r[10]), float(r[11]), float(r[12]),
    )


def _key(r: Any) -> ApiKeyRecord:
    return ApiKeyRecord(
        r[0], r[1], r[2], r[3], r[4], loads(r[5]), None if r[6] is None else loads(r[6]), r[7],
        int(r[8]), float(r[9]), r[10], r[11], r[12],
    )
