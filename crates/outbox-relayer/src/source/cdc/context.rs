//! What the CDC source's parts share: the relay's handles (`Context`), the rendered
//! statements, how a session ends, the streamed events, and the retry of a statement while the
//! leases last.

use std::sync::Arc;

use outbox::Tables;
use tokio::time::Instant;

use crate::{
    complete::{Needs, Refusals},
    config::RelayConfig,
    health::Health,
    lease::Leases,
    publisher::Publisher,
    store::{ClaimedRow, Fence, Store},
    telemetry::Metrics,
};

/// Everything the CDC loop needs from the relay.
pub(crate) struct Context {
    /// Completion, shared with the polling source: metrics of outcomes and failure decisions.
    pub completer: Arc<crate::complete::Completer>,
    /// The statements and the replication stream.
    pub db: Arc<dyn super::CdcDb>,
    pub tables: Tables,
    pub store: Arc<dyn Store>,
    pub publisher: Arc<dyn Publisher>,
    pub config: RelayConfig,
    pub leases: Arc<Leases>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub relay_id: String,
    pub max_payload: usize,
    /// The oldest streamed transaction not yet confirmed, for the slot's lag gauge.
    pub unconfirmed: super::unconfirmed::Unconfirmed,
}

/// Why a streaming session ended.
#[derive(Debug)]
pub(super) enum End {
    /// Shutdown requested.
    Stop,
    /// The exclusive lease was lost (or never complete): back to standby.
    LeaseLost,
    /// The stream or the database failed: reconnect after a pause.
    Failed(StreamFailure),
}

/// Why a streaming session failed: what it was doing, and the error that stopped it (kept as
/// the source, so that the log shows the whole chain).
#[derive(Debug, thiserror::Error)]
#[error("{context}")]
pub(super) struct StreamFailure {
    context: &'static str,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl End {
    /// A failure while doing `context`, caused by `source`.
    pub(super) fn failed(
        context: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Failed(StreamFailure {
            context,
            source: Some(source.into()),
        })
    }

    /// A failure with no underlying error.
    pub(super) fn failed_because(context: &'static str) -> Self {
        Self::Failed(StreamFailure {
            context,
            source: None,
        })
    }
}

impl StreamFailure {
    /// The context and every cause, `a: b: c`, for a log line.
    pub(super) fn chain(&self) -> String {
        let mut text = self.context.to_owned();
        let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(self);
        while let Some(c) = cause {
            text.push_str(": ");
            text.push_str(&c.to_string());
            cause = c.source();
        }
        text
    }
}

/// One streamed event.
#[derive(Debug, Clone)]
pub(super) struct Streamed {
    /// Position in the stream (orders lanes).
    pub(super) seq: u64,
    /// The row as the stream carried it; `id` 0 for a table-less event.
    pub(super) row: ClaimedRow,
    /// Whether the row is in the table (not table-less, not deleted in its transaction).
    pub(super) in_table: bool,
    /// Its transaction's id as the stream gave it (32 bits; 0 for rows read from the table).
    pub(super) xid: u32,
    /// Where the stream carried it (zero for rows read from the table).
    pub(super) position: super::StreamPosition,
}

/// What the chunks of an open transaction leave for its commit, when the deletes of a
/// zero-growth transaction are known: which published rows to mark, and which events go to
/// the table path (a row of the chunk may be deleted at the commit, so it is written into the
/// table only then).
#[derive(Debug, Default)]
pub(super) struct ChunkWork {
    /// Published rows of the table, with their transactions.
    pub(super) published: Vec<(i64, u32)>,
    /// Events for the table path, in stream order: a failure with its error, or an event
    /// behind a held aggregate.
    pub(super) spills: Vec<(Streamed, Option<crate::publisher::PublishError>)>,
}

/// An aggregate whose events are in the table path.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// Its events are with an open transaction's chunks until that commits: not resumed from
    /// the table before.
    pub(super) until_commit: bool,
    /// When to publish it from the table; `None`: parked until an operator acts.
    pub(super) due: Option<Instant>,
    /// Where the stream first handed it to the table path: what the stream sends again from
    /// before was settled before the hold (published), and is not written behind it.
    pub(super) since: Option<super::StreamPosition>,
}

pub(super) type Key = (String, String);

/// Retries a database statement with backoff while every lease of `fences` lasts (the
/// session holds them all), through the relay's one fenced retry
/// ([`crate::complete::Completer::fenced`]). A statement the database refuses for its data is
/// retried too: the callers are those nothing can be written around (a position must not pass
/// them), so the stall shows in readiness rather than the event being stranded.
pub(super) async fn retry<T, F, Fut>(ctx: &Context, fences: &[Fence], f: F) -> Result<T, End>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    ctx.completer
        .fenced(fences, Needs::All, Refusals::Retry, f)
        .await
        .map_err(|_| End::LeaseLost)
}
