-- Step 2: the state of record of docs/design-state.md. Times are Unix seconds (REAL).
-- Child tables are keyed by the collection's surrogate id; rows of a collection that no longer
-- exists (a write that committed after a drop) have no collection to belong to and are not kept.
CREATE TABLE tenants (id TEXT PRIMARY KEY, name TEXT NOT NULL, created_at REAL NOT NULL);
INSERT INTO tenants (id, name, created_at) VALUES ('default', 'default', :now);

CREATE TABLE collections_v2 (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id TEXT NOT NULL DEFAULT 'default',
    name TEXT NOT NULL,
    config TEXT NOT NULL,
    live_version INTEGER NOT NULL DEFAULT 0,
    seq INTEGER NOT NULL DEFAULT 0,
    shared INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    UNIQUE (tenant_id, name)
);
INSERT INTO collections_v2 (tenant_id, name, config, seq, created_at)
    SELECT 'default', name, config, version, :now FROM collections ORDER BY name;

CREATE TABLE documents_v2 (
    collection_id INTEGER NOT NULL,
    document_id TEXT NOT NULL,
    tenant_id TEXT NOT NULL DEFAULT 'default',
    content_hash TEXT NOT NULL,
    title TEXT,
    text TEXT,
    metadata TEXT,
    updated_seq INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (collection_id, document_id)
);
INSERT INTO documents_v2 (collection_id, document_id, tenant_id, content_hash, updated_seq)
    SELECT c.id, d.document_id, c.tenant_id, d.content_hash, c.seq
    FROM documents AS d JOIN collections_v2 AS c ON c.name = d.collection
    ORDER BY d.rowid;

CREATE TABLE chunks_v2 (
    collection_id INTEGER NOT NULL,
    chunking_id TEXT NOT NULL DEFAULT '',
    chunk_id TEXT NOT NULL,
    document_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    text TEXT NOT NULL,
    tokens TEXT NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (collection_id, chunking_id, chunk_id)
);
INSERT INTO chunks_v2 (collection_id, chunking_id, chunk_id, document_id, position, text, tokens, payload)
    SELECT c.id, '', k.chunk_id, k.document_id, k.position, k.text, k.tokens, k.payload
    FROM chunks AS k JOIN collections_v2 AS c ON c.name = k.collection
    ORDER BY k.rowid;

CREATE TABLE pending_deletes_v2 (
    collection_id INTEGER NOT NULL,
    version INTEGER NOT NULL DEFAULT 0,
    chunk_id TEXT NOT NULL,
    PRIMARY KEY (collection_id, version, chunk_id)
);
INSERT INTO pending_deletes_v2 (collection_id, version, chunk_id)
    SELECT c.id, 0, p.chunk_id
    FROM pending_deletes AS p JOIN collections_v2 AS c ON c.name = p.collection
    ORDER BY p.rowid;

DROP TABLE pending_deletes;
DROP TABLE chunks;
DROP TABLE documents;
DROP TABLE collections;
ALTER TABLE collections_v2 RENAME TO collections;
ALTER TABLE documents_v2 RENAME TO documents;
ALTER TABLE chunks_v2 RENAME TO chunks;
ALTER TABLE pending_deletes_v2 RENAME TO pending_deletes;
CREATE INDEX chunks_by_document ON chunks (collection_id, chunking_id, document_id);

CREATE TABLE collection_versions (
    collection_id INTEGER NOT NULL,
    version INTEGER NOT NULL,
    physical_name TEXT NOT NULL,
    model_fingerprint TEXT,
    model_name TEXT,
    dim INTEGER,
    chunking TEXT NOT NULL DEFAULT '{}',
    analyzer TEXT,
    index_plan TEXT NOT NULL DEFAULT '{}',
    state TEXT NOT NULL,
    built_from_seq INTEGER,
    created_at REAL NOT NULL,
    swapped_at REAL,
    retire_after REAL,
    PRIMARY KEY (collection_id, version)
);

CREATE TABLE change_log (
    collection_id INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    document_id TEXT NOT NULL,
    op TEXT NOT NULL,
    content_hash TEXT,
    at REAL NOT NULL,
    PRIMARY KEY (collection_id, seq, document_id)
);

CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    collection_id INTEGER,
    tenant_id TEXT NOT NULL DEFAULT 'default',
    state TEXT NOT NULL,
    params TEXT NOT NULL DEFAULT '{}',
    cursor TEXT,
    counters TEXT NOT NULL DEFAULT '{}',
    error TEXT,
    lease_owner TEXT,
    lease_expires_at REAL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX jobs_by_collection ON jobs (collection_id, created_at);

CREATE TABLE leases (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at REAL NOT NULL);

CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    prefix TEXT NOT NULL,
    hash TEXT NOT NULL,
    name TEXT NOT NULL DEFAULT '',
    scopes TEXT NOT NULL DEFAULT '[]',
    collections TEXT,
    rate REAL,
    priority INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    expires_at REAL,
    revoked_at REAL
);
CREATE INDEX api_keys_by_prefix ON api_keys (prefix);

CREATE TABLE audit_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    key_id TEXT,
    tenant_id TEXT,
    action TEXT NOT NULL,
    target TEXT,
    detail TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_log_by_at ON audit_log (at, id);
