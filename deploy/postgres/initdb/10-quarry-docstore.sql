-- The API replicas' shared docstore (QUARRY_DOCSTORE__URL=postgresql://quarry:...@postgres:5432/quarry_docstore),
-- a database of its own beside "quarry" (the pgvector store). The postgres image runs this once,
-- when it initialises an empty data volume; on an existing volume create it by hand:
--   docker compose exec postgres createdb -U quarry -O quarry quarry_docstore
-- Quarry creates and migrates its tables itself (indexing/docstore.py).
CREATE DATABASE quarry_docstore OWNER quarry;
