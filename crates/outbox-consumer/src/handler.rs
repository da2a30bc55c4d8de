use futures::future::BoxFuture;
use sqlx::PgConnection;

use crate::Envelope;

/// Applies one event's effect.
///
/// # Contract
///
/// `handle` runs inside the consumer's transaction: do every database write through `tx`, and
/// nothing else that cannot be rolled back. It is called at most once per (consumer, event id)
/// that commits: the inbox row is inserted in the same transaction. Returning `Err` rolls the
/// transaction back; the message is redelivered with backoff, then dead-lettered after the
/// configured attempts.
pub trait Handler: Send + Sync + 'static {
    /// Applies `event` through `tx`.
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// A handler's failure, kept as text (it is stored with the dead letter).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HandlerError(pub String);

impl HandlerError {
    /// A failure with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl From<sqlx::Error> for HandlerError {
    fn from(e: sqlx::Error) -> Self {
        Self(format!("database: {e}"))
    }
}

impl From<serde_json::Error> for HandlerError {
    fn from(e: serde_json::Error) -> Self {
        Self(format!("payload: {e}"))
    }
}

impl From<outbox::Error> for HandlerError {
    fn from(e: outbox::Error) -> Self {
        Self(e.to_string())
    }
}
