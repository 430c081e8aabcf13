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
# Env:  QUARRY_SERVICES_DIR, QUARRY_MILVUS_START_TIMEOUT_S (180), QUARRY_MILVUS_STOP_TIMEOUT_S (20),
#       QUARRY_MILVUS_KEEP_DATA (0), MILVUS_SERVER (the milvus-server launcher; default: the
#       repo's .venv, else PATH), PYTHON (for the port check; default: the repo's .venv, else python3).
# Runs as root too (the server has no root check). A test/dev service: `start` wipes the data
# dir unless QUARRY_MILVUS_KEEP_DATA=1, because Milvus 2.3.5's graceful stop hangs (it is then
# killed) and a restart on the old data waits for the dead node sessions in its embedded etcd to
# expire, which was seen to take over 3 minutes.
set -euo pipefail

SVC_NAME=milvus.sh
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROOT="$SVC/milvus"
DATA="$ROOT/data"
LOG="$ROOT/milvus.log"
PIDFILE="$ROOT/milvus.pid"
HEALTH_URL="http://127.0.0.1:9091/healthz"
URL="milvus://127.0.0.1:19530"
START_TIMEOUT_S="${QUARRY_MILVUS_START_TIMEOUT_S:-180}"
STOP_TIMEOUT_S="${QUARRY_MILVUS_STOP_TIMEOUT_S:-20}"
KEEP_DATA="${QUARRY_MILVUS_KEEP_DATA:-0}"

launcher() {
    if [[ -n "${MILVUS_SERVER:-}" ]]; then echo "$MILVUS_SERVER"
    elif [[ -x "$REPO/.venv/bin/milvus-server" ]]; then echo "$REPO/.venv/bin/milvus-server"
    else command -v milvus-server || die "milvus-server not found: pip install 'quarry[milvus-server]'"
    fi
}

# The launcher silently moves to the next free port when it cannot bind one (a port still held
# by a stopping server, or in TIME_WAIT after health checks): wait until ours can be bound the
# way the launcher binds them (no SO_REUSEADDR), so the URL and the health check stay right.
ports_bindable() {
    "$(python_bin)" -c '
import socket
for port in (19530, 9091):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
' 2>/dev/null
}

wait_ports_free() {
    local waited=0
    until ports_bindable; do
        (( waited >= 120 )) && die "ports 19530/9091 still cannot be bound after 120s"
        (( waited % 15 == 0 )) && log "waiting for ports 19530/9091 to be released"
        sleep 1
        waited=$((waited + 1))
    done
}

healthy() {
    local body
    body="$(curl -fsS -m 2 "$HEALTH_URL" 2>/dev/null)" || return 1
    [[ "$body" == OK* ]]
}

wait_healthy() { wait_started "$1" "$PIDFILE" "$LOG" "$START_TIMEOUT_S" 1 healthy "milvus-server"; }

start() {
    local pid
    if pid="$(running_pid "$PIDFILE")"; then
        wait_healthy "$pid"
        log "already running (pid $pid): $URL"
        return 0
    fi
    if healthy; then
        die "a Milvus not started by this script already answers on $HEALTH_URL; stop it first"
    fi
    if [[ "$KEEP_DATA" != 1 && -d "$DATA" ]]; then
        log "wiping old data in $DATA (set QUARRY_MILVUS_KEEP_DATA=1 to keep it)"
        rm -rf "$DATA"
    fi
    mkdir -p "$DATA"
    wait_ports_free
    local bin
    bin="$(launcher)"
    log "starting $bin --data $DATA (log: $LOG)"
    # setsid: own session, so the server outlives this shell and stop can signal it alone.
    setsid "$bin" --data "$DATA" --proxy-port 19530 >>"$LOG" 2>&1 < /dev/null &
    pid=$!
    echo "$pid" > "$PIDFILE"
    wait_healthy "$pid"
    log "healthy (pid $pid): $URL"
}

stop() {
    local pid
    if ! pid="$(running_pid "$PIDFILE")"; then
        rm -f "$PIDFILE"
        log "not running"
        return 0
    fi
    # The milvus-server launcher answers SIGINT by SIGTERM + SIGKILL of its child after 1 s.
    # The child (`milvus run standalone`) gets SIGINT first and STOP_TIMEOUT_S to stop
    # gracefully (2.3.5 often hangs in its graceful stop); then the launcher gets SIGINT.
    local child deadline=$((SECONDS + STOP_TIMEOUT_S))
    for child in $(pgrep -P "$pid" || true); do
        log "stopping milvus (pid $child, SIGINT)"
        kill -INT "$child" 2>/dev/null || true
        wait_exit "$child" $((deadline - SECONDS)) || true
    done
    log "stopping launcher pid $pid (SIGINT)"
    kill -INT "$pid" 2>/dev/null || true
    if ! wait_exit "$pid" $((deadline - SECONDS)); then
        log "still running after ${STOP_TIMEOUT_S}s: SIGTERM to its process group"
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        sleep 5
        kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$PIDFILE"
    log "stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) healthy && running_pid "$PIDFILE" >/dev/null ;;
    url) echo "$URL" ;;
    *) echo "usage: $0 {start|stop|status|url}" >&2; exit 2 ;;
esac
