#!/usr/bin/env bash
# Milvus 2.3.5 standalone server from the pip package `milvus` (extra `quarry[milvus-server]`).
#
#   scripts/services/milvus.sh start    # start in the background, wait until healthy (idempotent)
#   scripts/services/milvus.sh stop     # SIGINT, wait; SIGTERM/SIGKILL only if it does not exit
#   scripts/services/milvus.sh status   # exit 0 when healthy
#   scripts/services/milvus.sh url      # print the store URL
#
# URL: milvus://127.0.0.1:19530 (gRPC); health: http://127.0.0.1:9091/healthz.
# Data: ${QUARRY_SERVICES_DIR:-/tmp/quarry-services}/milvus/{data,milvus.log,milvus.pid}
# Env:  QUARRY_SERVICES_DIR, QUARRY_MILVUS_START_TIMEOUT_S (180), QUARRY_MILVUS_STOP_TIMEOUT_S (60),
#       MILVUS_SERVER (the milvus-server launcher; default: the repo's .venv, else PATH).
# Runs as root too (the server has no root check). Tests use Strong consistency, so no flush
# interval matters. The server is a test/dev service: its data dir is reused across restarts.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SVC="${QUARRY_SERVICES_DIR:-/tmp/quarry-services}"
ROOT="$SVC/milvus"
DATA="$ROOT/data"
LOG="$ROOT/milvus.log"
PIDFILE="$ROOT/milvus.pid"
HEALTH_URL="http://127.0.0.1:9091/healthz"
URL="milvus://127.0.0.1:19530"
START_TIMEOUT_S="${QUARRY_MILVUS_START_TIMEOUT_S:-180}"
STOP_TIMEOUT_S="${QUARRY_MILVUS_STOP_TIMEOUT_S:-60}"

log() { echo "[milvus.sh] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

launcher() {
    if [[ -n "${MILVUS_SERVER:-}" ]]; then echo "$MILVUS_SERVER"
    elif [[ -x "$REPO/.venv/bin/milvus-server" ]]; then echo "$REPO/.venv/bin/milvus-server"
    else command -v milvus-server || die "milvus-server not found: pip install 'quarry[milvus-server]'"
    fi
}

healthy() {
    local body
    body="$(curl -fsS -m 2 "$HEALTH_URL" 2>/dev/null)" || return 1
    [[ "$body" == OK* ]]
}

running_pid() {
    [[ -f "$PIDFILE" ]] || return 1
    local pid
    pid="$(cat "$PIDFILE")"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

wait_healthy() {
    local pid="$1" waited=0
    until healthy; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 30 "$LOG" >&2 || true
            rm -f "$PIDFILE"
            die "milvus-server (pid $pid) exited during start-up; log: $LOG"
        fi
        if (( waited >= START_TIMEOUT_S )); then
            tail -n 30 "$LOG" >&2 || true
            stop
            die "milvus-server not healthy after ${START_TIMEOUT_S}s; log: $LOG"
        fi
        sleep 1
        waited=$((waited + 1))
    done
}

start() {
    local pid
    if pid="$(running_pid)"; then
        wait_healthy "$pid"
        log "already running (pid $pid): $URL"
        return 0
    fi
    if healthy; then
        die "a Milvus not started by this script already answers on $HEALTH_URL; stop it first"
    fi
    mkdir -p "$DATA"
    local bin
    bin="$(launcher)"
    log "starting $bin --data $DATA (log: $LOG)"
    # setsid: own session, so the server outlives this shell and stop can signal it alone.
    setsid "$bin" --data "$DATA" >>"$LOG" 2>&1 < /dev/null &
    pid=$!
    echo "$pid" > "$PIDFILE"
    wait_healthy "$pid"
    log "healthy (pid $pid): $URL"
}

stop() {
    local pid
    if ! pid="$(running_pid)"; then
        rm -f "$PIDFILE"
        log "not running"
        return 0
    fi
    log "stopping pid $pid (SIGINT)"
    kill -INT "$pid" 2>/dev/null || true
    local waited=0
    while kill -0 "$pid" 2>/dev/null; do
        if (( waited >= STOP_TIMEOUT_S )); then
            log "still running after ${STOP_TIMEOUT_S}s: SIGTERM to its process group"
            kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
            sleep 5
            kill -KILL -- "-$pid" 2>/dev/null || true
            break
        fi
        sleep 1
        waited=$((waited + 1))
    done
    rm -f "$PIDFILE"
    log "stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) healthy && running_pid >/dev/null ;;
    url) echo "$URL" ;;
    *) echo "usage: $0 {start|stop|status|url}" >&2; exit 2 ;;
esac
