//! The assembler fed stream messages as the server sends them: pgoutput bytes for the events
//! table's rows, logical messages for table-less events, heartbeats and the relay's own
//! writes.

use bytes::Bytes;
use outbox::{wal::WalEvent, Event, Tables};
use pgwire_replication::{Lsn, ReplicationEvent};

use super::{Assembler, Committed, Step};
use crate::source::cdc::{heartbeat_prefix, relay_write_prefix};

const RELATION: u32 = 16_385;
const COLUMNS: [&str; 8] = [
    "id",
    "event_id",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "payload",
    "content_type",
    "status",
];

fn tables() -> Tables {
    Tables::new("shop", "events").unwrap()
}

fn xlog(lsn: u64, data: Vec<u8>) -> ReplicationEvent {
    ReplicationEvent::XLogData {
        wal_start: Lsn(lsn),
        wal_end: Lsn(lsn),
        server_time_micros: 0,
        data: Bytes::from(data),
    }
}

fn tuple(data: &mut Vec<u8>, values: &[Option<&str>]) {
    data.extend((values.len() as u16).to_be_bytes());
    for v in values {
        match v {
            None => data.push(b'n'),
            Some(text) => {
                data.push(b't');
                data.extend((text.len() as u32).to_be_bytes());
                data.extend(text.as_bytes());
            }
        }
    }
}

/// The Relation message of `schema.table`.
fn relation(schema: &str, table: &str) -> ReplicationEvent {
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
        data.extend(25u32.to_be_bytes());
        data.extend((-1i32).to_be_bytes());
    }
    xlog(1, data)
}

/// A pending row `id` of aggregate `order/{aggregate}` inserted at `lsn`.
fn insert(lsn: u64, id: i64, aggregate: &str) -> ReplicationEvent {
    let id_text = id.to_string();
    let event_id = uuid::Uuid::from_u128(id as u128).to_string();
    let mut data = vec![b'I'];
    data.extend(RELATION.to_be_bytes());
    data.push(b'N');
    let values = [
        Some(id_text.as_str()),
        Some(event_id.as_str()),
        Some("order"),
        Some(aggregate),
        Some("Placed"),
        Some("\\x7b7d"),
        Some("application/json"),
        Some("pending"),
    ];
    tuple(&mut data, &values);
    xlog(lsn, data)
}

fn delete(lsn: u64, id: i64) -> ReplicationEvent {
    let id_text = id.to_string();
    let mut data = vec![b'D'];
    data.extend(RELATION.to_be_bytes());
    data.push(b'K');
    let mut values = [None; 8];
    values[0] = Some(id_text.as_str());
    tuple(&mut data, &values);
    xlog(lsn, data)
}

fn begin(xid: u32, final_lsn: u64) -> ReplicationEvent {
    ReplicationEvent::Begin {
        final_lsn: Lsn(final_lsn),
        xid,
        commit_time_micros: 0,
    }
}

/// A transaction's Begin and the Relation message of the events table, as the server sends
/// them before the transaction's first change of the table.
fn open(stream: &mut Assembler, xid: u32, final_lsn: u64) {
    received(
        stream,
        vec![begin(xid, final_lsn), relation("shop", "events")],
    );
}

fn commit(end_lsn: u64) -> ReplicationEvent {
    ReplicationEvent::Commit {
        lsn: Lsn(end_lsn - 1),
        end_lsn: Lsn(end_lsn),
        commit_time_micros: 0,
    }
}

fn message(lsn: u64, transactional: bool, prefix: String, content: Vec<u8>) -> ReplicationEvent {
    ReplicationEvent::Message {
        transactional,
        lsn: Lsn(lsn),
        prefix,
        content: Bytes::from(content),
    }
}

fn keepalive(wal_end: u64) -> ReplicationEvent {
    ReplicationEvent::KeepAlive {
        wal_end: Lsn(wal_end),
        reply_requested: false,
        server_time_micros: 0,
    }
}

fn assembler() -> Assembler {
    Assembler::new(&tables(), 100)
}

fn committed(step: Step) -> Committed {
    match step {
        Step::Committed(c) => c,
        other => panic!("not a commit: {other:?}"),
    }
}

fn received(stream: &mut Assembler, messages: Vec<ReplicationEvent>) {
    for m in messages {
        let step = stream.receive(m);
        assert!(matches!(step, Step::Received), "{step:?}");
    }
}

#[test]
fn a_transaction_joins_the_batch_at_its_commit_whole_and_in_stream_order() {
    let mut stream = assembler();
    open(&mut stream, 7, 300);
    received(&mut stream, vec![insert(100, 1, "a"), insert(110, 2, "b")]);
    assert!(stream.in_transaction());
    assert!(!stream.gathered(), "nothing before the commit");
    let done = committed(stream.receive(commit(300)));
    assert!(!done.batch_full);
    assert_eq!(done.streamed, Some(super::pg_time(0)));
    assert!(!stream.in_transaction());
    let (events, end) = stream.take_batch();
    assert_eq!(end, Some(Lsn(300)));
    let ids: Vec<(i64, u64, u32, bool)> = events
        .iter()
        .map(|e| (e.row.id, e.seq, e.xid, e.in_table))
        .collect();
    assert_eq!(ids, [(1, 1, 7, true), (2, 2, 7, true)]);
    assert_eq!(events[1].position.commit_lsn, 300);
    assert_eq!(events[1].position.change_lsn, 110);
    assert!(!stream.gathered());
}

#[test]
fn rows_deleted_in_their_transaction_are_not_in_the_table_at_its_commit() {
    let mut stream = assembler();
    open(&mut stream, 8, 400);
    received(
        &mut stream,
        vec![insert(100, 5, "a"), insert(110, 6, "a"), delete(120, 5)],
    );
    committed(stream.receive(commit(400)));
    let (events, _) = stream.take_batch();
    let in_table: Vec<(i64, bool)> = events.iter().map(|e| (e.row.id, e.in_table)).collect();
    assert_eq!(in_table, [(5, false), (6, true)]);
}

#[test]
fn table_less_events_are_read_from_transactional_messages_of_the_outbox_prefix() {
    let mut stream = assembler();
    let id = uuid::Uuid::now_v7();
    let event = Event::new("order", "9", "Shipped").event_id(id);
    let content = WalEvent::encode(&event);
    let prefix = outbox::wal::prefix(&tables());
    open(&mut stream, 9, 500);
    received(
        &mut stream,
        vec![
            message(100, true, prefix.clone(), content.clone()),
            message(110, true, "someone-else".into(), content),
        ],
    );
    committed(stream.receive(commit(500)));
    let (events, _) = stream.take_batch();
    assert_eq!(events.len(), 1, "only the outbox's prefix");
    assert_eq!(events[0].row.event_id, id);
    assert!(!events[0].in_table);
    assert_eq!(events[0].row.id, 0);
}

#[test]
fn the_relays_own_writes_are_not_events() {
    let mut stream = assembler();
    open(&mut stream, 10, 600);
    received(
        &mut stream,
        vec![
            insert(100, 11, "a"),
            message(105, true, relay_write_prefix(&tables()), Vec::new()),
        ],
    );
    let done = committed(stream.receive(commit(600)));
    assert_eq!(done.streamed, None);
    let (events, end) = stream.take_batch();
    assert!(events.is_empty());
    assert_eq!(
        end,
        Some(Lsn(600)),
        "its position is confirmed all the same"
    );
}

#[test]
fn the_stream_is_idle_only_between_transactions_with_nothing_gathered() {
    let mut stream = assembler();
    let heartbeat = |lsn| message(lsn, false, heartbeat_prefix(&tables()), Vec::new());
    assert!(matches!(stream.receive(keepalive(50)), Step::Idle(Lsn(50))));
    assert!(matches!(stream.receive(heartbeat(60)), Step::Idle(Lsn(60))));
    open(&mut stream, 11, 700);
    assert!(matches!(stream.receive(keepalive(70)), Step::Received));
    assert!(matches!(stream.receive(heartbeat(80)), Step::Received));
    committed(stream.receive(commit(700)));
    assert!(
        matches!(stream.receive(keepalive(710)), Step::Received),
        "a committed transaction is gathered"
    );
    stream.take_batch();
    assert!(matches!(
        stream.receive(keepalive(720)),
        Step::Idle(Lsn(720))
    ));
    assert!(
        matches!(
            stream.receive(message(730, true, heartbeat_prefix(&tables()), Vec::new())),
            Step::Received
        ),
        "a transactional heartbeat is none"
    );
}

#[test]
fn a_large_transaction_is_handed_out_in_chunks_before_its_commit() {
    let mut stream = assembler();
    open(&mut stream, 12, 900);
    for id in 1..=3 {
        received(&mut stream, vec![insert(100 + id as u64, id, "a")]);
    }
    assert!(stream.take_chunk(4).is_none());
    received(&mut stream, vec![insert(104, 4, "a")]);
    let chunk = stream.take_chunk(4).unwrap();
    assert_eq!(
        chunk.iter().map(|e| e.row.id).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    assert!(stream.take_chunk(4).is_none(), "taken");
    stream
        .chunk_work()
        .unwrap()
        .published
        .extend([(1, 12), (2, 12)]);
    received(&mut stream, vec![insert(105, 5, "a"), delete(106, 2)]);
    let done = committed(stream.receive(commit(900)));
    assert_eq!(
        done.published,
        [(1, 12)],
        "a published row deleted at the commit is not marked"
    );
    let (events, _) = stream.take_batch();
    assert_eq!(events.iter().map(|e| e.row.id).collect::<Vec<_>>(), [5]);
    assert!(stream.chunk_work().is_none());
}

/// A table-less event of 24 MiB of payload, at `lsn`.
fn large_event(lsn: u64) -> ReplicationEvent {
    let event = Event::new("order", "big", "Scanned").payload(vec![b'x'; 24 << 20], "text/plain");
    message(
        lsn,
        true,
        outbox::wal::prefix(&tables()),
        WalEvent::encode(&event),
    )
}

#[test]
fn a_transaction_and_a_batch_are_bounded_at_64_mib_whatever_their_event_count() {
    let mut stream = assembler();
    open(&mut stream, 21, 2000);
    received(&mut stream, vec![large_event(100), large_event(110)]);
    assert!(
        stream.take_chunk(100).is_none(),
        "48 MiB is under the bound"
    );
    received(&mut stream, vec![large_event(120)]);
    let chunk = stream.take_chunk(100).expect("72 MiB is over the bound");
    assert_eq!(chunk.len(), 3);
    committed(stream.receive(commit(2000)));
    stream.take_batch();
    open(&mut stream, 22, 2100);
    received(&mut stream, vec![large_event(2010), large_event(2020)]);
    assert!(!committed(stream.receive(commit(2100))).batch_full);
    open(&mut stream, 23, 2200);
    received(&mut stream, vec![large_event(2110)]);
    assert!(
        committed(stream.receive(commit(2200))).batch_full,
        "three events of 24 MiB fill a batch of 100"
    );
}

#[test]
fn a_batch_is_full_at_its_event_bound() {
    let mut stream = Assembler::new(&tables(), 2);
    open(&mut stream, 13, 1000);
    received(&mut stream, vec![insert(100, 1, "a")]);
    assert!(!committed(stream.receive(commit(1000))).batch_full);
    open(&mut stream, 14, 1100);
    received(&mut stream, vec![insert(1010, 2, "b")]);
    assert!(committed(stream.receive(commit(1100))).batch_full);
}

#[test]
fn rows_of_other_tables_unreadable_rows_and_broken_messages_are_told_apart() {
    let mut stream = Assembler::new(&tables(), 100);
    received(
        &mut stream,
        vec![begin(15, 1200), relation("other", "events")],
    );
    received(&mut stream, vec![insert(100, 1, "a")]);
    committed(stream.receive(commit(1200)));
    assert!(stream.take_batch().0.is_empty(), "another table's rows");

    let mut stream = assembler();
    assert!(
        matches!(stream.receive(insert(90, 1, "a")), Step::Ignored),
        "a change outside a transaction"
    );
    open(&mut stream, 16, 1300);
    let mut data = vec![b'I'];
    data.extend(RELATION.to_be_bytes());
    data.push(b'N');
    let values = [
        Some("21"),
        Some("not-a-uuid"),
        Some("order"),
        Some("a"),
        Some("T"),
        None,
        Some("x/y"),
        Some("pending"),
    ];
    tuple(&mut data, &values);
    match stream.receive(xlog(100, data)) {
        Step::Unreadable(bad) => assert_eq!(bad.id, Some(21)),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        stream.receive(xlog(110, vec![b'I', 0, 0])),
        Step::Failed(_)
    ));
}

#[test]
fn the_relays_own_writes_are_never_handed_out_in_chunks() {
    let mut stream = assembler();
    open(&mut stream, 17, 1400);
    received(
        &mut stream,
        vec![message(
            100,
            true,
            relay_write_prefix(&tables()),
            Vec::new(),
        )],
    );
    for id in 1..=4 {
        received(&mut stream, vec![insert(100 + id as u64, id, "a")]);
    }
    assert!(stream.take_chunk(4).is_none());
}

#[test]
fn a_chunk_spill_whose_row_its_transaction_deleted_is_not_in_the_table() {
    let mut stream = assembler();
    open(&mut stream, 18, 1500);
    for id in 1..=2 {
        received(&mut stream, vec![insert(100 + id as u64, id, "a")]);
    }
    let chunk = stream.take_chunk(2).unwrap();
    let work = stream.chunk_work().unwrap();
    for e in chunk {
        work.spills.push((e, None));
    }
    received(&mut stream, vec![delete(110, 2)]);
    let done = committed(stream.receive(commit(1500)));
    let in_table: Vec<(i64, bool)> = done
        .spills
        .iter()
        .map(|(e, _)| (e.row.id, e.in_table))
        .collect();
    assert_eq!(in_table, [(1, true), (2, false)]);
}

#[test]
fn events_are_numbered_across_transactions() {
    let mut stream = assembler();
    open(&mut stream, 19, 1600);
    received(&mut stream, vec![insert(100, 1, "a"), insert(101, 2, "b")]);
    committed(stream.receive(commit(1600)));
    open(&mut stream, 20, 1700);
    received(&mut stream, vec![insert(1610, 3, "a")]);
    committed(stream.receive(commit(1700)));
    let (events, _) = stream.take_batch();
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
}

#[test]
fn a_transaction_published_all_in_chunks_is_unconfirmed_from_its_commit() {
    let mut stream = assembler();
    open(&mut stream, 21, 1800);
    received(&mut stream, vec![insert(100, 1, "a"), insert(101, 2, "a")]);
    stream.take_chunk(2).unwrap();
    let done = committed(stream.receive(commit(1800)));
    assert_eq!(done.streamed, Some(super::pg_time(0)));
}
