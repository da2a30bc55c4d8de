#!/usr/bin/env bash
# Enables RabbitMQ's AMQP 1.0 plugin (rabbitmq_amqp1_0) on the shared node, which then speaks
# AMQP 1.0 on its usual port 5672 beside 0-9-1. The AMQP 1.0 / Service Bus publisher's tests
# need it. Idempotent: does nothing when the plugin is already enabled. Enabling is done
# online; the node is never stopped or restarted.
set -euo pipefail

if ! command -v rabbitmq-plugins >/dev/null 2>&1; then
  echo "amqp1: rabbitmq-plugins not found (is RabbitMQ installed?)" >&2
  exit 1
fi

if rabbitmq-plugins list -e 2>/dev/null | grep -q 'rabbitmq_amqp1_0'; then
  echo "amqp1: rabbitmq_amqp1_0 already enabled"
  exit 0
fi

echo "amqp1: enabling rabbitmq_amqp1_0 on the running node"
rabbitmq-plugins enable rabbitmq_amqp1_0
rabbitmq-plugins list -e | grep -q 'rabbitmq_amqp1_0'
echo "amqp1: rabbitmq_amqp1_0 enabled"
