//! One Kafka record as the runner core handles it ([`KafkaDelivery`]: acknowledging it marks
//! its offset done), and the dead-letter topic ([`KafkaDeadLetters`]).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use futures::future::BoxFuture;
use rdkafka::{
    message::{BorrowedMessage, Message as _},
    producer::FutureProducer,
    util::Timeout,
};

use super::{
    offsets::{Offsets, Ticket},
    record,
};
use crate::{runner::Delivery, DeadLetters, Message};

/// How long a dead letter may take to be stored before it is tried again.
const DEAD_LETTER_TIMEOUT: Duration = Duration::from_secs(30);

/// A record taken from the consumer: owned, with its place.
pub(crate) struct KafkaDelivery {
    pub(crate) ticket: Ticket,
    raw: Message,
    offsets: Arc<Mutex<Offsets>>,
}

impl KafkaDelivery {
    /// The record, owned; `None` when its partition is not assigned here any more.
    pub(crate) fn of(message: &BorrowedMessage<'_>, offsets: &Arc<Mutex<Offsets>>) -> Option<Self> {
        let ticket = super::lock(offsets).received(
            (message.topic().to_owned(), message.partition()),
            message.offset(),
        )?;
        let headers = record::raw_headers(message);
        let raw = Message {
            destination: message.topic().to_owned(),
            key: message.key().map(Bytes::copy_from_slice),
            headers: record::text_headers(&headers),
            payload: Bytes::copy_from_slice(message.payload().unwrap_or_default()),
        };
        Some(Self::new(ticket, raw, offsets))
    }

    /// A record received as `ticket`, with its text form.
    pub(crate) fn new(ticket: Ticket, raw: Message, offsets: &Arc<Mutex<Offsets>>) -> Self {
        Self {
            ticket,
            raw,
            offsets: offsets.clone(),
        }
    }
}

impl Delivery for KafkaDelivery {
    fn message(&self) -> &Message {
        &self.raw
    }

    /// Kafka says nothing of earlier deliveries: a record read again after a restart or a
    /// rebalance is tried as new (the inbox skips what was applied).
    fn redelivered(&self) -> bool {
        false
    }

    /// Done: its offset may be committed once every earlier one of its partition is done.
    async fn ack(self) {
        super::lock(&self.offsets).done(&self.ticket);
    }

    /// Not done: read again from the last committed offset by whoever owns its partition next.
    async fn release(self) {}

    async fn keep(&self) {}

    fn current(&self) -> bool {
        super::lock(&self.offsets).is_current(&self.ticket)
    }

    fn origin(&self) -> Vec<(&'static str, String)> {
        vec![
            ("dead-letter-topic", self.ticket.partition.0.clone()),
            ("dead-letter-partition", self.ticket.partition.1.to_string()),
            ("dead-letter-offset", self.ticket.offset.to_string()),
        ]
    }
}

/// The consumer's dead-letter topic.
pub(crate) struct KafkaDeadLetters {
    pub(crate) producer: FutureProducer,
    pub(crate) topic: String,
    pub(crate) consumer: String,
}

impl DeadLetters for KafkaDeadLetters {
    /// Produces the record to the dead-letter topic: same key, payload and headers, plus
    /// `dead-letter-*` headers saying why and where from. Waits for the delivery report.
    fn dead_letter<'a>(
        &'a self,
        message: &'a Message,
        reason: &'a str,
        attempts: u32,
        origin: &'a [(&'static str, String)],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let reason = reason.replace(['\r', '\n'], " ");
            let attempts = attempts.to_string();
            let mut extra: Vec<(&str, &str)> = vec![
                ("dead-letter-reason", reason.as_str()),
                ("dead-letter-attempts", attempts.as_str()),
                ("dead-letter-consumer", self.consumer.as_str()),
            ];
            if !origin.iter().any(|(name, _)| *name == "dead-letter-topic") {
                extra.push(("dead-letter-topic", message.destination.as_str()));
            }
            extra.extend(origin.iter().map(|(name, value)| (*name, value.as_str())));
            let raw: record::RawHeaders = message
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), Some(v.as_bytes().to_vec())))
                .collect();
            let headers = record::owned_headers(&raw, |_| true, &extra);
            let record = record::record(
                &self.topic,
                message.key.as_deref(),
                &message.payload,
                headers,
            );
            self.producer
                .send(record, Timeout::After(DEAD_LETTER_TIMEOUT))
                .await
                .map(drop)
                .map_err(|(e, _)| e.to_string())
        })
    }
}
