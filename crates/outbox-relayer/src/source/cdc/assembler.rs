//! Turns the replication stream's messages into whole transactions of events: a transaction's
//! rows and table-less events are gathered from its Begin to its Commit, the rows it deleted
//! again (zero-growth writes) are known at the Commit, and committed transactions join the
//! batch the loop publishes next. Pure (no database, broker or clock), so that tests feed it
//! stream messages and read what it hands out; the loop in `source.rs` does the rest.

use chrono::{DateTime, Utc};
use outbox::Tables;
use pgwire_replication::{Lsn, ReplicationEvent};

use super::{
    context::{ChunkWork, End, Streamed},
    messages::{heartbeat_prefix, pg_time, relay_write_prefix, table_less_row},
    pgoutput::{BadRow, Change, Decoder},
};
use crate::publisher::PublishError;

/// A transaction is published whole after its commit (its deletes are then known) up to
/// `cdc.max_transaction_events` events and this many bytes of them, in chunks beyond (memory
/// stays bounded); the byte bound is also that of a batch of whole transactions.
pub(super) const CHUNK_BYTES: usize = 64 << 20;

/// A transaction being received.
#[derive(Default)]
struct Txn {
    events: Vec<Streamed>,
    /// What its chunks, published before the commit arrived, left for the commit (when the
    /// deletes of a zero-growth transaction are known).
    chunk: ChunkWork,
    deleted: std::collections::HashSet<i64>,
    /// It is the relay's own write (rows it spilled into the table): not events.
    relay_write: bool,
    /// Events of it were handed out in chunks before its commit.
    chunked: bool,
    commit_time: Option<DateTime<Utc>>,
    /// What `events` cost in memory (payloads and columns).
    bytes: usize,
    /// Its id.
    xid: u32,
    /// Its commit's position.
    commit_lsn: u64,
}

impl Txn {
    /// The stream position of its change at `lsn`.
    fn position(&self, lsn: Lsn) -> super::StreamPosition {
        super::StreamPosition {
            commit_lsn: self.commit_lsn,
            change_lsn: lsn.0,
        }
    }

    fn push(&mut self, event: Streamed) {
        self.bytes += event.row.row_bytes.max(0) as usize;
        self.events.push(event);
    }
}

/// What the loop must do after a stream message.
#[derive(Debug)]
pub(super) enum Step {
    /// Nothing more than after any message.
    Received,
    /// A change outside any transaction (never sent by pgoutput): passed over entirely.
    Ignored,
    /// A transaction committed.
    Committed(Committed),
    /// A row of the events table the decoder could not read: dead-letter it.
    Unreadable(BadRow),
    /// The stream is at this position between transactions with nothing gathered: it may be
    /// confirmed once nothing streamed is left to publish, mark or confirm.
    Idle(Lsn),
    /// The stream cannot go on.
    Failed(End),
}

/// What a committed transaction leaves to the loop.
#[derive(Debug, Default)]
pub(super) struct Committed {
    /// Rows of its chunks that were published and are still in the table, to mark.
    pub(super) published: Vec<(i64, u32)>,
    /// Events of its chunks for the table path, now that its deletes are known.
    pub(super) spills: Vec<(Streamed, Option<PublishError>)>,
    /// When it committed, if it held events, in chunks or at its commit (the unconfirmed-age
    /// gauge starts from it).
    pub(super) streamed: Option<Option<DateTime<Utc>>>,
    /// The batch is full (in events or bytes): publish it now.
    pub(super) batch_full: bool,
}

/// The transactions of one streaming session, as they arrive.
pub(super) struct Assembler {
    decoder: Decoder,
    event_prefix: String,
    relay_prefix: String,
    heartbeat_prefix: String,
    max_batch: usize,
    /// Events numbered in stream order (orders the lanes).
    seq: u64,
    /// The transaction being received.
    txn: Option<Txn>,
    /// Events of whole transactions received, not yet handed out.
    batch: Vec<Streamed>,
    /// What `batch` costs in memory.
    batch_bytes: usize,
    /// End position of the last transaction in `batch` (confirmed once the batch is settled).
    batch_end: Option<Lsn>,
}

impl Assembler {
    /// An assembler for the events table of `tables`, gathering batches of up to `max_batch`
    /// events.
    pub(super) fn new(tables: &Tables, max_batch: usize) -> Self {
        Self {
            decoder: Decoder::new(tables.schema().as_str(), tables.events().as_str()),
            event_prefix: outbox::wal::prefix(tables),
            relay_prefix: relay_write_prefix(tables),
            heartbeat_prefix: heartbeat_prefix(tables),
            max_batch,
            seq: 0,
            txn: None,
            batch: Vec::new(),
            batch_bytes: 0,
            batch_end: None,
        }
    }

    /// Whether a transaction is being received.
    pub(super) fn in_transaction(&self) -> bool {
        self.txn.is_some()
    }

    /// Whether whole transactions were received and not handed out (events, or a position
    /// to confirm).
    pub(super) fn gathered(&self) -> bool {
        !self.batch.is_empty() || self.batch_end.is_some()
    }

    /// Hands out the events of the whole transactions received, with the end position of the
    /// last one.
    pub(super) fn take_batch(&mut self) -> (Vec<Streamed>, Option<Lsn>) {
        self.batch_bytes = 0;
        (std::mem::take(&mut self.batch), self.batch_end.take())
    }

    /// The events of the open transaction received so far, when they reached
    /// `max_transaction_events` or the chunk's bytes (and it is not the relay's own write):
    /// published before its commit, in chunks.
    pub(super) fn take_chunk(&mut self, max_transaction_events: usize) -> Option<Vec<Streamed>> {
        let t = self.txn.as_mut()?;
        if (t.events.len() >= max_transaction_events || t.bytes >= CHUNK_BYTES) && !t.relay_write {
            t.bytes = 0;
            t.chunked = true;
            return Some(std::mem::take(&mut t.events));
        }
        None
    }

    /// What the open transaction's chunks leave for its commit.
    pub(super) fn chunk_work(&mut self) -> Option<&mut ChunkWork> {
        self.txn.as_mut().map(|t| &mut t.chunk)
    }

    /// Takes one stream message.
    pub(super) fn receive(&mut self, message: ReplicationEvent) -> Step {
        match message {
            ReplicationEvent::Begin {
                commit_time_micros,
                xid,
                final_lsn,
            } => {
                self.txn = Some(Txn {
                    commit_time: pg_time(commit_time_micros),
                    xid,
                    commit_lsn: final_lsn.0,
                    ..Default::default()
                });
                Step::Received
            }
            ReplicationEvent::XLogData {
                data, wal_start, ..
            } => {
                let Some(t) = self.txn.as_mut() else {
                    return Step::Ignored;
                };
                match self.decoder.decode(&data) {
                    Ok(Change::Inserted(Ok(row))) => {
                        self.seq += 1;
                        let (xid, position) = (t.xid, t.position(wal_start));
                        t.push(Streamed {
                            seq: self.seq,
                            row: *row,
                            in_table: true,
                            xid,
                            position,
                        });
                        Step::Received
                    }
                    Ok(Change::Inserted(Err(bad))) => Step::Unreadable(bad),
                    Ok(Change::Deleted(id)) => {
                        t.deleted.insert(id);
                        Step::Received
                    }
                    Ok(Change::Other) => Step::Received,
                    Err(e) => Step::Failed(End::failed("decoding pgoutput", e)),
                }
            }
            ReplicationEvent::Message {
                transactional,
                lsn,
                prefix,
                content,
            } => {
                if prefix == self.event_prefix && transactional {
                    if let Some(t) = self.txn.as_mut() {
                        self.seq += 1;
                        let row = table_less_row(&content, t.commit_time, lsn);
                        let (xid, position) = (t.xid, t.position(lsn));
                        t.push(Streamed {
                            seq: self.seq,
                            row,
                            in_table: false,
                            xid,
                            position,
                        });
                    }
                } else if prefix == self.relay_prefix {
                    if let Some(t) = self.txn.as_mut() {
                        t.relay_write = true;
                    }
                } else if prefix == self.heartbeat_prefix && !transactional {
                    return self.idle_at(lsn);
                }
                Step::Received
            }
            ReplicationEvent::Commit { end_lsn, .. } => Step::Committed(self.commit(end_lsn)),
            ReplicationEvent::KeepAlive { wal_end, .. } => self.idle_at(wal_end),
            ReplicationEvent::StoppedAt { .. } => {
                Step::Failed(End::failed_because("the stream stopped"))
            }
        }
    }

    /// `Idle(lsn)` when nothing is open or gathered.
    fn idle_at(&self, lsn: Lsn) -> Step {
        if self.txn.is_none() && !self.gathered() {
            Step::Idle(lsn)
        } else {
            Step::Received
        }
    }

    /// Ends the open transaction at `end_lsn`: its events whose rows it deleted again are not
    /// in the table (they are table-less now), and it joins the batch; the relay's own writes
    /// are not events.
    fn commit(&mut self, end_lsn: Lsn) -> Committed {
        let mut committed = Committed::default();
        if let Some(mut t) = self.txn.take() {
            if !t.relay_write {
                let mut chunk = std::mem::take(&mut t.chunk);
                chunk.published.retain(|(id, _)| !t.deleted.contains(id));
                let events = t
                    .events
                    .iter_mut()
                    .chain(chunk.spills.iter_mut().map(|(e, _)| e));
                for e in events {
                    if e.in_table && t.deleted.contains(&e.row.id) {
                        e.in_table = false;
                    }
                }
                committed.published = chunk.published;
                committed.spills = chunk.spills;
                // Its chunks' events too wait for this commit to be confirmed.
                if !t.events.is_empty() || t.chunked {
                    committed.streamed = Some(t.commit_time);
                }
                self.batch_bytes += t.bytes;
                self.batch.append(&mut t.events);
            }
        }
        self.batch_end = Some(end_lsn);
        committed.batch_full =
            self.batch.len() >= self.max_batch || self.batch_bytes >= CHUNK_BYTES;
        committed
    }
}

#[cfg(test)]
#[path = "assembler_tests.rs"]
mod tests;
