//! The broker side of the scenario: a stream (NATS) or an exchange with one queue per consumer
//! (RabbitMQ), named after the scenario's schema, and the consumer runners.

use std::sync::Arc;

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
    },
    Publisher,
};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{shop, BoxError};

const CONSUMERS: &[&str] = &["inventory", "notifications"];

pub(crate) enum Broker {
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

fn handler(name: &str, tables: &Tables) -> Arc<dyn Handler> {
    match name {
        "inventory" => Arc::new(shop::Inventory::new(tables)),
        _ => Arc::new(shop::Notifications::new(tables)),
    }
}

impl Broker {
    /// Creates the stream or the exchange and queues, so nothing published is unroutable.
    pub(crate) async fn set_up(
        url: &str,
        tables: &Tables,
        _pool: &PgPool,
    ) -> Result<Self, BoxError> {
        let name = tables.schema().as_str();
        if url.starts_with("nats://") {
            let js = jetstream::new(async_nats::connect(url).await?);
            let stream = name.to_uppercase();
            js.create_stream(stream::Config {
                name: stream.clone(),
                subjects: vec![format!("{name}.>")],
                ..Default::default()
            })
            .await?;
            Ok(Self::Nats {
                url: url.to_owned(),
                stream,
                js,
            })
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
            for consumer in CONSUMERS {
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
            Ok(Self::RabbitMq {
                url: url.to_owned(),
                exchange: name.to_owned(),
                channel,
                _connection: connection,
            })
        } else {
            Err(format!("broker URL must be nats:// or amqp://, got {url:?}").into())
        }
    }

    /// A publisher for a new relay.
    pub(crate) async fn publisher(&self) -> Result<Arc<dyn Publisher>, BoxError> {
        Ok(match self {
            Self::Nats { url, stream, .. } => Arc::new(
                NatsPublisher::connect(NatsConfig {
                    url: url.clone(),
                    stream: stream.clone(),
                    ..Default::default()
                })
                .await?,
            ),
            Self::RabbitMq { url, exchange, .. } => Arc::new(
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

    /// Starts one runner per consumer; they stop on `stop`.
    pub(crate) async fn start_consumers(
        &self,
        pool: &PgPool,
        tables: &Tables,
        stop: CancellationToken,
    ) -> Result<Vec<JoinHandle<()>>, BoxError> {
        let mut tasks = Vec::new();
        for name in CONSUMERS {
            let processor = Processor::new(pool.clone(), tables, *name, handler(name, tables));
            let config = ConsumerConfig::new(*name);
            let stop = stop.clone();
            let task = match self {
                Self::Nats { url, stream, .. } => {
                    let consumer =
                        NatsConsumer::connect(NatsSource::new(url, stream), config, processor)
                            .await?;
                    tokio::spawn(async move {
                        if let Err(e) = consumer.run(stop).await {
                            eprintln!("consumer stopped: {e}");
                        }
                    })
                }
                Self::RabbitMq { url, exchange, .. } => {
                    let queue = format!("{exchange}.{name}");
                    let consumer = RabbitMqConsumer::connect(
                        RabbitMqSource::new(url, queue),
                        config,
                        processor,
                    )
                    .await?;
                    tokio::spawn(async move {
                        if let Err(e) = consumer.run(stop).await {
                            eprintln!("consumer stopped: {e}");
                        }
                    })
                }
            };
            tasks.push(task);
        }
        Ok(tasks)
    }

    /// Deletes what [`Broker::set_up`] and the consumers created.
    pub(crate) async fn clean_up(self) {
        match self {
            Self::Nats { stream, js, .. } => {
                let _ = js.delete_stream(&stream).await;
                for consumer in CONSUMERS {
                    let _ = js.delete_stream(format!("{stream}_DEAD_{consumer}")).await;
                }
            }
            Self::RabbitMq {
                exchange, channel, ..
            } => {
                for consumer in CONSUMERS {
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
