//! The version gate: a consumer applies the events of an aggregate in `aggregate_version`
//! order, each once, whatever order the broker delivers them in. Per consumer and aggregate it
//! keeps the last version applied (`consumer_versions`), checked and advanced in the same
//! transaction as the inbox row and the handler's effect.

use sqlx::PgConnection;

use crate::{Envelope, HandlerError};

/// Where the gate expects an aggregate's versions to start, and so whether it can tell a gap
/// on an aggregate it has never seen.
#[derive(Clone, Debug)]
pub struct VersionGate {
    first_version: Option<i64>,
    check_sql: String,
    advance_sql: String,
}

/// What the gate says of an event.
pub(crate) enum Verdict {
    /// Its version is the next one (or it has none): apply it, then [`VersionGate::advance`].
    Next(Option<(String, String, i64)>),
    /// Its version was applied already: skip it.
    Stale,
}

impl VersionGate {
    /// A gate whose aggregates start at version `first` (usually 1): an aggregate's first
    /// event applied must carry `first`, so a later one that overtakes it waits.
    pub fn starting_at(tables: &outbox::Tables, first: i64) -> Self {
        Self::new(tables, Some(first))
    }

    /// A gate that takes the first version it sees of an aggregate as its start (for a
    /// consumer deployed after its aggregates' first events, or whose versions do not start at
    /// a fixed number). Its first event cannot be checked for a gap.
    pub fn from_first_seen(tables: &outbox::Tables) -> Self {
        Self::new(tables, None)
    }

    fn new(tables: &outbox::Tables, first_version: Option<i64>) -> Self {
        Self {
            first_version,
            check_sql: tables.render(
                "SELECT version FROM {schema}.consumer_versions \
                 WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 FOR UPDATE",
            ),
            // Inserts the aggregate's first version, or advances it only from the version
            // checked: a concurrent step that got there first makes this one fail and retry.
            advance_sql: tables.render(
                "INSERT INTO {schema}.consumer_versions \
                     (consumer, aggregate_type, aggregate_id, version) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE \
                     SET version = EXCLUDED.version, updated_at = now() \
                     WHERE consumer_versions.version = EXCLUDED.version - 1",
            ),
        }
    }

    /// Checks `event` for `consumer`; locks the aggregate's row until the transaction ends.
    pub(crate) async fn check(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        event: &Envelope,
    ) -> Result<Verdict, HandlerError> {
        let (Some(kind), Some(id), Some(version)) = (
            event.aggregate_type.as_deref(),
            event.aggregate_id.as_deref(),
            event.aggregate_version,
        ) else {
            return Ok(Verdict::Next(None));
        };
        let last: Option<i64> = sqlx::query_scalar(&self.check_sql)
            .bind(consumer)
            .bind(kind)
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
        let expected = match (last, self.first_version) {
            (Some(last), _) => last + 1,
            (None, Some(first)) => first,
            (None, None) => version,
        };
        let key = Some((kind.to_owned(), id.to_owned(), version));
        if version == expected {
            return Ok(Verdict::Next(key));
        }
        if version < expected && last.is_some() {
            return Ok(Verdict::Stale);
        }
        if version < expected {
            return Err(HandlerError::new(format!(
                "{kind} {id:?} version {version} is below the first version {expected} the \
                 version gate expects"
            )));
        }
        Err(HandlerError::out_of_order(format!(
            "{kind} {id:?} version {version} arrived before version {expected}: held until \
             it is applied"
        )))
    }

    /// Records `key`'s version as applied, in the transaction `check` locked it in.
    pub(crate) async fn advance(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        key: &(String, String, i64),
    ) -> Result<(), HandlerError> {
        let (kind, id, version) = key;
        let done = sqlx::query(&self.advance_sql)
            .bind(consumer)
            .bind(kind)
            .bind(id)
            .bind(version)
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(HandlerError::new(format!(
                "{kind} {id:?} version {version}: another delivery advanced the aggregate \
                 first; retried"
            )))
        }
    }
}
