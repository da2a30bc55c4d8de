//! Dispatch: claimed rows, from either source, turned into messages ([`item`]) and published in
//! ordered lanes ([`lanes`]): aggregates at once, each aggregate one event at a time.

pub mod lanes;

pub use lanes::{dispatch, Item, Outcome};

use crate::{routing::RoutingConfig, store::ClaimedRow};

/// What the metrics call a row whose destination cannot be known (it does not decode).
pub(crate) const UNDECODABLE: &str = "(undecodable)";

/// The lane item of a claimed row, as both sources build it: its message (or why it cannot be
/// published, a permanent failure), its routed destination, its ordering key, its attempts
/// and the lease epoch it was claimed under. `id` identifies the item in the results: the row
/// id when polling, the position in the stream in CDC mode (a table-less event has no row).
pub(crate) fn item(
    row: &ClaimedRow,
    id: i64,
    epoch: i64,
    routing: &RoutingConfig,
    max_payload: usize,
) -> Item {
    let message = row.decode_guarded(routing, max_payload);
    let destination = match &message {
        Ok(m) => m.destination.clone(),
        Err(error) => {
            tracing::warn!(event_id = %row.event_id, %error, "malformed outbox row");
            UNDECODABLE.to_owned()
        }
    };
    Item {
        id,
        partition: row.partition,
        epoch,
        attempts: row.attempts,
        permanent_failures: row.permanent_failures,
        key: (row.aggregate_type.clone(), row.aggregate_id.clone()),
        destination,
        message,
    }
}
