-- Step 1: the docstore's schema as Quarry wrote it before versioned migrations (unchanged).
CREATE TABLE IF NOT EXISTS collections (
    name TEXT PRIMARY KEY, config TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS documents (
    collection TEXT NOT NULL, document_id TEXT NOT NULL, content_hash TEXT NOT NULL,
    PRIMARY KEY (collection, document_id)
);
CREATE TABLE IF NOT EXISTS chunks (
    collection TEXT NOT NULL, chunk_id TEXT NOT NULL, document_id TEXT NOT NULL,
    position INTEGER NOT NULL, text TEXT NOT NULL, tokens TEXT NOT NULL, payload TEXT NOT NULL,
    PRIMARY KEY (collection, chunk_id)
);
CREATE INDEX IF NOT EXISTS chunks_by_document ON chunks (collection, document_id);
CREATE TABLE IF NOT EXISTS pending_deletes (
    collection TEXT NOT NULL, chunk_id TEXT NOT NULL, PRIMARY KEY (collection, chunk_id)
);
