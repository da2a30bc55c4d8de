#!/usr/bin/env bash
# A private MariaDB for `outbox-bench mysql`, configured as a production server would be for
# this workload (the machine's shared MariaDB keeps its default 128 MB buffer pool, smaller
# than a 1,000,000-event outbox). Durable commits (innodb_flush_log_at_trx_commit = 1).
#   bash bench/mariadb.sh start [PORT] [BUFFER_POOL]   # default 3307, 2G; prints its URL
#   bash bench/mariadb.sh stop  [PORT]                 # kills it by process id, removes its data
set -euo pipefail
cmd="${1:-start}"
port="${2:-3307}"
pool="${3:-2G}"
dir="/var/tmp/outbox-bench-mariadb-$port"
case "$cmd" in
  start)
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "mariadb.sh: port $port is taken (stop that server first)" >&2
      exit 1
    fi
    rm -rf "$dir" && mkdir -p "$dir"
    mariadb-install-db --no-defaults --user=root --datadir="$dir/data" \
      --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1
    mariadbd --no-defaults --user=root --datadir="$dir/data" --port="$port" \
      --bind-address=127.0.0.1 --socket="$dir/mariadbd.sock" --pid-file="$dir/mariadbd.pid" \
      --innodb-buffer-pool-size="$pool" --innodb-log-file-size=1G \
      --innodb-flush-log-at-trx-commit=1 --skip-log-bin --max-connections=300 \
      >"$dir/server.log" 2>&1 &
    for _ in $(seq 1 60); do
      if mariadb -h 127.0.0.1 -P "$port" -u root -e 'CREATE DATABASE IF NOT EXISTS test' 2>/dev/null; then
        echo "mysql://root@127.0.0.1:$port/test"
        exit 0
      fi
      sleep 1
    done
    echo "mariadb.sh: the server did not come up; see $dir/server.log" >&2
    exit 1
    ;;
  stop)
    if [ -f "$dir/mariadbd.pid" ]; then kill -9 "$(cat "$dir/mariadbd.pid")" 2>/dev/null || true; fi
    rm -rf "$dir"
    ;;
  *) echo "usage: bash bench/mariadb.sh start|stop [PORT] [BUFFER_POOL]" >&2; exit 2 ;;
esac
