#!/usr/bin/env bash
# Makes sure the services the tests talk to are up on loopback, starting any that is down.
# Never stops or restarts a running service: tests that need to kill a broker start their own.
set -euo pipefail

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() { # name port seconds
  for _ in $(seq 1 "$3"); do port_open "$2" && return 0; sleep 1; done
  echo "services: $1 did not come up on port $2" >&2
  return 1
}

if ! port_open 5432; then
  echo "services: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  wait_port PostgreSQL 5432 60
fi

if ! port_open 3306; then
  echo "services: starting MariaDB"
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  wait_port MariaDB 3306 60
fi

if ! port_open 4222; then
  echo "services: starting NATS (JetStream)"
  mkdir -p /var/lib/nats-server
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  wait_port NATS 4222 30
fi

if ! port_open 5672; then
  echo "services: starting RabbitMQ"
  rabbitmq-server -detached
  wait_port RabbitMQ 5672 120
fi

if ! port_open 6379; then
  echo "services: starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_port Redis 6379 30
fi

if ! port_open 1883; then
  echo "services: starting Mosquitto"
  mosquitto -d -c /etc/mosquitto/mosquitto.conf
  wait_port Mosquitto 1883 30
fi

# Brokers and tools the publisher conformance suite needs beyond the machine's services:
# RabbitMQ's AMQP 1.0 plugin (enabled online), tansu (a Kafka-protocol broker, built once into
# /opt/outbox-tools and reused), and moto (an SQS emulator, in a virtualenv there).
here="$(dirname "$0")"
bash "$here/tools/amqp1.sh"
bash "$here/tools/kafka.sh"
bash "$here/tools/sqs.sh"
bash "$here/tools/pg_cdc.sh"

# The test databases must exist (the machine creates them; a fresh cluster may not have them).
if ! psql -h 127.0.0.1 -U postgres -d test -Atc 'select 1' >/dev/null 2>&1; then
  createdb -h 127.0.0.1 -U postgres test
fi
mariadb -h 127.0.0.1 -u root -e 'CREATE DATABASE IF NOT EXISTS test'
# The dashboard's browser test drives Debian's headless Chromium through chromedriver.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  echo "services: installing chromium and chromium-driver (dashboard browser test)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium chromium-driver >/dev/null
fi
# `outbox migrate --print` is tested by applying its scripts with each database's own client
# (psql and mariadb come with the servers; sqlite3 on its own).
if ! command -v sqlite3 >/dev/null 2>&1; then
  echo "services: installing sqlite3 (migrate --print test)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq sqlite3 >/dev/null
fi
echo "services: PostgreSQL, MariaDB, NATS, RabbitMQ (AMQP 0-9-1 and 1.0), Redis, Mosquitto, tansu (Kafka), moto (SQS) and a wal_level=logical PostgreSQL on 5433 (CDC) are up; chromium and chromedriver installed"
