//! What `outbox verify` reads from an outbox to hold it against the broker: the database's
//! clock when the audit begins, the rows of the event ids a batch of broker messages carries,
//! and every row of the audited window in id order, streamed. Each database answers through
//! [`Audited`], implemented on its pool in its folder (`postgres/verify.rs`, …) with its
//! statements in `sql/verify.sql`.

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use outbox::Tables;
use uuid::Uuid;

/// The window of `occurred_at` an audit looks at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// At or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Before this time.
    pub until: Option<DateTime<Utc>>,
}

/// A row found by its event id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Its event id, as the database holds it.
    pub event_id: String,
    /// Its row id.
    pub id: i64,
    /// Its aggregate type.
    pub aggregate_type: String,
    /// Its aggregate id.
    pub aggregate_id: String,
    /// Whether it occurred in the window.
    pub in_window: bool,
}

impl Found {
    /// A row as the lookup statements return it: event id, row id, aggregate type and id, and
    /// whether it is in the window.
    pub(crate) fn of(
        (event_id, id, aggregate_type, aggregate_id, in_window): (
            String,
            i64,
            String,
            String,
            bool,
        ),
    ) -> Self {
        Self {
            event_id,
            id,
            aggregate_type,
            aggregate_id,
            in_window,
        }
    }
}

/// A row of the window, as the scan reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scanned {
    /// Its row id.
    pub id: i64,
    /// Its event id, as the database holds it.
    pub event_id: String,
    /// Whether it is marked published.
    pub published: bool,
    /// Whether it was marked published after the audit began.
    pub later: bool,
}

/// What an audit asks of a database.
pub trait Audited: Sync {
    /// The database's clock now: rows marked published up to it have their message in the
    /// broker before the audit reads the broker's end.
    fn now(&self) -> BoxFuture<'_, Result<DateTime<Utc>, sqlx::Error>>;

    /// The rows whose event ids are among `ids`, each with whether it occurred in `window`.
    fn lookup<'a>(
        &'a self,
        tables: &'a Tables,
        ids: &'a [Uuid],
        window: Window,
    ) -> BoxFuture<'a, Result<Vec<Found>, sqlx::Error>>;

    /// Feeds every row of `window` to `feed`, in id order, streamed; `later` says whether it
    /// was marked published after `began`.
    fn scan<'a>(
        &'a self,
        tables: &'a Tables,
        window: Window,
        began: DateTime<Utc>,
        feed: &'a mut (dyn FnMut(Scanned) + Send),
    ) -> BoxFuture<'a, Result<(), sqlx::Error>>;

    /// Whether the outbox has a CDC slot set up: its writers may use the zero-growth or
    /// table-less modes, whose events leave no row to compare with. No database but
    /// PostgreSQL has CDC.
    fn has_cdc<'a>(&'a self, _tables: &'a Tables) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(async { Ok(false) })
    }
}
