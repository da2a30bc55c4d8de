use std::fmt;

/// Everything that can go wrong when writing events or preparing the outbox schema.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An event field failed validation; `field` names it and `reason` says why.
    #[error("invalid event: {field} {reason}")]
    InvalidEvent {
        /// The offending field (`aggregate_type`, `headers.traceparent`, …).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The payload is larger than the configured limit.
    #[error("invalid event: payload is {size} bytes, over the limit of {limit} bytes")]
    PayloadTooLarge {
        /// Size of the rejected payload in bytes.
        size: usize,
        /// The configured limit in bytes.
        limit: usize,
    },
    /// Another event of the same aggregate already has this version (optimistic concurrency).
    /// PostgreSQL aborts the caller's transaction: roll it back and retry the command.
    #[error(
        "aggregate {aggregate_type}/{aggregate_id} already has an event with version {version}"
    )]
    DuplicateAggregateVersion {
        /// Aggregate type of the conflicting event.
        aggregate_type: String,
        /// Aggregate id of the conflicting event.
        aggregate_id: String,
        /// The version that is already taken.
        version: i64,
    },
    /// A schema or table name is not a plain SQL identifier.
    #[error("invalid identifier {value:?} for {what}: {reason}")]
    InvalidIdentifier {
        /// Which setting held it (`schema`, `table`).
        what: &'static str,
        /// The rejected value.
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// The payload could not be serialised to JSON.
    #[error("could not serialise the payload to JSON")]
    Serialize(#[source] serde_json::Error),
    /// The database schema is not in the state this version expects.
    #[error("outbox schema: {0}")]
    Schema(SchemaError),
    /// The database refused an operation.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    #[error("database error")]
    Database(#[source] sqlx::Error),
}

/// Why the outbox schema cannot be used as it is.
#[derive(Debug)]
#[non_exhaustive]
pub enum SchemaError {
    /// The database holds migrations newer than this build knows.
    TooNew {
        /// Highest version recorded in the database.
        database: i32,
        /// Highest version this build ships.
        known: i32,
    },
    /// The database lacks migrations this build needs: run `outbox migrate`.
    Outdated {
        /// Highest version recorded in the database.
        database: i32,
        /// Highest version this build ships.
        needed: i32,
    },
    /// An applied migration differs from the file this build ships.
    Modified {
        /// The migration's version.
        version: i32,
    },
    /// The outbox was created with another partition count.
    PartitionMismatch {
        /// Partition count recorded at creation.
        existing: i32,
        /// Partition count requested now.
        requested: i32,
    },
    /// `partitions` must be between 1 and 4096.
    BadPartitionCount(i32),
    /// The backend has no partitions to set (SQLite's one partition); the text says why.
    Partitions(String),
    /// The outbox tables do not exist: run `outbox migrate` first.
    Missing,
    /// A time-partitioning setting that cannot be applied; the text says why.
    TimePartitioning(String),
    /// Change data capture cannot be set up or used as asked; the text says why.
    Cdc(String),
    /// The migration lock could not be taken; the text says why.
    Locked(String),
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooNew { database, known } => write!(
                f,
                "database is at migration {database} but this build knows only up to {known}; \
                 upgrade the outbox binary"
            ),
            Self::Outdated { database, needed } => write!(
                f,
                "the outbox schema is at migration {database} and this build needs migration \
                 {needed}: run `outbox migrate` (with this build) first"
            ),
            Self::Modified { version } => write!(
                f,
                "migration {version} was applied with different contents than this build ships"
            ),
            Self::PartitionMismatch {
                existing,
                requested,
            } => write!(
                f,
                "outbox was created with {existing} partitions, {requested} requested; changing \
                 the partition count is a manual procedure (see docs/operations.md)"
            ),
            Self::BadPartitionCount(n) => {
                write!(f, "partitions must be between 1 and 4096, got {n}")
            }
            Self::Partitions(why) => write!(f, "partitions: {why}"),
            Self::Missing => write!(f, "outbox tables not found; run `outbox migrate` first"),
            Self::TimePartitioning(why) => write!(f, "time partitioning: {why}"),
            Self::Cdc(why) => write!(f, "change data capture: {why}"),
            Self::Locked(why) => write!(f, "migration lock: {why}"),
        }
    }
}

impl Error {
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidEvent {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// An error and its causes as one line, "outer: inner: root": what a program prints for an
/// operator, who needs the cause (the errors of these crates keep it as their `source`, not in
/// their message). A cause whose text the message already holds is not repeated.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Outer(&'static str, #[source] std::io::Error);

    #[test]
    fn a_chain_names_every_cause_once() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(
            chain(&Outer("nats: cannot connect", refused)),
            "nats: cannot connect: refused"
        );
        let repeated = std::io::Error::other("refused");
        assert_eq!(
            chain(&Outer("cannot connect: refused", repeated)),
            "cannot connect: refused"
        );
    }
}
