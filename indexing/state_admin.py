"""The shared SQL of the state of record's other tables: versions, leases, jobs, tenants, keys, audit.

Plain records in and out (:mod:`indexing.docstore`); what a state or scope means is the callers'
business. Leases compare and set against the database's clock, so hosts whose clocks differ
agree on when one lapsed.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from indexing.docstore import ApiKeyRecord, AuditEntry, CollectionVersion, Job, Lease, VersionState
from indexing.state_sql import CID, SqlBase, Tx
from quarry.errors import CollectionNotFound, Conflict, NotFound

_VERSION_COLUMNS = (
    "version, physical_name, state, model_fingerprint, model_name, dim, chunking, analyzer, index_plan, "
    "built_from_seq, created_at, swapped_at, retire_after"
)
_JOB_COLUMNS = (
    "j.id, j.kind, c.name, j.tenant_id, j.state, j.params, j.cursor, j.counters, j.error, j.lease_owner, "
    "j.lease_expires_at, j.created_at, j.updated_at"
)
_KEY_COLUMNS = (
    "id, tenant_id, prefix, hash, name, scopes, collections, rate, priority, created_at, expires_at, revoked_at, "
    "token_rate"
)


class SqlAdmin(SqlBase):
    """Versions, leases, jobs, tenants, API keys and the audit log over :class:`~indexing.state_sql.Tx`."""

    def _cid(self, tx: Tx, name: str) -> int:
        row = tx.one("SELECT id FROM collections WHERE tenant_id = ? AND name = ?", self._key(name))
        if row is None:
            raise CollectionNotFound(name)
        return int(row[0])

    # --- physical versions ---------------------------------------------------------------
    def create_version(self, name: str, version: CollectionVersion) -> None:
        """Record a new physical version.

        Raises:
            CollectionNotFound: No such collection.
            Conflict: The collection already has a version of that number.
        """
        v = version
        with self._write() as tx:
            cid = self._cid(tx, name)
            if tx.one("SELECT 1 FROM collection_versions WHERE collection_id = ? AND version = ?", (cid, v.version)):
                raise Conflict(f"collection {name!r} already has a version {v.version}")
            tx.run(
                f"INSERT INTO collection_versions (collection_id, {_VERSION_COLUMNS}) "  # noqa: S608
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (cid, v.version, v.physical_name, v.state, v.model_fingerprint, v.model_name, v.dim,
                 json.dumps(v.chunking), v.analyzer, json.dumps(v.index_plan), v.built_from_seq,
                 v.created_at or time.time(), v.swapped_at, v.retire_after),
            )

    def list_versions(self, name: str) -> list[CollectionVersion]:
        """The collection's versions, oldest first (``[]`` for an unknown collection)."""
        with self._read() as tx:
            rows = tx.all(
                f"SELECT {_VERSION_COLUMNS} FROM collection_versions WHERE collection_id = {CID} "  # noqa: S608
                "ORDER BY version",
                self._key(name),
            )
        return [_version(r) for r in rows]

    def get_version(self, name: str, version: int) -> CollectionVersion | None:
        """One version, or ``None``."""
        with self._read() as tx:
            row = tx.one(
                f"SELECT {_VERSION_COLUMNS} FROM collection_versions "  # noqa: S608
                f"WHERE collection_id = {CID} AND version = ?",
                (*self._key(name), version),
            )
        return None if row is None else _version(row)

    def set_version_state(
        self, name: str, version: int, state: VersionState, *, retire_after: float | None = None
    ) -> None:
        """Set a version's state (and its ``retire_after``, when given).

        Raises:
            NotFound: No such collection or version.
        """
        with self._write() as tx:
            changed = tx.run(
                f"UPDATE collection_versions SET state = ?, retire_after = COALESCE(?, retire_after) "  # noqa: S608
                f"WHERE collection_id = {CID} AND version = ?",
                (state, retire_after, *self._key(name), version),
            )
            if not changed:
                raise NotFound(f"collection {name!r} has no version {version}")

    def set_live_version(self, name: str, version: int, *, retire_after: float | None = None) -> None:
        """Make ``version`` the live one, in one transaction.

        The collection's ``live_version`` becomes ``version``, that version ``live`` (``swapped_at``
        now), the previous live one ``retired`` with ``retire_after``. Version ``0`` (the original
        store collection, named as the collection) has no row.

        Raises:
            NotFound: No such collection, or no such version (other than 0).
        """
        now = time.time()
        with self._write() as tx:
            row = tx.one("SELECT id, live_version FROM collections WHERE tenant_id = ? AND name = ?", self._key(name))
            if row is None:
                raise CollectionNotFound(name)
            cid, previous = int(row[0]), int(row[1])
            if version != 0 and not tx.run(
                "UPDATE collection_versions SET state = 'live', swapped_at = ? WHERE collection_id = ? AND version = ?",
                (now, cid, version),
            ):
                raise NotFound(f"collection {name!r} has no version {version}")
            if previous != version:
                tx.run(
                    "UPDATE collection_versions SET state = 'retired', retire_after = ? "
                    "WHERE collection_id = ? AND version = ?",
                    (retire_after, cid, previous),
                )
            tx.run("UPDATE collections SET live_version = ? WHERE id = ?", (version, cid))

    # --- leases --------------------------------------------------------------------------
    def acquire_lease(self, name: str, owner: str, ttl_s: float) -> bool:
        """Take the lease if it is free, lapsed, or already ``owner``'s (then it is renewed).

        One compare-and-set statement: of two processes racing for it, exactly one wins.

        Returns:
            Whether ``owner`` holds it now, until the database's now + ``ttl_s``.
        """
        with self._write() as tx:
            row = tx.one(
                f"INSERT INTO leases (name, owner, expires_at) VALUES (?, ?, {self.now_sql} + ?) "  # noqa: S608
                "ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at "
                f"WHERE leases.owner = excluded.owner OR leases.expires_at < {self.now_sql} RETURNING owner",
                (name, owner, ttl_s),
            )
        return row is not None

    def renew_lease(self, name: str, owner: str, ttl_s: float) -> bool:
        """Extend ``owner``'s lease to now + ``ttl_s``; ``False`` if another holds it or none exists."""
        with self._write() as tx:
            return bool(
                tx.run(
                    f"UPDATE leases SET expires_at = {self.now_sql} + ? WHERE name = ? AND owner = ?",  # noqa: S608
                    (ttl_s, name, owner),
                )
            )

    def release_lease(self, name: str, owner: str) -> bool:
        """Drop ``owner``'s lease; ``False`` if it was not theirs."""
        with self._write() as tx:
            return bool(tx.run("DELETE FROM leases WHERE name = ? AND owner = ?", (name, owner)))

    def get_lease(self, name: str) -> Lease | None:
        """The lease row (lapsed or not), or ``None``."""
        with self._read() as tx:
            row = tx.one("SELECT name, owner, expires_at FROM leases WHERE name = ?", (name,))
        return None if row is None else Lease(row[0], row[1], float(row[2]))

    # --- jobs ----------------------------------------------------------------------------
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
        with self._write() as tx:
            cid = None if collection is None else self._cid(tx, collection)
            if tx.one("SELECT 1 FROM jobs WHERE id = ?", (job_id,)):
                raise Conflict(f"job {job_id!r} exists")
            tx.run(
                "INSERT INTO jobs (id, kind, collection_id, tenant_id, state, params, counters, created_at, "
                "updated_at) VALUES (?, ?, ?, ?, ?, ?, '{}', ?, ?)",
                (job_id, kind, cid, self.tenant, state, json.dumps(params or {}), now, now),
            )
            return self._job(tx, job_id)

    def get_job(self, job_id: str) -> Job | None:
        """One job, or ``None``."""
        with self._read() as tx:
            row = tx.one(
                f"SELECT {_JOB_COLUMNS} FROM jobs AS j LEFT JOIN collections AS c ON c.id = j.collection_id "  # noqa: S608
                "WHERE j.id = ?",
                (job_id,),
            )
        return None if row is None else _job(row)

    def _job(self, tx: Tx, job_id: str) -> Job:
        row = tx.one(
            f"SELECT {_JOB_COLUMNS} FROM jobs AS j LEFT JOIN collections AS c ON c.id = j.collection_id "  # noqa: S608
            "WHERE j.id = ?",
            (job_id,),
        )
        if row is None:
            raise NotFound(f"no job {job_id!r}")
        return _job(row)

    def update_job(
        self, job_id: str, *, state: str | None = None, cursor: str | None = None,
        counters: dict[str, int] | None = None, error: str | None = None,
    ) -> Job:
        """Set the given fields (``None`` keeps one; counters replace the stored ones).

        Raises:
            NotFound: No such job.
        """
        with self._write() as tx:
            tx.run(
                "UPDATE jobs SET state = COALESCE(?, state), cursor = COALESCE(?, cursor), "
                "counters = COALESCE(?, counters), error = COALESCE(?, error), updated_at = ? WHERE id = ?",
                (state, cursor, None if counters is None else json.dumps(counters), error, time.time(), job_id),
            )
            return self._job(tx, job_id)

    def list_jobs(self, *, collection: str | None = None, state: str | None = None, limit: int = 100) -> list[Job]:
        """Jobs of this tenant, newest first, optionally of one collection or state."""
        sql = f"SELECT {_JOB_COLUMNS} FROM jobs AS j LEFT JOIN collections AS c ON c.id = j.collection_id "  # noqa: S608
        sql += "WHERE j.tenant_id = ?"
        params: list[Any] = [self.tenant]
        if collection is not None:
            sql += " AND c.name = ?"
            params.append(collection)
        if state is not None:
            sql += " AND j.state = ?"
            params.append(state)
        with self._read() as tx:
            rows = tx.all(sql + " ORDER BY j.created_at DESC, j.id LIMIT ?", (*params, limit))
        return [_job(r) for r in rows]

    def claim_job(self, job_id: str, owner: str, ttl_s: float) -> bool:
        """The job's lease, as :meth:`acquire_lease` (renews when ``owner`` holds it)."""
        with self._write() as tx:
            return bool(
                tx.run(
                    f"UPDATE jobs SET lease_owner = ?, lease_expires_at = {self.now_sql} + ? WHERE id = ? "  # noqa: S608
                    f"AND (lease_owner IS NULL OR lease_owner = ? OR lease_expires_at < {self.now_sql})",
                    (owner, ttl_s, job_id, owner),
                )
            )

    def release_job(self, job_id: str, owner: str) -> bool:
        """Drop ``owner``'s lease on the job; ``False`` if it was not theirs."""
        with self._write() as tx:
            return bool(
                tx.run(
                    "UPDATE jobs SET lease_owner = NULL, lease_expires_at = NULL WHERE id = ? AND lease_owner = ?",
                    (job_id, owner),
                )
            )

    # --- tenants, API keys, audit ----------------------------------------------------------
    def create_tenant(self, tenant_id: str, name: str) -> None:
        """Insert a tenant.

        Raises:
            Conflict: It exists.
        """
        with self._write() as tx:
            if tx.one("SELECT 1 FROM tenants WHERE id = ?", (tenant_id,)):
                raise Conflict(f"tenant {tenant_id!r} exists")
            tx.run("INSERT INTO tenants (id, name, created_at) VALUES (?, ?, ?)", (tenant_id, name, time.time()))

    def list_tenants(self) -> list[tuple[str, str]]:
        """``[(id, name), ...]`` sorted by id."""
        with self._read() as tx:
            return [(r[0], r[1]) for r in tx.all("SELECT id, name FROM tenants ORDER BY id")]

    def insert_api_key(self, key: ApiKeyRecord) -> None:
        """Store a key record (``created_at`` 0 means now).

        Raises:
            Conflict: A key with that id exists.
        """
        k = key
        collections = None if k.collections is None else json.dumps(k.collections)
        with self._write() as tx:
            if tx.one("SELECT 1 FROM api_keys WHERE id = ?", (k.id,)):
                raise Conflict(f"API key {k.id!r} exists")
            tx.run(
                f"INSERT INTO api_keys ({_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
                (k.id, k.tenant_id, k.prefix, k.hash, k.name, json.dumps(k.scopes), collections, k.rate,
                 k.priority, k.created_at or time.time(), k.expires_at, k.revoked_at, k.token_rate),
            )

    def get_api_key(self, key_id: str) -> ApiKeyRecord | None:
        """A key by id, revoked or not."""
        with self._read() as tx:
            row = tx.one(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ?", (key_id,))  # noqa: S608
        return None if row is None else _key(row)

    def find_api_keys(self, prefix: str) -> list[ApiKeyRecord]:
        """The keys with this display prefix, revoked too (the caller checks)."""
        with self._read() as tx:
            rows = tx.all(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE prefix = ? ORDER BY id", (prefix,))  # noqa: S608
        return [_key(r) for r in rows]

    def list_api_keys(self, tenant_id: str | None = None) -> list[ApiKeyRecord]:
        """Keys, oldest first, optionally of one tenant."""
        where, params = ("", ()) if tenant_id is None else ("WHERE tenant_id = ? ", (tenant_id,))
        with self._read() as tx:
            rows = tx.all(f"SELECT {_KEY_COLUMNS} FROM api_keys {where}ORDER BY created_at, id", params)  # noqa: S608
        return [_key(r) for r in rows]

    def revoke_api_key(self, key_id: str) -> bool:
        """Set ``revoked_at`` to now; ``False`` if unknown or already revoked."""
        with self._write() as tx:
            return bool(
                tx.run("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (time.time(), key_id))
            )

    def append_audit(self, entry: AuditEntry) -> int:
        """Append an audit row (``at`` 0 means now); returns its id."""
        e = entry
        with self._write() as tx:
            row = tx.one(
                "INSERT INTO audit_log (at, key_id, tenant_id, action, target, detail) VALUES (?, ?, ?, ?, ?, ?) "
                "RETURNING id",
                (e.at or time.time(), e.key_id, e.tenant_id, e.action, e.target, json.dumps(e.detail)),
            )
        assert row is not None  # noqa: S101 - INSERT ... RETURNING returns its row
        return int(row[0])

    def list_audit(self, *, tenant_id: str | None = None, since: float = 0.0, limit: int = 100) -> list[AuditEntry]:
        """Audit rows at or after ``since`` (Unix seconds), oldest first, optionally of one tenant."""
        where, params = ("", ()) if tenant_id is None else (" AND tenant_id = ?", (tenant_id,))
        with self._read() as tx:
            rows = tx.all(
                "SELECT action, key_id, tenant_id, target, detail, at, id FROM audit_log "  # noqa: S608
                f"WHERE at >= ?{where} ORDER BY at, id LIMIT ?",
                (since, *params, limit),
            )
        return [AuditEntry(r[0], r[1], r[2], r[3], json.loads(r[4]), float(r[5]), int(r[6])) for r in rows]


def _version(r: tuple[Any, ...]) -> CollectionVersion:
    return CollectionVersion(
        int(r[0]), r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), r[7], json.loads(r[8]), r[9],
        float(r[10]), r[11], r[12],
    )


def _job(r: tuple[Any, ...]) -> Job:
    return Job(
        r[0], r[1], r[2], r[3], r[4], json.loads(r[5]), r[6], json.loads(r[7]), r[8], r[9],
        None if r[10] is None else float(r[10]), float(r[11]), float(r[12]),
    )


def _key(r: tuple[Any, ...]) -> ApiKeyRecord:
    return ApiKeyRecord(
        r[0], r[1], r[2], r[3], r[4], json.loads(r[5]), None if r[6] is None else json.loads(r[6]), r[7],
        int(r[8]), float(r[9]), r[10], r[11], r[12],
    )
