//! The broker side of the scenario: a stream (NATS) or an exchange with one queue per consumer
//! (RabbitMQ), named after the scenario's schema, and the consumer runners.

use std::{sync::Arc, time::Duration};

use async_nats::jetstream::{self, stream};
use lapin::{
    options::{
        ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
        QueueDeleteOptions,
    },
    types::FieldTable,
    Channel, Connection, ConnectionProperties, ExchangeKind,
};
use outbox::Tables;
use outbox_consumer::{
    nats::{NatsConsumer, NatsSource},
    rabbitmq::{RabbitMqConsumer, RabbitMqSource},
    ConsumerConfig, Handler, Processor,
};
use outbox_relay::{
    publishers::{
        nats::{NatsConfig, NatsPublisher},
        rabbitmq::{RabbitMqConfig, RabbitMqPublisher},
        redact_url,
    },
    Publisher,
};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{
    shop::{self, Statements},
    BoxError,
};

/// A stream (NATS) or a topic exchange with one queue per consumer (RabbitMQ), and the names
/// of the consumers it was set up for.
pub(crate) struct Broker {
    kind: Kind,
    consumers: Vec<String>,
}

enum Kind {
    Nats {
        url: String,
        stream: String,
        js: jetstream::Context,
    },
    RabbitMq {
        url: String,
        exchange: String,
        channel: Channel,
        _connection: Connection,
    },
}

fn handler(name: &str, sql: &Statements) -> Arc<dyn Handler> {
    match name {
        "inventory" => Arc::new(shop::Inventory::new(sql)),
        _ => Arc::new(shop::Notifications::new(sql)),
    }
}

impl Broker {
    /// Creates the stream, or the exchange and one queue per consumer, so nothing published is
    /// unroutable. Names derive from the schema of `tables`.
    pub(crate) async fn set_up(
        url: &str,
        tables: &Tables,
        consumers: &[&str],
    ) -> Result<Self, BoxError> {
        let name = tables.schema().as_str();
        let consumers: Vec<String> = consumers.iter().map(|c| (*c).to_owned()).collect();
        let kind = if url.starts_with("nats://") {
            let js = jetstream::new(async_nats::connect(url).await?);
            let stream = name.to_uppercase();
            js.create_stream(stream::Config {
                name: stream.clone(),
                subjects: vec![format!("{name}.>")],
                ..Default::default()
            })
            .await?;
            Kind::Nats {
                url: url.to_owned(),
                stream,
                js,
            }
        } else if url.starts_with("amqp://") || url.starts_with("amqps://") {
            let connection = Connection::connect(url, ConnectionProperties::default()).await?;
            let channel = connection.create_channel().await?;
            let durable = ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            };
            channel
                .exchange_declare(name, ExchangeKind::Topic, durable, FieldTable::default())
                .await?;
            for consumer in &consumers {
                let queue = format!("{name}.{consumer}");
                let options = QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                };
                channel
                    .queue_declare(&queue, options, FieldTable::default())
                    .await?;
                channel
                    .queue_bind(
                        &queue,
                        name,
                        "#",
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await?;
            }
            Kind::RabbitMq {
                url: url.to_owned(),
                exchange: name.to_owned(),
                channel,
                _connection: connection,
            }
        } else {
            return Err(format!("broker URL must be nats:// or amqp://, got {url:?}").into());
        };
        Ok(Self { kind, consumers })
    }

    /// The broker and what the run uses on it, in words.
    pub(crate) fn describe(&self) -> String {
        match &self.kind {
            Kind::Nats { url, stream, .. } => format!("NATS JetStream {url} (stream {stream})"),
            Kind::RabbitMq { url, exchange, .. } => {
                format!("RabbitMQ {} (exchange {exchange})", redact_url(url))
            }
        }
    }

    /// A publisher for a new relay.
    pub(crate) async fn publisher(&self) -> Result<Arc<dyn Publisher>, BoxError> {
        Ok(match &self.kind {
            Kind::Nats { url, stream, .. } => Arc::new(
                NatsPublisher::connect(NatsConfig {
                    url: url.clone(),
                    stream: stream.clone(),
                    ..Default::default()
                })
                .await?,
            ),
            Kind::RabbitMq { url, exchange, .. } => Arc::new(
                RabbitMqPublisher::connect(RabbitMqConfig {
                    url: url.clone(),
                    exchange: exchange.clone(),
                    declare_exchange: false,
                    ..Default::default()
                })
                .await?,
            ),
        })
    }

    /// Starts the plain flow's consumers; they stop on `stop`.
    pub(crate) async fn start_consumers(
        &self,
        pool: &PgPool,
        tables: &Tables,
        sql: &Statements,
        stop: CancellationToken,
    ) -> Result<Vec<JoinHandle<()>>, BoxError> {
        let mut tasks = Vec::new();
        for name in &self.consumers {
            let processor = Processor::new(pool.clone(), tables, name, handler(name, sql));
            let task = self
                .start_consumer(
                    processor,
                    ConsumerConfig::new(name),
                    Duration::from_secs(30),
                    stop.clone(),
                )
                .await?;
            tasks.push(task);
        }
        Ok(tasks)
    }

    /// Starts one consumer (named by `config`), which must be one this broker was set up for.
    /// Unacknowledged messages come back after `ack_wait` (NATS) or when the consumer's
    /// connection closes (RabbitMQ).
    pub(crate) async fn start_consumer(
        &self,
        processor: Processor,
        config: ConsumerConfig,
        ack_wait: Duration,
        stop: CancellationToken,
    ) -> Result<JoinHandle<()>, BoxError> {
        let name = config.name.clone();
        Ok(match &self.kind {
            Kind::Nats { url, stream, .. } => {
                let source = NatsSource {
                    ack_wait,
                    ..NatsSource::new(url, stream)
                };
                let consumer = NatsConsumer::connect(source, config, processor).await?;
                tokio::spawn(async move {
                    if let Err(e) = consumer.run(stop).await {
                        eprintln!("consumer {name} stopped: {e}");
                    }
                })
            }
            Kind::RabbitMq { url, exchange, .. } => {
                let queue = format!("{exchange}.{name}");
                let consumer =
                    RabbitMqConsumer::connect(RabbitMqSource::new(url, queue), config, processor)
                        .await?;
                tokio::spawn(async move {
                    if let Err(e) = consumer.run(stop).await {
                        eprintln!("consumer {name} stopped: {e}");
                    }
                })
            }
        })
    }

    /// Deletes what [`Broker::set_up`] and the consumers created.
    pub(crate) async fn clean_up(self) {
        match self.kind {
            Kind::Nats { stream, js, .. } => {
                let _ = js.delete_stream(&stream).await;
                for consumer in &self.consumers {
                    let _ = js.delete_stream(format!("{stream}_DEAD_{consumer}")).await;
                }
            }
            Kind::RabbitMq {
                exchange, channel, ..
            } => {
                for consumer in &self.consumers {
                    for queue in [
                        format!("{exchange}.{consumer}"),
                        format!("{exchange}.{consumer}.dead"),
                    ] {
                        let _ = channel
                            .queue_delete(&queue, QueueDeleteOptions::default())
                            .await;
                    }
                }
                let _ = channel
                    .exchange_delete(&exchange, ExchangeDeleteOptions::default())
                    .await;
            }
        }
    }
}
