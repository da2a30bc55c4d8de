//! What the audit reads from the outbox, asked of its database through the relay library's
//! [`Audited`] (PostgreSQL, MySQL or SQLite): the database's clock when the audit begins, the
//! rows a batch of broker messages carries (looked up by event id), and every row of the
//! window in id order, streamed.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
pub use outbox_relayer::verify::Window;
use outbox_relayer::verify::{Audited, Scanned};
use uuid::Uuid;

use super::audit::{aggregate_hash, Audit, Row};
use crate::commands::Outbox;

type Error = Box<dyn std::error::Error>;

fn audited(outbox: &Outbox) -> &dyn Audited {
    outbox.db.audited()
}

/// The database's clock now: rows marked published up to it have their message in the broker
/// before the audit reads the broker's end.
pub async fn now(outbox: &Outbox) -> Result<DateTime<Utc>, Error> {
    Ok(audited(outbox).now().await?)
}

/// The rows whose event ids are among `ids`, each with whether it occurred in the window.
pub async fn lookup(
    outbox: &Outbox,
    ids: &[Uuid],
    window: Window,
) -> Result<HashMap<Uuid, Row>, Error> {
    let mut found = HashMap::with_capacity(ids.len());
    if ids.is_empty() {
        return Ok(found);
    }
    for row in audited(outbox).lookup(&outbox.tables, ids, window).await? {
        if let Ok(event_id) = Uuid::parse_str(&row.event_id) {
            found.insert(
                event_id,
                Row {
                    id: row.id,
                    aggregate: aggregate_hash(&row.aggregate_type, &row.aggregate_id),
                    in_window: row.in_window,
                },
            );
        }
    }
    Ok(found)
}

/// Feeds every row of the window to `audit`, in id order, streamed: whether each was
/// published, and whether after `began`. A SQLite row whose event id is not a UUID
/// (dead-lettered for it, never published) is left out.
pub async fn scan(
    outbox: &Outbox,
    window: Window,
    began: DateTime<Utc>,
    audit: &mut Audit,
) -> Result<(), Error> {
    let mut feed = |row: Scanned| {
        if let Ok(event_id) = Uuid::parse_str(&row.event_id) {
            audit.row(row.id, event_id, row.published, row.later);
        }
    };
    audited(outbox)
        .scan(&outbox.tables, window, began, &mut feed)
        .await?;
    Ok(())
}

/// Whether the outbox has a CDC slot set up (PostgreSQL): its writers may use the
/// zero-growth or table-less modes, whose events leave no row to compare with.
pub async fn has_cdc(outbox: &Outbox) -> Result<bool, Error> {
    Ok(audited(outbox).has_cdc(&outbox.tables).await?)
}
