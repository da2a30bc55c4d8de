//! One Kafka message: decoded, applied through the processor with retries in place, or
//! produced to the dead-letter topic.

use std::{sync::Mutex, time::Duration};

use bytes::Bytes;
use rdkafka::{
    message::{BorrowedMessage, Message as _},
    producer::FutureProducer,
    util::Timeout,
};
use tokio_util::sync::CancellationToken;

use super::{
    offsets::{Offsets, Ticket},
    record::{self, RawHeaders},
};
use crate::{lanes::Lane, outage, ConsumerConfig, Count, Envelope, Processor};

/// How long a dead letter may take to be stored before it is tried again.
const DEAD_LETTER_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest wait between tries while the database is down.
const OUTAGE_WAIT: Duration = Duration::from_secs(5);

/// A message taken from the consumer: owned, with its place and its aggregate's lane.
pub(crate) struct Received {
    pub(crate) ticket: Ticket,
    pub(crate) lane: Lane,
    key: Option<Vec<u8>>,
    headers: RawHeaders,
    payload: Bytes,
}

impl Received {
    /// The message, owned; `None` when its partition is not assigned here any more.
    /// `alone` numbers the messages that have no aggregate and no key.
    pub(crate) fn of(
        message: &BorrowedMessage<'_>,
        offsets: &Mutex<Offsets>,
        alone: &mut u64,
    ) -> Option<Self> {
        let ticket = super::lock(offsets).received(
            (message.topic().to_owned(), message.partition()),
            message.offset(),
        )?;
        let headers = record::raw_headers(message);
        let text = |name: &str| record::text(&headers, name);
        let key = message.key().map(<[u8]>::to_vec);
        let lane = match (text("aggregate-type"), text("aggregate-id"), &key) {
            (Some(kind), Some(id), _) => Lane::Aggregate(kind, id),
            // Producers other than the relay: the record key is Kafka's ordering key.
            (_, _, Some(key)) => Lane::Aggregate(
                format!("{}:key", message.topic()),
                String::from_utf8_lossy(key).into_owned(),
            ),
            _ => {
                *alone += 1;
                Lane::Alone(*alone)
            }
        };
        Some(Self {
            ticket,
            lane,
            key,
            headers,
            payload: Bytes::copy_from_slice(message.payload().unwrap_or_default()),
        })
    }

    /// A message with no content, for tests of the runner's bookkeeping.
    #[cfg(test)]
    pub(crate) fn bare(ticket: Ticket, lane: Lane) -> Self {
        Self {
            ticket,
            lane,
            key: None,
            headers: Vec::new(),
            payload: Bytes::new(),
        }
    }
}

/// What handles one message: shared by the messages in flight.
pub(crate) struct Worker {
    pub(crate) producer: FutureProducer,
    pub(crate) dead_topic: String,
    pub(crate) config: ConsumerConfig,
    pub(crate) processor: Processor,
}

impl Worker {
    /// Applies the message, retrying in place, or dead-letters it. Returns its ticket when it
    /// is done (its offset may be committed); `None` when it was abandoned unfinished, at
    /// shutdown or because its partition was revoked (it is read again from there).
    pub(crate) async fn handle(
        &self,
        message: Received,
        shutdown: &CancellationToken,
        offsets: &Mutex<Offsets>,
    ) -> Option<Ticket> {
        let ours = || super::lock(offsets).is_current(&message.ticket);
        let decoded = Envelope::decode(
            message.ticket.partition.0.clone(),
            record::text_headers(&message.headers),
            message.payload.clone(),
        )
        .map_err(|e| e.to_string())
        // An event that cannot reach its current version never will: dead-letter it at once.
        .and_then(|e| self.processor.upcast(e).map_err(|e| e.to_string()));
        let mut attempts = 1u32;
        let reason = match decoded {
            Err(reason) => reason,
            Ok(event) => loop {
                let result = outage::apply(
                    "kafka",
                    &self.processor,
                    &event,
                    shutdown,
                    OUTAGE_WAIT,
                    || async {},
                )
                .await;
                let error = match result {
                    Ok(outcome) => {
                        tracing::debug!(?outcome, topic = %message.ticket.partition.0,
                            offset = message.ticket.offset, "processed");
                        return Some(message.ticket);
                    }
                    Err(error) => error,
                };
                // The message's own failures spend attempts; an outage does not. Nor would a
                // wait for an earlier version elsewhere, but Kafka redelivers nothing in front
                // of this message: its missing predecessor (dead-lettered, or never published)
                // can only come later in the partition, behind it. So a gap spends attempts
                // too and ends as a dead letter, out of the way of the predecessor's replay.
                if error.counts_as_attempt() || error.is_out_of_order() {
                    if attempts >= self.config.max_attempts {
                        break error.to_string();
                    }
                    attempts += 1;
                }
                let delay = self.config.backoff(attempts - 1);
                tracing::warn!(%error, attempts, ?delay, topic = %message.ticket.partition.0,
                    offset = message.ticket.offset, "handler failed; retrying in place");
                if !self.pause(delay, shutdown, &ours).await {
                    return None;
                }
            },
        };
        tracing::error!(error = %reason, attempts, topic = %message.ticket.partition.0,
            offset = message.ticket.offset, consumer = self.processor.name(),
            "dead-lettering message");
        let mut tries = 0;
        loop {
            match self.dead_letter(&message, &reason, attempts).await {
                Ok(()) => {
                    self.processor.count(Count::DeadLettered);
                    return Some(message.ticket);
                }
                Err(e) => {
                    tries += 1;
                    tracing::warn!(error = %e, tries, topic = %self.dead_topic,
                        "dead-letter produce failed; will retry");
                }
            }
            if !self
                .pause(self.config.backoff(tries), shutdown, &ours)
                .await
            {
                return None;
            }
        }
    }

    /// Waits `delay`; false when the message must be abandoned instead (shutdown, or its
    /// partition is no longer ours).
    async fn pause(
        &self,
        delay: Duration,
        shutdown: &CancellationToken,
        ours: &impl Fn() -> bool,
    ) -> bool {
        tokio::select! {
            () = shutdown.cancelled() => return false,
            () = tokio::time::sleep(delay) => {}
        }
        ours()
    }

    /// Produces the message to the dead-letter topic: same key, payload and headers, plus
    /// `dead-letter-*` headers saying why and where from. Waits for the delivery report.
    async fn dead_letter(
        &self,
        message: &Received,
        reason: &str,
        attempts: u32,
    ) -> Result<(), String> {
        let (topic, partition) = &message.ticket.partition;
        let reason = reason.replace(['\r', '\n'], " ");
        let (attempts, partition, offset) = (
            attempts.to_string(),
            partition.to_string(),
            message.ticket.offset.to_string(),
        );
        let extra = [
            ("dead-letter-reason", reason.as_str()),
            ("dead-letter-attempts", attempts.as_str()),
            ("dead-letter-topic", topic.as_str()),
            ("dead-letter-partition", partition.as_str()),
            ("dead-letter-offset", offset.as_str()),
            ("dead-letter-consumer", self.processor.name()),
        ];
        let headers = record::owned_headers(&message.headers, |_| true, &extra);
        let record = record::record(
            &self.dead_topic,
            message.key.as_deref(),
            &message.payload,
            headers,
        );
        self.producer
            .send(record, Timeout::After(DEAD_LETTER_TIMEOUT))
            .await
            .map(|_| ())
            .map_err(|(e, _)| e.to_string())
    }
}
