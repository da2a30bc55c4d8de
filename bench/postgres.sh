#!/usr/bin/env bash
# A private PostgreSQL for the cost breakdown (`outbox-bench drain|sqlonly|steady|cdc` with
# `--database-url` / `--cdc-database-url` pointing at it): the machine's own binaries, the
# settings of the machine's shared server (fsync and synchronous_commit on, autovacuum off,
# shared_buffers 128 MB), plus what a breakdown needs and a shared server cannot be restarted
# for: `pg_stat_statements` preloaded (statements, rows and buffers per statement) and
# `wal_level = logical` (so that polling and CDC drain on one server with the same settings).
#   bash bench/postgres.sh start [PORT]   # default 5434; prints its URL
#   bash bench/postgres.sh stop  [PORT]   # stops it by process id and removes its data
set -euo pipefail
cmd="${1:-start}"
port="${2:-5434}"
dir="/var/tmp/outbox-bench-pg-$port"
bin="$(dirname "$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb | tail -n1)")"
# PostgreSQL refuses to run as root: the cluster belongs to the postgres user.
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
case "$cmd" in
  start)
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "postgres.sh: port $port is taken (stop that server first)" >&2
      exit 1
    fi
    rm -rf "$dir" && mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust >"$dir/initdb.log" 2>&1
    cat >> "$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
max_connections = 200
shared_buffers = 128MB
fsync = on
synchronous_commit = on
autovacuum = off
wal_level = logical
max_replication_slots = 16
max_wal_senders = 16
max_wal_size = 4GB
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.max = 2000
pg_stat_statements.track = all
CONF
    as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null
    psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -qc 'CREATE DATABASE test' >/dev/null
    psql -h 127.0.0.1 -p "$port" -U postgres -d test -qc \
      'CREATE EXTENSION IF NOT EXISTS pg_stat_statements' >/dev/null
    echo "postgres://postgres@127.0.0.1:$port/test"
    ;;
  stop)
    if [ -f "$dir/data/postmaster.pid" ]; then
      pid="$(head -n1 "$dir/data/postmaster.pid")"
      kill -INT "$pid" 2>/dev/null || true
      for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -rf "$dir"
    ;;
  *) echo "usage: bash bench/postgres.sh start|stop [PORT]" >&2; exit 2 ;;
esac
