use futures::future::BoxFuture;
use sqlx::PgConnection;

use crate::{Envelope, Upcasters};

/// Applies one event's effect.
///
/// # Contract
///
/// `handle` runs inside the consumer's transaction: do every database write through `tx`, and
/// nothing else that cannot be rolled back. It is called at most once per (consumer, event id)
/// that commits: the inbox row is inserted in the same transaction. Returning `Err` rolls the
/// transaction back; the message is tried again with backoff (held in the consumer's database
/// meanwhile), then dead-lettered after the configured attempts, or at once when the error is
/// [`HandlerError::permanent`]. A panic counts as an `Err` of that message. An error of the
/// infrastructure ([`HandlerError::is_infrastructure`]: the database unreachable, read-only or
/// out of resources) spends no attempt: the runner keeps the message and retries it until the
/// database answers. A handler that ignores the error of a statement it ran in `tx` (without a
/// savepoint) leaves the transaction aborted: the processor notices before committing, and the
/// message fails with PostgreSQL's "current transaction is aborted" instead of being
/// acknowledged unapplied.
///
/// A handler never ends or starts a transaction on `tx` itself (`COMMIT`, `ROLLBACK`, `BEGIN`,
/// `SET TRANSACTION`); for a savepoint, `tx.begin()` gives a nested transaction. The processor
/// checks after the handler that the transaction it began is still open before it writes
/// anything more:
/// - After a `ROLLBACK`, the event fails and is tried again as after any failure. Whatever the
///   handler ran after its `ROLLBACK` committed on its own, and runs again on every try.
/// - After a `COMMIT`, the event's work (its inbox row, the handler's writes) is committed.
///   The event counts as applied, and its version and held row follow in transactions of their
///   own; a crash between the two leaves a gated aggregate waiting for a version it applied.
/// - After `SET TRANSACTION READ ONLY`, what the processor writes next fails as if the database
///   were read-only: the runner waits for it to become writable, indefinitely.
pub trait Handler: Send + Sync + 'static {
    /// Applies `event` through `tx`.
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;

    /// The upcasters this handler's events need, which a [`crate::Processor`] built on it
    /// starts with: none by default; [`crate::Handlers`] returns its types' own.
    fn upcasters(&self) -> Upcasters {
        Upcasters::new()
    }
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
    Permanent,
    /// Permanent: a version below its aggregate's start, never this consumer's to apply.
    BelowStart,
    /// Permanent: an upcaster panicked (counted with the handlers' panics).
    UpcastPanic,
    Conflict,
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

    /// A failure no retry can cure (the message can never be applied): dead-lettered at once,
    /// with this message as its reason.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            kind: Kind::Permanent,
        }
    }

    /// A version below its aggregate's start: permanent, and the event's place rather than its
    /// failure (its aggregate's start stays where it is).
    pub(crate) fn below_start(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            kind: Kind::BelowStart,
        }
    }

    /// A concurrent first event of the same aggregate created its state row meanwhile: the
    /// processor tries again at once.
    pub(crate) fn conflict() -> Self {
        Self {
            message: "a concurrent event of the aggregate changed its state first".into(),
            kind: Kind::Conflict,
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

    /// Whether no retry can cure it: the message is dead-lettered at once.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self.kind,
            Kind::Permanent | Kind::BelowStart | Kind::UpcastPanic
        )
    }

    /// An upcaster's panic, caught: permanent, and counted as a panic by the processor.
    pub(crate) fn upcast_panicked(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            kind: Kind::UpcastPanic,
        }
    }

    pub(crate) fn is_upcast_panic(&self) -> bool {
        self.kind == Kind::UpcastPanic
    }

    pub(crate) fn is_below_start(&self) -> bool {
        self.kind == Kind::BelowStart
    }

    pub(crate) fn is_conflict(&self) -> bool {
        self.kind == Kind::Conflict
    }

    /// Whether the failure spends one of the message's attempts: an outage does not.
    pub fn counts_as_attempt(&self) -> bool {
        matches!(
            self.kind,
            Kind::Message | Kind::Permanent | Kind::BelowStart | Kind::UpcastPanic
        )
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

/// Whether a database error says the database cannot be used right now, whatever the
/// message, as opposed to a statement that fails on this message's data. The classes:
///
/// | SQLSTATE | what |
/// | --- | --- |
/// | `08…` | connection exception (lost, refused, failed) |
/// | `57P01`–`57P05` | shutting down (admin, crash), cannot connect now, idle session timeout |
/// | `53…` | insufficient resources: disk full (53100), out of memory (53200), too many connections (53300) |
/// | `58…` | system error (an I/O error of the server) |
/// | `25006` | read-only transaction: a standby after a failover, or a database set read-only |
/// | `28…` | invalid authorisation (a rotated password, a role that may not log in) |
/// | `40001`, `40P01` | serialisation failure, deadlock: the transaction can succeed again |
///
/// and every error without a SQLSTATE that means no usable connection (I/O, TLS, protocol,
/// a pool exhausted or closed).
pub(crate) fn is_outage(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            ["08", "57P", "53", "58", "28"]
                .iter()
                .any(|class| code.starts_with(class))
                || matches!(&*code, "25006" | "40001" | "40P01")
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
