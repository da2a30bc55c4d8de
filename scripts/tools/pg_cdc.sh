#!/usr/bin/env bash
# A PostgreSQL for the CDC tests: the machine's shared server runs with wal_level=replica, and
# changing that means restarting a shared service, which the tests never do. This starts a
# private cluster with wal_level=logical on 127.0.0.1:${OUTBOX_CDC_PG_PORT:-5433} (data under
# /var/tmp/outbox-pg-cdc, trust auth on loopback), using the machine's own PostgreSQL binaries.
# Idempotent: reuses the cluster, starts it only if the port is closed.
set -euo pipefail

PORT="${OUTBOX_CDC_PG_PORT:-5433}"
DATA="${OUTBOX_CDC_PG_DATA:-/var/tmp/outbox-pg-cdc}"
LOG="$DATA.log"

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

drop_stale_slots() {
  # Slots left by killed test runs would retain WAL for ever: drop the inactive test slots.
  psql -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -Atqc \
    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
     WHERE NOT active AND slot_name LIKE 't\_%'" >/dev/null || true
}
if port_open "$PORT"; then
  drop_stale_slots
  exit 0
fi
bin="$(dirname "$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb | tail -n1)")"
# PostgreSQL refuses to run as root: the cluster belongs to the postgres user.
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if [ ! -s "$DATA/PG_VERSION" ]; then
  echo "pg_cdc: creating a wal_level=logical cluster in $DATA"
  mkdir -p "$DATA"
  [ "$(id -u)" = 0 ] && chown postgres "$DATA"
  as_pg "$bin/initdb" -D "$DATA" -U postgres --auth=trust >/dev/null
  cat >> "$DATA/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DATA'
wal_level = logical
max_replication_slots = 64
max_wal_senders = 64
max_slot_wal_keep_size = 4GB
fsync = off
autovacuum = on
CONF
fi
touch "$LOG"; [ "$(id -u)" = 0 ] && chown postgres "$LOG"
echo "pg_cdc: starting PostgreSQL (wal_level=logical) on port $PORT"
as_pg "$bin/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null
drop_stale_slots
