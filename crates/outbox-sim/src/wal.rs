//! The write-ahead log as logical decoding gives it to a replication slot: committed
//! transactions in commit order, each a `Begin`, its changes (pgoutput `Insert` and `Delete`
//! messages, encoded here byte for byte, and transactional logical messages) and a `Commit`;
//! non-transactional messages (heartbeats) where they were written. The slot keeps the
//! confirmed position; a stream starts after it, at the first transaction that ends past it,
//! as PostgreSQL's does. One stream at a time holds the slot, until it is closed or its
//! walsender terminated; a crashed relay's stream holds it until then.

use std::collections::{BTreeMap, VecDeque};

use outbox_relayer::cdc::{Lsn, ReplicationEvent};

use crate::row::{headers_of, timestamp, Row, Status};

/// The relation id of the events table in the stream.
const RELATION: u32 = 16_385;
/// Bytes of WAL per record: only the order of positions matters.
const RECORD: u64 = 0x40;
/// The events table's columns, in its order.
const COLUMNS: [&str; 18] = [
    "id",
    "event_id",
    "aggregate_type",
    "aggregate_id",
    "aggregate_version",
    "event_type",
    "schema_version",
    "destination",
    "payload",
    "content_type",
    "headers",
    "occurred_at",
    "partition",
    "status",
    "attempts",
    "permanent_failures",
    "last_error",
    "next_attempt_at",
];

/// One change of a transaction.
#[derive(Clone, Debug)]
pub enum Change {
    /// A pgoutput message (Insert, Delete).
    Data(Vec<u8>),
    /// A transactional logical message.
    Message {
        /// Its prefix.
        prefix: String,
        /// Its content.
        content: Vec<u8>,
    },
}

/// A committed transaction.
#[derive(Clone, Debug)]
pub struct Txn {
    /// Its id.
    pub xid: u32,
    /// Commit time, database clock (ms).
    pub commit_ms: i64,
    /// Its changes, with their positions.
    pub changes: Vec<(u64, Change)>,
    /// Position of its commit record.
    pub commit_lsn: u64,
    /// Position just past it (what confirming it means).
    pub end_lsn: u64,
}

/// An entry of the log, in order.
#[derive(Clone, Debug)]
pub enum Entry {
    /// A committed transaction.
    Txn(Txn),
    /// A non-transactional message.
    Message {
        /// Its position.
        lsn: u64,
        /// Its prefix.
        prefix: String,
    },
}

impl Entry {
    fn end(&self) -> u64 {
        match self {
            Self::Txn(t) => t.end_lsn,
            Self::Message { lsn, .. } => *lsn + RECORD,
        }
    }
}

/// A replication stream's place in the log.
#[derive(Clone, Debug)]
pub struct Stream {
    /// The relay process reading it.
    pub node: usize,
    /// Next entry to send.
    cursor: usize,
    /// Events of the current entry not yet received.
    pending: VecDeque<ReplicationEvent>,
    /// Whether the Relation message went out (once per stream, before the first row).
    relation_sent: bool,
    /// End of the entry being sent.
    entry_end: u64,
    /// Everything before it was sent: what a keepalive says (the walsender's sent position,
    /// never the server's insert position).
    pub sent: u64,
    /// Its walsender was terminated (or the database restarted).
    pub ended: bool,
    /// Confirmed by the client, not yet reported.
    pub applied: u64,
    /// Reported to the server.
    pub reported: u64,
}

/// The log and the slot.
#[derive(Clone, Debug)]
pub struct Wal {
    /// Every entry since the slot was created.
    pub entries: Vec<Entry>,
    next_lsn: u64,
    next_xid: u32,
    /// Whether the slot exists.
    pub slot_exists: bool,
    /// The slot's confirmed position.
    pub confirmed: u64,
    /// The stream holding the slot.
    pub active: Option<u64>,
    /// Open streams, by number.
    pub streams: BTreeMap<u64, Stream>,
    next_stream: u64,
}

impl Default for Wal {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            next_lsn: 0x0100_0000,
            next_xid: 700,
            slot_exists: false,
            confirmed: 0,
            active: None,
            streams: BTreeMap::new(),
            next_stream: 1,
        }
    }
}

/// A transaction being written into the log.
#[derive(Default)]
pub struct TxnBuilder {
    changes: Vec<Change>,
}

impl TxnBuilder {
    /// A row inserted (status and counters as `row` has them now).
    pub fn insert(&mut self, id: i64, row: &Row, last_error: Option<&str>) {
        let text = |v: String| Some(v.into_bytes());
        let payload: String = row.payload.iter().map(|b| format!("{b:02x}")).collect();
        let status = match row.status {
            Status::Pending => "pending",
            Status::Published => "published",
            Status::Dead => "dead",
        };
        let values: [Option<Vec<u8>>; 18] = [
            text(id.to_string()),
            text(uuid::Uuid::from_u128(row.event as u128).to_string()),
            text(row.key.0.clone()),
            text(row.key.1.clone()),
            text(row.version.to_string()),
            text(crate::row::event_type_of(row).into()),
            text("1".into()),
            None,
            text(format!("\\x{payload}")),
            text("application/json".into()),
            text(headers_of(row)),
            text(
                timestamp(row.occurred_at)
                    .format("%Y-%m-%d %H:%M:%S%.6f+00")
                    .to_string(),
            ),
            text(row.partition.to_string()),
            text(status.into()),
            text(row.attempts.to_string()),
            text(row.permanent_failures.to_string()),
            last_error.map(|e| e.as_bytes().to_vec()),
            None,
        ];
        let mut data = vec![b'I'];
        data.extend(RELATION.to_be_bytes());
        data.push(b'N');
        tuple(&mut data, &values);
        self.changes.push(Change::Data(data));
    }

    /// A row deleted (replica identity: its key).
    pub fn delete(&mut self, id: i64) {
        let mut values: [Option<Vec<u8>>; 18] = Default::default();
        values[0] = Some(id.to_string().into_bytes());
        let mut data = vec![b'D'];
        data.extend(RELATION.to_be_bytes());
        data.push(b'K');
        tuple(&mut data, &values);
        self.changes.push(Change::Data(data));
    }

    /// A transactional logical message.
    pub fn message(&mut self, prefix: &str, content: Vec<u8>) {
        self.changes.push(Change::Message {
            prefix: prefix.to_owned(),
            content,
        });
    }

    /// Whether it changed nothing the stream carries.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

fn tuple(data: &mut Vec<u8>, values: &[Option<Vec<u8>>]) {
    data.extend((values.len() as u16).to_be_bytes());
    for v in values {
        match v {
            None => data.push(b'n'),
            Some(bytes) => {
                data.push(b't');
                data.extend((bytes.len() as u32).to_be_bytes());
                data.extend(bytes);
            }
        }
    }
}

/// The Relation message of the events table `schema`.`table`.
fn relation(schema: &str, table: &str) -> Vec<u8> {
    let mut data = vec![b'R'];
    data.extend(RELATION.to_be_bytes());
    for s in [schema, table] {
        data.extend(s.as_bytes());
        data.push(0);
    }
    data.push(b'd');
    data.extend((COLUMNS.len() as u16).to_be_bytes());
    for (i, c) in COLUMNS.iter().enumerate() {
        data.push(u8::from(i == 0));
        data.extend(c.as_bytes());
        data.push(0);
        data.extend(25u32.to_be_bytes()); // text: the decoder reads text output
        data.extend((-1i32).to_be_bytes());
    }
    data
}

/// PostgreSQL's timestamps: microseconds since 2000-01-01 UTC.
fn pg_micros(ms: i64) -> i64 {
    timestamp(ms).timestamp_micros() - 946_684_800_000_000
}

impl Wal {
    /// Creates the slot at the end of the log.
    pub fn create_slot(&mut self) {
        self.slot_exists = true;
        self.confirmed = self.next_lsn;
    }

    /// Loses the slot (invalidated: it retained too much WAL); its stream ends.
    pub fn lose_slot(&mut self) {
        self.slot_exists = false;
        self.end_all();
    }

    /// The current end of the log.
    pub fn end(&self) -> u64 {
        self.next_lsn
    }

    /// Appends a committed transaction; returns its id (none when it is empty: nothing to
    /// decode).
    pub fn commit(&mut self, txn: TxnBuilder, db_now: i64) -> u32 {
        let xid = self.next_xid;
        self.next_xid = self.next_xid.wrapping_add(1).max(3);
        if txn.is_empty() || !self.slot_exists {
            return xid;
        }
        let mut changes = Vec::with_capacity(txn.changes.len());
        for change in txn.changes {
            self.next_lsn += RECORD;
            changes.push((self.next_lsn, change));
        }
        self.next_lsn += RECORD;
        let commit_lsn = self.next_lsn;
        self.next_lsn += RECORD;
        self.entries.push(Entry::Txn(Txn {
            xid,
            commit_ms: db_now,
            changes,
            commit_lsn,
            end_lsn: self.next_lsn,
        }));
        xid
    }

    /// Appends a non-transactional message.
    pub fn message(&mut self, prefix: &str) {
        if !self.slot_exists {
            return;
        }
        self.next_lsn += RECORD;
        self.entries.push(Entry::Message {
            lsn: self.next_lsn,
            prefix: prefix.to_owned(),
        });
        self.next_lsn += RECORD;
    }

    /// Opens a stream from the confirmed position, or says why not.
    pub fn open(&mut self, node: usize) -> Result<u64, String> {
        if !self.slot_exists {
            return Err("replication slot does not exist".into());
        }
        if let Some(active) = self.active {
            return Err(format!(
                "replication slot is active for PID {}",
                40_000 + active
            ));
        }
        let confirmed = self.confirmed;
        let cursor = self
            .entries
            .iter()
            .position(|e| e.end() > confirmed)
            .unwrap_or(self.entries.len());
        let n = self.next_stream;
        self.next_stream += 1;
        self.streams.insert(
            n,
            Stream {
                node,
                cursor,
                pending: VecDeque::new(),
                relation_sent: false,
                entry_end: confirmed,
                sent: confirmed,
                ended: false,
                applied: 0,
                reported: 0,
            },
        );
        self.active = Some(n);
        Ok(n)
    }

    /// Ends stream `n`'s session (terminated, or the database restarted).
    pub fn end_stream(&mut self, n: u64) {
        if let Some(s) = self.streams.get_mut(&n) {
            s.ended = true;
        }
        if self.active == Some(n) {
            self.active = None;
        }
    }

    /// Ends every stream (a database restart, `pg_terminate_backend` of the holder).
    pub fn end_all(&mut self) {
        let open: Vec<u64> = self.streams.keys().copied().collect();
        for n in open {
            self.end_stream(n);
        }
    }

    /// Stream `n` reports its confirmed position to the server.
    pub fn report(&mut self, n: u64) {
        let Some(s) = self.streams.get_mut(&n) else {
            return;
        };
        if s.ended {
            return;
        }
        s.reported = s.applied;
        // The server never moves the slot back.
        self.confirmed = self.confirmed.max(s.applied);
    }

    /// The next event of stream `n`, if the log has one for it.
    pub fn next(&mut self, n: u64, schema: &str, table: &str) -> Option<ReplicationEvent> {
        let s = self.streams.get_mut(&n)?;
        if s.pending.is_empty() {
            let entry = self.entries.get(s.cursor)?;
            s.cursor += 1;
            s.entry_end = entry.end();
            match entry {
                Entry::Message { lsn, prefix } => s.pending.push_back(ReplicationEvent::Message {
                    transactional: false,
                    lsn: Lsn(*lsn),
                    prefix: prefix.clone(),
                    content: Vec::new().into(),
                }),
                Entry::Txn(t) => {
                    let commit_time_micros = pg_micros(t.commit_ms);
                    s.pending.push_back(ReplicationEvent::Begin {
                        final_lsn: Lsn(t.commit_lsn),
                        xid: t.xid,
                        commit_time_micros,
                    });
                    for (lsn, change) in &t.changes {
                        match change {
                            Change::Data(data) => {
                                if !s.relation_sent {
                                    s.relation_sent = true;
                                    s.pending.push_back(xlog(*lsn, relation(schema, table)));
                                }
                                s.pending.push_back(xlog(*lsn, data.clone()));
                            }
                            Change::Message { prefix, content } => {
                                s.pending.push_back(ReplicationEvent::Message {
                                    transactional: true,
                                    lsn: Lsn(*lsn),
                                    prefix: prefix.clone(),
                                    content: content.clone().into(),
                                });
                            }
                        }
                    }
                    s.pending.push_back(ReplicationEvent::Commit {
                        lsn: Lsn(t.commit_lsn),
                        end_lsn: Lsn(t.end_lsn),
                        commit_time_micros,
                    });
                }
            }
        }
        let event = s.pending.pop_front();
        if s.pending.is_empty() {
            s.sent = s.entry_end;
        }
        event
    }
}

fn xlog(lsn: u64, data: Vec<u8>) -> ReplicationEvent {
    ReplicationEvent::XLogData {
        wal_start: Lsn(lsn),
        wal_end: Lsn(0),
        server_time_micros: 0,
        data: data.into(),
    }
}
