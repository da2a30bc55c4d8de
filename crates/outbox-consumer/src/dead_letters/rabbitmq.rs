//! The dead letters of a RabbitMQ consumer: queue `{queue}.dead`, each message with the
//! original routing key in `dead-letter-routing-key`. Replay sends to the consumer's own queue
//! (the default exchange, routing key = queue), so only that consumer sees it again.

use lapin::{
    message::Delivery,
    options::{
        BasicAckOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions,
        ConfirmSelectOptions, QueueDeclareOptions,
    },
    types::FieldTable,
    Channel, Connection, ConnectionProperties,
};

use super::{DeadLetter, Error, Replayed, Selection, DEAD_LETTER_HEADERS};
use crate::rabbitmq::headers_of;

/// The dead letters of the consumer of one queue.
pub struct RabbitMqDeadLetters {
    _connection: Connection,
    channel: Channel,
    queue: String,
    dead: String,
}

impl RabbitMqDeadLetters {
    /// Opens the dead letters of the consumer of `queue` (the queue `{queue}.dead`).
    pub async fn open(url: &str, queue: &str) -> Result<Self, Error> {
        let broker = |what: &str, e: lapin::Error| Error::broker(format!("rabbitmq: {what}"), e);
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .map_err(|e| broker("cannot connect", e))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| broker("channel", e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| broker("confirms", e))?;
        let dead = format!("{queue}.dead");
        channel
            .queue_declare(
                &dead,
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                broker(
                    &format!("no dead-letter queue {dead} (has the consumer of {queue} run?)"),
                    e,
                )
            })?;
        Ok(Self {
            _connection: connection,
            channel,
            queue: queue.to_owned(),
            dead,
        })
    }

    /// Where the dead letters are, for messages and the audit record.
    pub fn source(&self) -> String {
        format!("rabbitmq queue {}", self.dead)
    }

    /// Takes every dead letter off the queue (unacked, so held), oldest first, and says
    /// which match `selection`.
    async fn take(
        &self,
        selection: &Selection,
    ) -> Result<Vec<(Delivery, DeadLetter, bool)>, Error> {
        let mut out = Vec::new();
        let mut matched = 0;
        while matched < selection.limit {
            let got = self
                .channel
                .basic_get(&self.dead, BasicGetOptions { no_ack: false })
                .await
                .map_err(|e| Error::broker(format!("rabbitmq: reading {}", self.dead), e))?;
            let Some(message) = got else { break };
            let delivery = message.delivery;
            let headers = headers_of(&delivery);
            let origin = headers
                .get("dead-letter-routing-key")
                .cloned()
                .unwrap_or_default();
            let letter = DeadLetter::from_headers(&headers, origin, delivery.data.len());
            let chosen = selection.matches(&letter);
            matched += usize::from(chosen);
            out.push((delivery, letter, chosen));
        }
        Ok(out)
    }

    /// The dead letters matching `selection`, oldest first. They stay on the queue.
    pub async fn list(&self, selection: &Selection) -> Result<Vec<DeadLetter>, Error> {
        let taken = self.take(selection).await?;
        let mut out = Vec::new();
        for (delivery, letter, chosen) in taken {
            put_back(&delivery).await;
            if chosen {
                out.push(letter);
            }
        }
        Ok(out)
    }

    /// Publishes each dead letter matching `selection` to the consumer's queue (confirmed),
    /// then acks it off the dead letters. Stops at the first failure (the rest stays dead).
    pub async fn replay(&self, selection: &Selection) -> Result<Replayed, Error> {
        let mut replayed = Replayed::default();
        for (delivery, letter, chosen) in self.take(selection).await? {
            if !chosen || replayed.failure.is_some() {
                put_back(&delivery).await;
                continue;
            }
            match self.republish(&delivery).await {
                Ok(()) => {
                    let _ = delivery.ack(BasicAckOptions::default()).await;
                    replayed.letters.push(letter);
                }
                Err(e) => {
                    put_back(&delivery).await;
                    replayed.failure = Some(e);
                }
            }
        }
        Ok(replayed)
    }

    async fn republish(&self, delivery: &Delivery) -> Result<(), Error> {
        let mut table = FieldTable::default();
        for (name, value) in delivery.properties.headers().iter().flat_map(|t| t.inner()) {
            if !DEAD_LETTER_HEADERS.contains(&name.as_str()) {
                table.insert(name.clone(), value.clone());
            }
        }
        let properties = delivery.properties.clone().with_headers(table);
        let failed = |e: &dyn std::fmt::Display| {
            Error::broker(
                format!("rabbitmq: replaying to queue {}", self.queue),
                e.to_string(),
            )
        };
        let confirm = self
            .channel
            .basic_publish(
                "",
                &self.queue,
                BasicPublishOptions::default(),
                &delivery.data,
                properties,
            )
            .await
            .map_err(|e| failed(&e))?
            .await
            .map_err(|e| failed(&e))?;
        if confirm.is_ack() {
            Ok(())
        } else {
            Err(failed(&"the broker did not confirm"))
        }
    }
}

/// Returns a held dead letter to its queue.
async fn put_back(delivery: &Delivery) {
    let _ = delivery
        .nack(BasicNackOptions {
            requeue: true,
            ..Default::default()
        })
        .await;
}
