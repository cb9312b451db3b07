#!/usr/bin/env bash
# A team MLflow tracking server: PostgreSQL backend store + proxied artifact storage.
#
#   scripts/mlflow_server.sh start DIR [PORT]   # idempotent; the last line printed is the tracking URI
#   scripts/mlflow_server.sh stop DIR
#   scripts/mlflow_server.sh status DIR
#
# DIR holds everything: pg/ (the database cluster, initdb'd on first start), run/ (its Unix socket
# and log), artifacts/ (what runs log; clients reach it through the server as mlflow-artifacts:
# URIs, never as local paths), mlflow.log. PostgreSQL listens on the Unix socket only.
# Environment: MLFLOW_HOST (bind address, default 127.0.0.1; 0.0.0.0 for a team),
# MLFLOW_ALLOWED_HOSTS (passed to --allowed-hosts), PYTHON (the interpreter with mlflow and
# psycopg2; default .venv/bin/python), PGBIN (default /usr/lib/postgresql/15/bin),
# MLFLOW_START_TIMEOUT (seconds, default 120), MLFLOW_PG_OPTS (extra postgres options; the
# tests pass "-c fsync=off" for a throwaway store). See docs/scale.md.
set -euo pipefail

die() { echo "mlflow_server.sh: $*" >&2; exit 2; }
usage() { die "usage: $0 start DIR [PORT] | stop DIR | status DIR"; }

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || usage
repo=$(cd "$(dirname "$0")/.." && pwd)
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  if [ -x "$repo/.venv/bin/python" ]; then PYTHON=$repo/.venv/bin/python; else PYTHON=python3; fi
fi
host=${MLFLOW_HOST:-127.0.0.1}

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
pgdata=$dir/pg
sock=$dir/run
pidf=$dir/mlflow.pid
portf=$dir/port

# PostgreSQL refuses to run as root: as root, run it as the Debian package's `postgres` user.
if [ "$(id -u)" = 0 ]; then
  id -u postgres >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin postgres
  as_pg() { runuser -u postgres -- "$@"; }
  pg_owner=postgres
else
  as_pg() { "$@"; }
  pg_owner=$(id -un)
fi

pg_running() { [ -f "$pgdata/PG_VERSION" ] && as_pg "$PGBIN/pg_ctl" status -D "$pgdata" >/dev/null 2>&1; }
mlflow_pid() { [ -f "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null && cat "$pidf"; }
url_host() { if [ "$host" = 0.0.0.0 ]; then hostname -f 2>/dev/null || hostname; else echo "$host"; fi; }

start_postgres() {
  [ -x "$PGBIN/initdb" ] || die "PostgreSQL 15 not found under $PGBIN (apt-get install postgresql)"
  if [ ! -f "$pgdata/PG_VERSION" ]; then
    mkdir -p "$pgdata" "$sock"
    chown "$pg_owner" "$pgdata" "$sock"
    chmod 700 "$pgdata"
    as_pg test -w "$pgdata" ||
      die "$dir is not reachable by user $pg_owner: use a directory whose parents it can enter (e.g. under /tmp or /srv)"
    # trust over the Unix socket only: nothing listens on TCP (listen_addresses='' below)
    as_pg "$PGBIN/initdb" -D "$pgdata" -U mlflow --auth=trust -E UTF8 >"$sock/initdb.log" 2>&1 ||
      die "initdb failed, see $sock/initdb.log"
  fi
  if ! pg_running; then
    as_pg "$PGBIN/pg_ctl" start -D "$pgdata" -w -t 60 -l "$sock/postgres.log" \
      -o "-c listen_addresses='' -k $sock -p 5432 ${MLFLOW_PG_OPTS:-}" >/dev/null ||
      die "PostgreSQL did not start, see $sock/postgres.log"
  fi
  if ! "$PGBIN/psql" -h "$sock" -U mlflow -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='mlflow'" | grep -q 1; then
    as_pg "$PGBIN/createdb" -h "$sock" -U mlflow mlflow
  fi
}

start_mlflow() {
  local port=$1
  if pid=$(mlflow_pid); then
    local running
    running=$(cat "$portf")
    [ "$running" = "$port" ] || echo "note: server already running on port $running (not $port)" >&2
    return 0
  fi
  mkdir -p "$dir/artifacts"
  local extra=()
  [ -n "${MLFLOW_ALLOWED_HOSTS:-}" ] && extra+=(--allowed-hosts "$MLFLOW_ALLOWED_HOSTS")
  # setsid: its own process group, so `stop` ends the server and its workers and nothing else.
  MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false MLFLOW_DISABLE_TELEMETRY="${MLFLOW_DISABLE_TELEMETRY:-true}" setsid "$PYTHON" -m mlflow server \
    --backend-store-uri "postgresql+psycopg2://mlflow@/mlflow?host=$sock" \
    --artifacts-destination "$dir/artifacts" --serve-artifacts \
    --host "$host" --port "$port" --workers 1 "${extra[@]}" \
    >>"$dir/mlflow.log" 2>&1 </dev/null &
  echo $! >"$pidf"
  echo "$port" >"$portf"
}

wait_ready() {
  local port=$1 deadline=$((SECONDS + ${MLFLOW_START_TIMEOUT:-120}))
  until curl -sf -o /dev/null "http://127.0.0.1:$port/health"; do
    if ! mlflow_pid >/dev/null; then
      tail -n 30 "$dir/mlflow.log" >&2
      die "mlflow server exited (port $port busy?), log: $dir/mlflow.log"
    fi
    [ $SECONDS -lt $deadline ] || die "mlflow server not ready after ${MLFLOW_START_TIMEOUT:-120}s, log: $dir/mlflow.log"
    sleep 0.5
  done
}

stop_all() {
  if pid=$(mlflow_pid); then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$pidf"
  if pg_running; then as_pg "$PGBIN/pg_ctl" stop -D "$pgdata" -m fast -w >/dev/null; fi
  echo "stopped ($dir)"
}

case $cmd in
  start)
    port=${3:-}
    [ -n "$port" ] || port=$( [ -f "$portf" ] && cat "$portf" || echo 5000)
    start_postgres
    start_mlflow "$port"
    port=$(cat "$portf")
    wait_ready "$port"
    echo "backend store: PostgreSQL (socket $sock), artifacts: $dir/artifacts (proxied), log: $dir/mlflow.log" >&2
    echo "http://$(url_host):$port"
    ;;
  stop) stop_all ;;
  status)
    if pg_running; then echo "postgres: running"; else echo "postgres: stopped"; fi
    if mlflow_pid >/dev/null; then echo "mlflow: running, http://$(url_host):$(cat "$portf")"; else echo "mlflow: stopped"; fi
    ;;
  *) usage ;;
esac
