//! The CDC source (`mode = "cdc"`): committed events from a PostgreSQL logical replication
//! slot (pgoutput), in commit order, through the same dispatcher, publishers and fenced
//! completion statements as the polling relay.
//!
//! ```text
//!  WAL ──► slot ──► stream (pgoutput) ──► batches of whole transactions ──► dispatcher ──► broker
//!                    rows carried in the stream,                            (ordered lanes)
//!                    never read back from the table                              │
//!         confirmed LSN ◄── every event of every earlier transaction settled ◄────┘
//! ```
//!
//! * **What is streamed.** Inserts into the events table (`WriteMode::Table`), inserts deleted
//!   again in the same transaction (`WriteMode::ZeroGrowth`: the table stays empty) and
//!   transactional logical messages with the outbox's prefix (`WriteMode::WalOnly`: no table;
//!   format in [`outbox::wal`]). The relay publishes the row *carried in the stream*: a commit
//!   can reach the stream before it is visible to queries, and a relay that looked the row up
//!   would find nothing and lose the event.
//! * **One streamer per slot.** The streamer holds every partition lease
//!   ([`crate::lease`], exclusive mode); standbys wait for all of them. Every write is fenced
//!   by those epochs, and a takeover terminates the walsender the previous holder left behind.
//! * **Confirmation.** A batch holds whole transactions (one larger than 50,000 events or
//!   64 MiB is published in chunks, its rows marked, its table path written and its end
//!   confirmed after its commit). The slot's
//!   position advances to a transaction's end only when each of its events is *settled*:
//!   acknowledged by the broker (and marked published when it is a row of the table), or
//!   handed to the table path. Never further: after a crash the stream resumes from there
//!   (duplicates, never losses). Idle, a heartbeat message keeps the slot advancing.
//! * **Failures: the table path.** A transient failure that came fast is published again in
//!   place a few times (a blip). An event that still fails, or got no answer within the
//!   publish timeout, is handed to the table: its row (written back by the relay in
//!   zero-growth and table-less modes) gets the attempt, the error and a hold with backoff, or
//!   is dead-lettered and parks its aggregate, as in polling mode. Later streamed events of a
//!   held aggregate join it in the table, and so do those routed to a destination that gave
//!   no answer, until it answers again: the stream never waits on a destination that hangs.
//!   The relay publishes held aggregates from the table when their hold lapses (or an
//!   operator replays or skips the dead head), in id order, in tasks of their own beside the
//!   stream, and gives an aggregate back to the stream once nothing of it is pending there.
//!   Other aggregates stream on meanwhile (G8); a batch of which nothing went out, for
//!   failures that came fast, pauses the stream with a growing backoff (a broker that is
//!   down).
//! * **Holds are the table path's record.** An aggregate is in the table path exactly while
//!   it has a row in `holds`: the stream reads them when it starts and every second, so a
//!   restart, a takeover or an operator's action with the relay stopped finds every
//!   aggregate that has events waiting there. Only `unpark` (nothing pending left) deletes a
//!   hold; replay, skip and the polling statements move it to the aggregate's first pending
//!   row instead while one remains.
//! * **Catch-up.** Rows pending when the slot was created (`outbox migrate --cdc` records the
//!   highest id) are published from the table before streaming starts, so events that
//!   predate the slot, or a slot that was lost and recreated, are not lost.
//!
//! Write modes: use one per outbox. A table-less event and a table row of the same aggregate
//! would be ordered by commit in the stream but by id in the table path.

mod assembler;
mod connect;
pub(crate) mod context;
mod db;
mod inflight;
mod marks;
mod messages;
mod pgoutput;
mod pipeline;
mod resumes;
mod slot;
mod source;
mod spill;
mod table_path;
mod unconfirmed;

pub use connect::ReplicationTarget;
pub use db::{
    AggregateKey, CdcDb, HoldRow, Lsn, ReplicationEvent, SlotState, SpillHold, SpillRow, Spilled,
    StreamError, StreamPosition, WalStream,
};
pub use messages::{heartbeat_prefix, relay_write_prefix};
pub use pgoutput::{BadRow, Change, Decoder};
pub(crate) use source::run;
