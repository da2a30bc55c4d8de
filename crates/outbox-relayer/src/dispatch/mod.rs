//! Dispatch: claimed rows, from either source, checked and turned into messages ([`decode`],
//! [`item`]) and published in ordered lanes ([`lanes`]): aggregates at once, each aggregate
//! one event at a time.

pub mod decode;
pub mod lanes;

pub use decode::Checked;
pub use lanes::{dispatch, Item, Outcome};

use crate::{store::ClaimedRow, wire::routing::RoutingConfig};

/// What the metrics call a row whose destination cannot be known (it does not decode).
pub(crate) const UNDECODABLE: &str = "(undecodable)";

/// The lane item of a claimed row, as both sources build it: its message (or why it cannot be
/// published, a permanent failure), its ordering key, its attempts and the lease epoch it was
/// claimed under. `id` identifies the item in the results: the row id when polling, the
/// position in the stream in CDC mode (a table-less event has no row). The row's strings and
/// payload move into the message.
pub(crate) fn item(
    row: ClaimedRow,
    id: i64,
    epoch: i64,
    routing: &RoutingConfig,
    max_payload: usize,
) -> Item {
    let (partition, attempts, permanent_failures) =
        (row.partition, row.attempts, row.permanent_failures);
    let (message, unpublishable_key) = match row.check_guarded(routing, max_payload) {
        Ok(checked) => (Ok(row.into_message(checked)), None),
        Err(error) => {
            tracing::warn!(event_id = %row.event_id, %error, "malformed outbox row");
            (Err(error), Some((row.aggregate_type, row.aggregate_id)))
        }
    };
    Item {
        id,
        partition,
        epoch,
        attempts,
        permanent_failures,
        message,
        unpublishable_key,
    }
}
