#!/usr/bin/env bash
# The main job on the embedded default (Milvus Lite + packaged all-MiniLM-L6-v2, no config):
# set up, ingest a corpus, start the REST API, and run a search over REST with curl.
#   bash scripts/demo.sh                      # ingests ../shared/data/scifact
#   bash scripts/demo.sh path/to/beir-folder  # or a .jsonl file, or a folder of .txt/.md files
# Env: QUARRY_DATA_DIR (./data), QUARRY_API__PORT (8000), QUARRY_DEMO_QUERY,
#      QUARRY_DEMO_DETACH=1 to leave the server running in the background and return.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
CORPUS="${1:-../shared/data/scifact}"
NAME="$(basename "$(cd "$(dirname "$CORPUS")" && pwd)/$(basename "$CORPUS")")"
NAME="${NAME%.jsonl}"; NAME="$(echo "$NAME" | sed 's/[^A-Za-z0-9_]/_/g')"
[[ "$NAME" =~ ^[A-Za-z] ]] || NAME="c_$NAME"
PORT="${QUARRY_API__PORT:-8000}"
QUERY="${QUARRY_DEMO_QUERY:-vitamin D deficiency increases the risk of cancer}"
mkdir -p "${QUARRY_DATA_DIR:-data}"

echo "== ingest $CORPUS -> collection $NAME (re-runs skip unchanged documents)"
quarry ingest "$CORPUS" --collection "$NAME"

echo "== serve on 127.0.0.1:$PORT"
quarry serve --host 127.0.0.1 --port "$PORT" >"${QUARRY_DATA_DIR:-data}/serve.log" 2>&1 &
SERVER=$!
# until the demo hands the server over (detached or foreground), a failure stops it
trap 'kill $SERVER 2>/dev/null' EXIT
for _ in $(seq 1 180); do
  curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break
  kill -0 "$SERVER" 2>/dev/null || { cat "${QUARRY_DATA_DIR:-data}/serve.log"; exit 1; }
  sleep 1
done
curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null

# JSON-encoded by Python, so quotes or backslashes in QUARRY_DEMO_QUERY stay valid JSON
BODY=$(python -c 'import json, sys; print(json.dumps({"query": sys.argv[1], "top_k": 3, "mode": "hybrid"}))' "$QUERY")
echo "== curl -s -X POST http://127.0.0.1:$PORT/v1/collections/$NAME/search -H 'content-type: application/json' -d '$BODY'"
curl -sS --fail-with-body -X POST "http://127.0.0.1:$PORT/v1/collections/$NAME/search" \
  -H 'content-type: application/json' -d "$BODY" | python -m json.tool
echo "== API docs: http://127.0.0.1:$PORT/docs   (server pid $SERVER, log ${QUARRY_DATA_DIR:-data}/serve.log)"
if [ "${QUARRY_DEMO_DETACH:-0}" = "1" ]; then
  trap - EXIT
  echo "server left running; stop it with: kill $SERVER"
  exit 0
fi
echo "serving; Ctrl-C to stop"
trap 'kill $SERVER 2>/dev/null' INT TERM EXIT
wait "$SERVER"
