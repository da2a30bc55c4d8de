//! RabbitMQ for `--broker rabbitmq`: the drain's exchange and a durable queue bound to it with
//! `#` (so every event is routable, as `mandatory` publishing requires), the queue's message
//! count afterwards, and their deletion.

use lapin::{
    options::{
        ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
        QueueDeleteOptions,
    },
    types::{AMQPValue, FieldTable},
    Channel, Connection, ConnectionProperties, ExchangeKind,
};

use crate::common::Result;

/// A management connection to the broker at `--rabbitmq-url`.
pub struct RabbitAdmin {
    _connection: Connection,
    channel: Channel,
    /// What the broker said about itself, for the report.
    pub description: String,
}

impl RabbitAdmin {
    /// Connects (so an unreachable broker fails here).
    pub async fn connect(url: &str) -> Result<Self> {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .map_err(|e| format!("cannot connect to RabbitMQ: {e}"))?;
        let channel = connection.create_channel().await?;
        Ok(Self {
            _connection: connection,
            channel,
            description: "RabbitMQ (AMQP 0-9-1, publisher confirms)".into(),
        })
    }

    /// The queue bound to `exchange` by [`RabbitAdmin::create`].
    pub fn queue(exchange: &str) -> String {
        format!("{exchange}.all")
    }

    /// Declares the durable topic exchange and its lazy durable queue bound with `#`.
    pub async fn create(&self, exchange: &str) -> Result<()> {
        self.delete(exchange).await;
        self.channel
            .exchange_declare(
                exchange,
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        let mut arguments = FieldTable::default();
        // A backlog of a million messages goes to disk instead of filling memory.
        arguments.insert("x-queue-mode".into(), AMQPValue::LongString("lazy".into()));
        let queue = Self::queue(exchange);
        self.channel
            .queue_declare(
                &queue,
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                arguments,
            )
            .await?;
        self.channel
            .queue_bind(
                &queue,
                exchange,
                "#",
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(())
    }

    /// Messages waiting in the exchange's queue.
    pub async fn messages(&self, exchange: &str) -> Result<u64> {
        let queue = self
            .channel
            .queue_declare(
                &Self::queue(exchange),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        Ok(u64::from(queue.message_count()))
    }

    /// Deletes `queue`; a failure is ignored (it may not exist).
    pub async fn delete_queue(&self, queue: &str) {
        let _ = self
            .channel
            .queue_delete(queue, QueueDeleteOptions::default())
            .await;
    }

    /// Deletes the queue and the exchange; failures are ignored (they may not exist).
    pub async fn delete(&self, exchange: &str) {
        let _ = self
            .channel
            .queue_delete(&Self::queue(exchange), QueueDeleteOptions::default())
            .await;
        let _ = self
            .channel
            .exchange_delete(exchange, ExchangeDeleteOptions::default())
            .await;
    }
}
