//! The broker side of the scenario: a stream (NATS), an exchange with one queue per consumer
//! (RabbitMQ) or a topic per event type read by one consumer group per consumer (Kafka), named
//! after the scenario's schema, and the consumer runners.

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
use outbox_relayer::{
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
    #[cfg(feature = "kafka")]
    Kafka {
        brokers: String,
        prefix: String,
        topics: Vec<String>,
    },
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
    Arc::new(shop::handlers(name, sql))
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
        #[cfg(feature = "kafka")]
        if let Some(brokers) = url.strip_prefix("kafka://") {
            let topics = kafka::create_topics(brokers, name).await?;
            return Ok(Self {
                kind: Kind::Kafka {
                    brokers: brokers.to_owned(),
                    prefix: name.to_owned(),
                    topics,
                },
                consumers,
            });
        }
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
            return Err(
                format!("broker URL must be nats://, amqp:// or kafka://, got {url:?}").into(),
            );
        };
        Ok(Self { kind, consumers })
    }

    /// The broker and what the run uses on it, in words.
    pub(crate) fn describe(&self) -> String {
        match &self.kind {
            #[cfg(feature = "kafka")]
            Kind::Kafka {
                brokers, topics, ..
            } => format!("Kafka {brokers} ({} topics)", topics.len()),
            Kind::Nats { url, stream, .. } => format!("NATS JetStream {url} (stream {stream})"),
            Kind::RabbitMq { url, exchange, .. } => {
                format!("RabbitMQ {} (exchange {exchange})", redact_url(url))
            }
        }
    }

    /// A publisher for a new relay.
    pub(crate) async fn publisher(&self) -> Result<Arc<dyn Publisher>, BoxError> {
        Ok(match &self.kind {
            #[cfg(feature = "kafka")]
            Kind::Kafka { brokers, .. } => Arc::new(
                outbox_relayer::publishers::kafka::KafkaPublisher::connect(
                    outbox_relayer::publishers::kafka::KafkaConfig {
                        brokers: brokers.clone(),
                        // One record per batch. tansu 0.6 (the Kafka-protocol broker of the
                        // tests) answers a fetch from inside a record batch with the next
                        // batch, so a consumer restarting from a committed offset inside one
                        // would never see the rest of it. Kafka returns the batch itself.
                        properties: [("batch.num.messages".to_owned(), "1".to_owned())].into(),
                        ..Default::default()
                    },
                )
                .await?,
            ),
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
            #[cfg(feature = "kafka")]
            Kind::Kafka {
                brokers,
                prefix,
                topics,
            } => {
                let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
                let source = outbox_consumer::kafka::KafkaSource {
                    // One group and one dead-letter topic per run and consumer: runs in
                    // parallel share the broker.
                    group_id: Some(format!("{prefix}.{name}")),
                    dead_letter_topic: Some(format!("{prefix}.{name}.dead")),
                    commit_interval: Duration::from_millis(200),
                    ..outbox_consumer::kafka::KafkaSource::new(brokers, &topics)
                };
                let consumer =
                    outbox_consumer::kafka::KafkaConsumer::connect(source, config, processor)
                        .await?;
                tokio::spawn(async move {
                    if let Err(e) = consumer.run(stop).await {
                        eprintln!("consumer {name} stopped: {}", outbox::error_chain(&e));
                    }
                })
            }
            Kind::Nats { url, stream, .. } => {
                let source = NatsSource {
                    ack_wait,
                    ..NatsSource::new(url, stream)
                };
                let consumer = NatsConsumer::connect(source, config, processor).await?;
                tokio::spawn(async move {
                    if let Err(e) = consumer.run(stop).await {
                        eprintln!("consumer {name} stopped: {}", outbox::error_chain(&e));
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
                        eprintln!("consumer {name} stopped: {}", outbox::error_chain(&e));
                    }
                })
            }
        })
    }

    /// Deletes what [`Broker::set_up`] and the consumers created.
    pub(crate) async fn clean_up(self) {
        match self.kind {
            #[cfg(feature = "kafka")]
            Kind::Kafka {
                brokers,
                prefix,
                mut topics,
            } => {
                topics.extend(self.consumers.iter().map(|c| format!("{prefix}.{c}.dead")));
                kafka::delete_topics(&brokers, &topics).await;
            }
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

/// The run's Kafka topics.
#[cfg(feature = "kafka")]
mod kafka {
    use rdkafka::{
        admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
        client::DefaultClientContext,
        ClientConfig,
    };

    use crate::BoxError;

    /// Every event type the scenarios write (the relay never creates a topic: a missing one is
    /// a permanent failure).
    const EVENT_TYPES: [&str; 14] = [
        "OrderCreated",
        "ReserveInventory",
        "InventoryReserved",
        "InventoryRejected",
        "ReleaseInventory",
        "ProcessPayment",
        "PaymentRequested",
        "PaymentSucceeded",
        "PaymentFailed",
        "ShipOrder",
        "OrderShipped",
        "CompleteOrder",
        "CancelOrder",
        "OrderCancelled",
    ];

    fn admin(brokers: &str) -> Result<AdminClient<DefaultClientContext>, BoxError> {
        Ok(ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()?)
    }

    /// Creates `{prefix}.order.{event type}` for each event type, two partitions each (the
    /// relay's routing: `{schema}.{aggregate_type}.{event_type}`); returns their names.
    pub(super) async fn create_topics(
        brokers: &str,
        prefix: &str,
    ) -> Result<Vec<String>, BoxError> {
        let topics: Vec<String> = EVENT_TYPES
            .iter()
            .map(|t| format!("{prefix}.order.{t}"))
            .collect();
        let new: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|t| NewTopic::new(t, 2, TopicReplication::Fixed(1)))
            .collect();
        for result in admin(brokers)?
            .create_topics(&new, &AdminOptions::new())
            .await?
        {
            result.map_err(|(topic, code)| format!("create topic {topic}: {code}"))?;
        }
        Ok(topics)
    }

    pub(super) async fn delete_topics(brokers: &str, topics: &[String]) {
        if let Ok(admin) = admin(brokers) {
            let names: Vec<&str> = topics.iter().map(String::as_str).collect();
            let _ = admin.delete_topics(&names, &AdminOptions::new()).await;
        }
    }
}
