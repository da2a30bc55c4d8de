use futures::future::BoxFuture;
use lapin::{
    options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions},
    publisher_confirm::Confirmation,
    types::{AMQPValue, FieldTable, LongString, ShortString},
    BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind,
};
use tokio::sync::{Mutex, RwLock, Semaphore};

use super::RabbitMqConfig;
use crate::{
    error::Error, publisher::check_payload_size, publisher::PublishError, publisher::Publisher,
    wire::message::Message,
};

/// Publishes to a RabbitMQ exchange with publisher confirms. Reconnects lazily after a
/// connection loss; publishes in the meantime fail as transient.
///
/// Each publish has a channel to itself until its confirmation arrives. RabbitMQ sends an
/// unroutable message's `basic.return` before the ack, and lapin hands a return to the next
/// confirmation it resolves: with several publishes outstanding on one channel, the return of
/// one message could be attached to another's confirmation, marking an unroutable event
/// published (seen in a test). One outstanding publish per channel makes the attribution exact.
pub struct RabbitMqPublisher {
    config: RabbitMqConfig,
    channel: RwLock<Option<(Connection, Channel)>>,
    idle: Mutex<Vec<Channel>>,
    slots: Semaphore,
}

impl RabbitMqPublisher {
    /// Connects, enables confirms and declares the exchange. A broker that is down at start-up
    /// is not fatal: the relay starts and retries on each publish.
    pub async fn connect(config: RabbitMqConfig) -> Result<Self, Error> {
        config.validate().map_err(Error::Config)?;
        let publisher = Self {
            slots: Semaphore::new(config.channels),
            config,
            channel: RwLock::new(None),
            idle: Mutex::new(Vec::new()),
        };
        if let Err(e) = publisher.channel().await {
            tracing::warn!(error = %e, url = %publisher.config.redacted_url(),
                "rabbitmq not reachable yet; will retry on publish");
        }
        Ok(publisher)
    }

    async fn channel(&self) -> Result<Channel, PublishError> {
        if let Some((conn, ch)) = self.channel.read().await.as_ref() {
            if conn.status().connected() && ch.status().connected() {
                return Ok(ch.clone());
            }
        }
        let mut slot = self.channel.write().await;
        if let Some((conn, ch)) = slot.as_ref() {
            if conn.status().connected() && ch.status().connected() {
                return Ok(ch.clone());
            }
        }
        self.idle.lock().await.clear();
        let (conn, ch) = tokio::time::timeout(self.config.connect_timeout, self.open())
            .await
            .map_err(|_| {
                PublishError::transient(format!(
                    "rabbitmq: no connection to {} within {:?}",
                    self.config.redacted_url(),
                    self.config.connect_timeout
                ))
            })??;
        *slot = Some((conn, ch.clone()));
        Ok(ch)
    }

    async fn open(&self) -> Result<(Connection, Channel), PublishError> {
        let transient = |e: lapin::Error| PublishError::transient(format!("rabbitmq: {e}"));
        let conn = Connection::connect(
            &self.config.url,
            ConnectionProperties::default().with_connection_name("outbox-relay".into()),
        )
        .await
        .map_err(transient)?;
        let ch = conn.create_channel().await.map_err(transient)?;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(transient)?;
        if self.config.declare_exchange && !self.config.exchange.is_empty() {
            ch.exchange_declare(
                &self.config.exchange,
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(transient)?;
        }
        tracing::info!(url = %self.config.redacted_url(), exchange = %self.config.exchange,
            "connected to rabbitmq");
        Ok((conn, ch))
    }

    /// The message's AMQP properties. A writer's `CC` or `BCC` header (any case) is dropped:
    /// RabbitMQ reads those as extra routing keys (sender-selected distribution), and fails
    /// the channel when they are not an array.
    fn properties(message: &Message) -> BasicProperties {
        let mut headers = FieldTable::default();
        message.visit_headers(|name, value| {
            if name.eq_ignore_ascii_case("CC") || name.eq_ignore_ascii_case("BCC") {
                return;
            }
            headers.insert(
                ShortString::from(name.to_owned()),
                AMQPValue::LongString(LongString::from(value.to_owned())),
            );
        });
        BasicProperties::default()
            .with_message_id(ShortString::from(message.message_id.to_string()))
            .with_content_type(ShortString::from(message.content_type.clone()))
            .with_type(ShortString::from(message.event_type.clone()))
            .with_delivery_mode(2)
            .with_timestamp(message.occurred_at.timestamp().max(0) as u64)
            .with_app_id(ShortString::from("outbox"))
            .with_headers(headers)
    }
}

/// Classifies a confirmation: the one place RabbitMQ outcomes become retry decisions.
fn classify(
    confirmation: Confirmation,
    exchange: &str,
    key: &str,
    message_id: &str,
) -> Result<(), PublishError> {
    match confirmation {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned))
            if returned
                .properties
                .message_id()
                .as_ref()
                .is_some_and(|id| id.as_str() != message_id) =>
        {
            // Another message's return: never conclude anything from it; retry this one.
            Err(PublishError::transient(
                "rabbitmq: confirmation carried another message's return",
            ))
        }
        Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
            Err(PublishError::permanent(format!(
                "rabbitmq: unroutable: exchange {exchange:?} has no queue bound for routing key \
                 {key:?} ({} {})",
                returned.reply_code, returned.reply_text
            )))
        }
        Confirmation::Nack(None) => Err(PublishError::transient(
            "rabbitmq: broker nacked the message (could not persist it)",
        )),
        Confirmation::NotRequested => Err(PublishError::transient(
            "rabbitmq: channel is not in confirm mode",
        )),
    }
}

impl RabbitMqPublisher {
    /// A confirm-mode channel no other publish is using.
    async fn exclusive_channel(&self) -> Result<Channel, PublishError> {
        if let Some(ch) = self.idle.lock().await.pop() {
            if ch.status().connected() {
                return Ok(ch);
            }
        }
        // The shared channel also proves the connection is up (and reconnects it if not).
        self.channel().await?;
        let transient = |e: lapin::Error| PublishError::transient(format!("rabbitmq: {e}"));
        let conn = self.channel.read().await;
        let (conn, _) = conn
            .as_ref()
            .ok_or_else(|| PublishError::transient("rabbitmq: not connected"))?;
        let ch = conn.create_channel().await.map_err(transient)?;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(transient)?;
        Ok(ch)
    }
}

impl Publisher for RabbitMqPublisher {
    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            check_payload_size(message, self.config.max_payload_bytes)?;
            self.check_destination(&message.destination)?;
            let _slot = self
                .slots
                .acquire()
                .await
                .map_err(|_| PublishError::transient("rabbitmq: publisher closed"))?;
            let channel = self.exclusive_channel().await?;
            let transient = |e: lapin::Error| PublishError::transient(format!("rabbitmq: {e}"));
            let confirm = channel
                .basic_publish(
                    &self.config.exchange,
                    &message.destination,
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    &message.payload,
                    Self::properties(message),
                )
                .await
                .map_err(transient)?;
            let confirmation = confirm.await.map_err(transient)?;
            let outcome = classify(
                confirmation,
                &self.config.exchange,
                &message.destination,
                &message.message_id.to_string(),
            );
            self.idle.lock().await.push(channel);
            outcome
        })
    }

    fn name(&self) -> &'static str {
        "rabbitmq"
    }

    fn max_payload_bytes(&self) -> usize {
        self.config.max_payload_bytes
    }

    fn check_destination(&self, destination: &str) -> Result<(), PublishError> {
        check_routing_key(
            destination,
            &self.config.exchange,
            &self.config.routing_key_prefixes,
        )
    }
}

/// Refuses, as permanent, a routing key an event may not be published with. The exchange is
/// always the configured one (the key cannot name another); the key is at most 255 bytes
/// (AMQP's short string), and on the default exchange, where a key is a queue name, never an
/// `amq.` queue (server-named and reply-to queues of other clients).
fn check_routing_key(key: &str, exchange: &str, prefixes: &[String]) -> Result<(), PublishError> {
    if key.len() > 255 {
        return Err(PublishError::permanent(format!(
            "rabbitmq: routing key {:?}… is {} bytes, over AMQP's 255",
            key.chars().take(64).collect::<String>(),
            key.len()
        )));
    }
    if exchange.is_empty() && key.starts_with("amq.") {
        return Err(PublishError::permanent(format!(
            "rabbitmq: routing key {key:?} refused: on the default exchange it names a queue, \
             and amq. queues belong to the broker and its clients (reply-to, server-named)"
        )));
    }
    crate::wire::routing::check_prefixes("rabbitmq.routing_key_prefixes", key, prefixes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_keys_stay_within_their_rules() {
        check_routing_key("order.placed", "outbox", &[]).unwrap();
        check_routing_key("amq.gen-x", "outbox", &[]).unwrap();
        let long = "k".repeat(256);
        let error = check_routing_key(&long, "outbox", &[]).unwrap_err();
        assert!(
            !error.is_transient() && error.message.contains("256 bytes"),
            "{error}"
        );
        for reply_queue in ["amq.rabbitmq.reply-to", "amq.gen-JzTY20BRgKO"] {
            let error = check_routing_key(reply_queue, "", &[]).unwrap_err();
            assert!(!error.is_transient(), "{reply_queue}");
            assert!(
                error.message.contains(&format!("{reply_queue:?}")),
                "{error}"
            );
        }
        let prefixes = vec!["orders.".to_owned()];
        check_routing_key("orders.placed", "outbox", &prefixes).unwrap();
        let error = check_routing_key("billing.paid", "outbox", &prefixes).unwrap_err();
        assert!(
            error.message.contains("rabbitmq.routing_key_prefixes"),
            "{error}"
        );
    }

    /// A writer's `CC`/`BCC` never reach RabbitMQ, which would route on them.
    #[test]
    fn sender_selected_distribution_headers_are_dropped() {
        let mut m = crate::wire::message::sample(1, "a1");
        m.headers.insert("CC".into(), "other.key".into());
        m.headers.insert("bcc".into(), "other.key".into());
        let properties = RabbitMqPublisher::properties(&m);
        let headers = properties.headers().as_ref().unwrap().inner();
        assert!(headers
            .keys()
            .all(|k| !k.as_str().eq_ignore_ascii_case("cc")
                && !k.as_str().eq_ignore_ascii_case("bcc")));
        assert!(headers.contains_key("traceparent"));
    }
}
