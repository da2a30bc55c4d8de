//! A consumer's dead letters, read and replayed where the runners put them: the NATS stream
//! `{stream}_DEAD_{consumer}`, the RabbitMQ queue `{queue}.dead` or the Kafka topic
//! `{consumer}.dead`.
//!
//! Replay publishes each chosen dead letter back where it came from (its original subject or
//! topic, or the consumer's queue) with its original headers, waits for the broker's
//! confirmation, and only then removes it from the dead letters (Kafka: marks it replayed). A
//! crash in between replays it twice, which the inbox turns into one application; other
//! consumers of a NATS subject or Kafka topic see the replayed copy as a duplicate of an event
//! they already applied, and skip it the same way. Every replay is
//! recorded in the outbox's `audit` table ([`record_replay`]).

#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::PgPool;

/// Headers a runner adds to a dead letter; replay removes them.
pub(crate) const DEAD_LETTER_HEADERS: [&str; 8] = [
    "dead-letter-reason",
    "dead-letter-attempts",
    "dead-letter-subject",
    "dead-letter-routing-key",
    "dead-letter-topic",
    "dead-letter-partition",
    "dead-letter-offset",
    "dead-letter-consumer",
];

/// One dead letter of a consumer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// Its event id (`event-id` header, or the CloudEvents `ce-id`), when it has one.
    pub event_id: Option<String>,
    /// Its event type, when it has one.
    pub event_type: Option<String>,
    /// Where it was consumed from: the subject (NATS), routing key (RabbitMQ) or topic (Kafka).
    pub origin: String,
    /// Why it was dead-lettered.
    pub reason: String,
    /// Deliveries before it was dead-lettered.
    pub attempts: String,
    /// Its payload's size in bytes.
    pub size: usize,
}

impl DeadLetter {
    pub(crate) fn from_headers(
        headers: &BTreeMap<String, String>,
        origin: String,
        size: usize,
    ) -> Self {
        let get = |name: &str| headers.get(name).cloned();
        Self {
            event_id: get("event-id")
                .or_else(|| get("ce-id"))
                .or_else(|| get("ce_id")),
            event_type: get("event-type")
                .or_else(|| get("ce-type"))
                .or_else(|| get("ce_type")),
            origin,
            reason: get("dead-letter-reason").unwrap_or_default(),
            attempts: get("dead-letter-attempts").unwrap_or_default(),
            size,
        }
    }
}

/// Which dead letters to replay.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Only these event ids (empty: every one, up to `limit`).
    pub event_ids: Vec<String>,
    /// Only those whose reason contains this text (case-insensitive).
    pub reason_contains: Option<String>,
    /// At most this many.
    pub limit: usize,
}

impl Selection {
    pub(crate) fn matches(&self, letter: &DeadLetter) -> bool {
        let id_ok = self.event_ids.is_empty()
            || letter
                .event_id
                .as_ref()
                .is_some_and(|id| self.event_ids.contains(id));
        let reason_ok = self
            .reason_contains
            .as_ref()
            .is_none_or(|text| letter.reason.to_lowercase().contains(&text.to_lowercase()));
        id_ok && reason_ok
    }
}

/// What a replay did: the dead letters replayed, in order, and the failure that stopped it
/// (those replayed before it stay replayed; audit them all the same).
#[derive(Debug, Default)]
pub struct Replayed {
    /// Published back and removed from the dead letters.
    pub letters: Vec<DeadLetter>,
    /// Why the replay stopped early, if it did.
    pub failure: Option<Error>,
}

/// Errors reading or replaying dead letters.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The broker refused or could not be reached; the message names the operation.
    #[error("{context}")]
    Broker {
        /// The operation, on which broker and destination.
        context: String,
        /// The broker client's error, when one caused it.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The audit record could not be written.
    #[error("writing the audit record failed")]
    Audit(#[from] sqlx::Error),
}

impl Error {
    /// A broker failure while doing `context`, caused by `source` (kept as the error's source).
    pub(crate) fn broker(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Broker {
            context: context.into(),
            source: Some(source.into()),
        }
    }

    /// A broker failure that no other error caused (a header missing, a topic absent).
    pub(crate) fn broker_message(context: impl Into<String>) -> Self {
        Self::Broker {
            context: context.into(),
            source: None,
        }
    }
}

/// Records a consumer replay in the outbox's `audit` table (`tables`' schema): action
/// `consumer_replay`, the consumer and the event ids in `details`.
pub async fn record_replay(
    pool: &PgPool,
    tables: &outbox::Tables,
    consumer: &str,
    source: &str,
    replayed: &[DeadLetter],
    actor: &str,
    reason: &str,
) -> Result<(), Error> {
    let ids: Vec<&str> = replayed
        .iter()
        .filter_map(|l| l.event_id.as_deref())
        .collect();
    let details = serde_json::json!({
        "consumer": consumer,
        "source": source,
        "count": replayed.len(),
        "event_ids": ids,
    });
    sqlx::query(&tables.render(
        "INSERT INTO {schema}.audit (actor, action, event_ids, reason, details) \
         VALUES ($1, 'consumer_replay', '{}', $2, $3)",
    ))
    .bind(actor)
    .bind(reason)
    .bind(sqlx::types::Json(details))
    .execute(pool)
    .await?;
    Ok(())
}
