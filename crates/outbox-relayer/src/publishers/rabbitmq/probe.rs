//! `outbox doctor` on RabbitMQ: the connection (credentials, virtual host) and the exchange the
//! relay publishes to, looked up passively. No message is published, nothing is declared.

use lapin::{options::ExchangeDeclareOptions, types::FieldTable, Connection, ExchangeKind};

use super::RabbitMqConfig;
use crate::doctor::{Check, PROBE_TIMEOUT};

const AREA: &str = "broker";

/// Checks `config`'s server. `destinations` (routing keys) are listed in the binding check's
/// advice: AMQP 0-9-1 does not tell a client an exchange's bindings.
pub async fn probe(config: &RabbitMqConfig, destinations: &[String]) -> Vec<Check> {
    let mut checks = Vec::new();
    let connected = tokio::time::timeout(
        PROBE_TIMEOUT,
        Connection::connect(
            &config.url,
            lapin::ConnectionProperties::default().with_connection_name("outbox-doctor".into()),
        ),
    )
    .await;
    let conn = match connected {
        Ok(Ok(conn)) => conn,
        Ok(Err(error)) => {
            checks.push(Check::fail(
                AREA,
                "connection",
                format!("RabbitMQ refused the connection: {error}"),
                "check the user, password and virtual host in --broker-url \
                 (amqp://user:password@host:5672/vhost; the default vhost is %2f)",
            ));
            return checks;
        }
        Err(_) => {
            checks.push(Check::fail(
                AREA,
                "connection",
                format!("RabbitMQ did not complete the handshake within {PROBE_TIMEOUT:?}"),
                "check that the port speaks AMQP 0-9-1 (5672, or 5671 with amqps://)",
            ));
            return checks;
        }
    };
    checks.push(Check::ok(
        AREA,
        "connection",
        "RabbitMQ accepted the credentials",
    ));
    let exchange = &config.exchange;
    if exchange.is_empty() {
        // The default exchange routes to the queue named by the routing key: each destination
        // must be a queue. A failed passive declare closes its channel, so one channel each.
        for queue in destinations {
            let name = format!("queue {queue}");
            let found = match conn.create_channel().await {
                Ok(channel) => channel
                    .queue_declare(
                        queue,
                        lapin::options::QueueDeclareOptions {
                            passive: true,
                            ..Default::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                    .map(|_| ()),
                Err(error) => Err(error),
            };
            checks.push(match found {
                Ok(()) => Check::ok(AREA, name, "exists (default exchange)"),
                Err(error) => Check::fail(
                    AREA,
                    name,
                    format!(
                        "missing: with the default exchange each destination is a queue, and                          its events would be dead-lettered as unroutable ({error})"
                    ),
                    format!("rabbitmqadmin declare queue name={queue} durable=true"),
                ),
            });
        }
        let _ = conn.close(200, "doctor done").await;
        return checks;
    } else {
        let channel = match conn.create_channel().await {
            Ok(channel) => channel,
            Err(error) => {
                checks.push(Check::fail(
                    AREA,
                    "channel",
                    format!("cannot open a channel: {error}"),
                    "check the user's permissions on the virtual host",
                ));
                return checks;
            }
        };
        let passive = ExchangeDeclareOptions {
            passive: true,
            durable: true,
            ..Default::default()
        };
        let name = format!("exchange {exchange}");
        match channel
            .exchange_declare(
                exchange,
                ExchangeKind::Topic,
                passive,
                FieldTable::default(),
            )
            .await
        {
            Ok(()) => checks.push(Check::ok(AREA, name, "exists")),
            Err(_) if config.declare_exchange => checks.push(Check::ok(
                AREA,
                name,
                "missing; the relay declares it (a durable topic exchange) when it connects",
            )),
            Err(error) => checks.push(Check::fail(
                AREA,
                name,
                format!("missing, and rabbitmq.declare_exchange = false: {error}"),
                format!(
                    "rabbitmqadmin declare exchange name={exchange} type=topic durable=true \
                     (or set rabbitmq.declare_exchange = true)"
                ),
            )),
        }
    }
    let keys = if destinations.is_empty() {
        "the routing keys of your events".to_owned()
    } else {
        destinations.join(", ")
    };
    checks.push(Check::warn(
        AREA,
        "bindings",
        "not checked: AMQP does not tell a client an exchange's bindings, and the relay \
         publishes as mandatory, so an event no binding routes is dead-lettered as unroutable",
        format!(
            "rabbitmqctl list_bindings source_name routing_key: make sure a queue is bound for \
             {keys}"
        ),
    ));
    let _ = conn.close(200, "doctor done").await;
    checks
}
