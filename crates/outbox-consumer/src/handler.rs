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
/// configured attempts. A panic counts as an `Err` of that message. An error of the
/// infrastructure ([`HandlerError::is_infrastructure`]: the database unreachable) spends no
/// attempt: the runner holds the message and retries it until the database answers.
pub trait Handler: Send + Sync + 'static {
    /// Applies `event` through `tx`.
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// A handler's failure, kept as text (it is stored with the dead letter), and whether it is the
/// message's fault or the infrastructure's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HandlerError {
    message: String,
    kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Message,
    Infrastructure,
    OutOfOrder,
}

impl HandlerError {
    /// A failure of this message (retried with backoff, then dead-lettered).
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            kind: Kind::Message,
        }
    }

    /// A failure of the infrastructure the handler depends on (a database or service that
    /// cannot be reached): the runner waits it out without spending the message's attempts.
    /// Database errors converted with `?` are classified on their own.
    pub fn infrastructure(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            kind: Kind::Infrastructure,
        }
    }

    /// The event came before an earlier version of its aggregate (the version gate): it is
    /// retried later, without spending its attempts, and never dead-lettered.
    pub(crate) fn out_of_order(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            kind: Kind::OutOfOrder,
        }
    }

    /// The message, as stored with a dead letter.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the failure is the infrastructure's (waited out) rather than the message's.
    pub fn is_infrastructure(&self) -> bool {
        self.kind == Kind::Infrastructure
    }

    /// Whether the event waits for an earlier version of its aggregate (see
    /// [`VersionGate`](crate::VersionGate)): retried later, never dead-lettered.
    pub fn is_out_of_order(&self) -> bool {
        self.kind == Kind::OutOfOrder
    }

    /// Whether the failure may end in a dead letter: neither an outage nor a wait for an
    /// earlier version does.
    pub fn counts_as_attempt(&self) -> bool {
        self.kind == Kind::Message
    }
}

impl From<sqlx::Error> for HandlerError {
    fn from(e: sqlx::Error) -> Self {
        let message = format!("database: {e}");
        if is_outage(&e) {
            Self::infrastructure(message)
        } else {
            Self::new(message)
        }
    }
}

impl From<serde_json::Error> for HandlerError {
    fn from(e: serde_json::Error) -> Self {
        Self::new(format!("payload: {e}"))
    }
}

impl From<outbox::Error> for HandlerError {
    fn from(e: outbox::Error) -> Self {
        match e {
            outbox::Error::Database(e) => e.into(),
            other => Self::new(other.to_string()),
        }
    }
}

/// Whether a database error says the database cannot be used right now (connection lost or
/// refused, pool exhausted, server shutting down or starting), as opposed to a statement that
/// fails on this message's data.
pub(crate) fn is_outage(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // Class 08: connection exception; 57P01-57P03: admin shutdown, crash shutdown,
            // cannot connect now; 53300: too many connections.
            code.starts_with("08") || code.starts_with("57P") || code == "53300"
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_outages_are_the_infrastructures_and_data_errors_the_messages() {
        let refused = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(HandlerError::from(refused).is_infrastructure());
        assert!(HandlerError::from(sqlx::Error::PoolTimedOut).is_infrastructure());
        assert!(!HandlerError::from(sqlx::Error::RowNotFound).is_infrastructure());
        assert!(!HandlerError::new("bad payload").is_infrastructure());
        let e = HandlerError::infrastructure("payments API down");
        assert!(e.is_infrastructure());
        assert_eq!(e.to_string(), "payments API down");
    }
}
