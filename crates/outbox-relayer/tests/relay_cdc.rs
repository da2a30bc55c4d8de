//! The CDC relay (`mode = "cdc"`) against a real PostgreSQL with `wal_level = logical` (the
//! private server of `scripts/tools/pg_cdc.sh`) and NATS JetStream: the polling relay's
//! guarantee tests in CDC mode, in the three write modes.

mod common;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::future::BoxFuture;

use common::cdc::{
    cdc_config, cdc_db, outbox_on, rows, slot_caught_up, start, with_slot, write, Counting, WAIT,
};
use outbox::{
    postgres::{cdc, MigrateOptions, WriteMode},
    Event, Outbox,
};
use outbox_relayer::{Message, PublishError, Publisher, RelayHandle};
use outbox_testkit::{
    cdc_database_url, unique, wait_until, NatsReader, NatsServer, PrivatePostgres, Report, TestDb,
    NATS_URL,
};

/// A CDC outbox with its slot, a JetStream stream of the test's own, and a CDC relay.
struct Streaming {
    db: TestDb,
    reader: NatsReader,
    relay: RelayHandle,
}

async fn streaming(partitions: i32) -> Streaming {
    streaming_on(cdc_db(partitions).await).await
}

/// A JetStream stream of the test's own and a CDC relay on `db`, which has its slot.
async fn streaming_on(db: TestDb) -> Streaming {
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let relay = start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        cdc_config(&db, &prefix),
    )
    .await;
    Streaming { db, reader, relay }
}

#[tokio::test]
async fn streams_committed_rows_in_order_and_nothing_rolled_back() {
    let Streaming { db, reader, relay } = streaming(8).await;

    let outbox = db.outbox();
    let mut tx = db.pool.begin().await.unwrap();
    outbox
        .enqueue(&mut tx, &Event::new("order", "x", "RolledBack"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let n = write(&db, WriteMode::Table, "order", 20, 10, 7).await;

    let got = reader.wait_for(n, WAIT).await;
    common::drained(&db, WAIT).await;
    slot_caught_up(&db).await;
    relay.shutdown().await.unwrap();
    let report = Report::of(&got);
    assert_eq!(report.unique, n);
    assert_eq!(report.order_violations, 0);
    assert!(got.iter().all(|d| d.headers["event-type"] != "RolledBack"));
    assert_eq!(
        db.count("published").await,
        n as i64,
        "every row marked published"
    );
    reader.cleanup().await;
}

#[tokio::test]
async fn a_transaction_that_commits_late_is_published() {
    let Streaming { db, reader, relay } = streaming(4).await;
    let outbox = db.outbox();
    // The late transaction takes its id first, then commits after later ones.
    let mut late = db.pool.begin().await.unwrap();
    outbox
        .enqueue(&mut late, &Event::new("late", "1", "Late"))
        .await
        .unwrap();
    let n = write(&db, WriteMode::Table, "early", 5, 4, 5).await;
    reader.wait_for(n, WAIT).await;
    late.commit().await.unwrap();
    let got = reader.wait_for(n + 1, WAIT).await;
    relay.shutdown().await.unwrap();
    assert!(got.iter().any(|d| d.aggregate_type == "late"));
    reader.cleanup().await;
}

#[tokio::test]
async fn zero_growth_and_table_less_writes_leave_the_table_empty() {
    let Streaming { db, reader, relay } = streaming(4).await;
    let a = write(&db, WriteMode::ZeroGrowth, "zero", 10, 10, 9).await
        // Transactions larger than a batch (1500 events each).
        + write(&db, WriteMode::ZeroGrowth, "bulk", 300, 10, 1500).await;
    let b = write(&db, WriteMode::WalOnly, "wal", 10, 10, 9).await;
    // A table-less event written by hand, as another language would.
    sqlx::query("SELECT pg_logical_emit_message(true, $1, $2::text)")
        .bind(outbox::wal::prefix(&db.tables))
        .bind(format!(
            r#"{{"v":1,"event_id":"{}","aggregate_type":"sql","aggregate_id":"1","event_type":"Written","payload":"{{\"ok\":true}}"}}"#,
            uuid::Uuid::now_v7()
        ))
        .execute(&db.pool)
        .await
        .unwrap();
    let got = reader.wait_for(a + b + 1, WAIT).await;
    slot_caught_up(&db).await;
    relay.shutdown().await.unwrap();
    let report = Report::of(&got);
    assert_eq!(report.unique, a + b + 1);
    assert_eq!(report.order_violations, 0);
    let by_hand = got.iter().find(|d| d.aggregate_type == "sql").unwrap();
    assert_eq!(by_hand.payload, br#"{"ok":true}"#);
    assert_eq!(
        rows(&db).await,
        0,
        "zero-growth and table-less modes keep no rows"
    );
    reader.cleanup().await;
}

/// Sequential scans of the events table so far, as the statistics system has them.
async fn seq_scans(db: &TestDb, conn: &mut sqlx::PgConnection) -> i64 {
    // Pending statistics of this session reach the shared ones at its next transaction end.
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_scalar(
        "SELECT seq_scan FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2",
    )
    .bind(db.tables.schema().as_str())
    .bind(db.tables.events().as_str())
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

#[tokio::test]
async fn zero_growth_writes_find_their_rows_by_index_on_a_never_analysed_table() {
    // The table has never been analysed (as where autovacuum is off): left to itself, the
    // planner caches a sequential scan for the write's DELETE after five calls, and each
    // write then reads every dead tuple of the table.
    let db = cdc_db(4).await;
    let outbox = db.outbox().write_mode(WriteMode::ZeroGrowth);
    let mut conn = db.pool.acquire().await.unwrap();
    let before = seq_scans(&db, &mut conn).await;
    for i in 0..30 {
        let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
        let event = Event::new("zero", format!("a{i}"), "Happened")
            .json(&serde_json::json!({ "i": i }))
            .unwrap();
        outbox.enqueue(&mut tx, &event).await.unwrap();
        tx.commit().await.unwrap();
    }
    let after = seq_scans(&db, &mut conn).await;
    assert_eq!(rows(&db).await, 0, "every zero-growth row deleted");
    assert_eq!(
        after - before,
        0,
        "30 zero-growth writes scanned the events table sequentially"
    );
}

#[tokio::test]
async fn a_killed_streamer_is_replaced_by_its_standby_and_nothing_is_lost() {
    let db = cdc_db(8).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let publisher = common::nats(NATS_URL, &reader.stream).await;
    let first = start(&db, publisher.clone(), cdc_config(&db, &prefix)).await;
    let standby = start(&db, publisher.clone(), cdc_config(&db, &prefix)).await;
    let writer = {
        let pool = db.pool.clone();
        let tables = db.tables.clone();
        tokio::spawn(async move {
            let db = TestDb::adopt(pool, tables);
            let mut n = 0;
            for round in 0..10 {
                n += write(&db, WriteMode::ZeroGrowth, &format!("k{round}"), 30, 5, 25).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            n
        })
    };
    reader.wait_for(200, WAIT).await;
    // Whichever streams dies abruptly: the other takes the leases once they expire.
    first.abort();
    let n = writer.await.unwrap();
    let got = reader.wait_for(n, WAIT).await;
    slot_caught_up(&db).await;
    standby.shutdown().await.unwrap();
    let report = Report::of(&got);
    assert_eq!(report.unique, n, "no event lost across the takeover");
    assert_eq!(report.order_violations, 0);
    eprintln!("cdc takeover: {n} events, {} duplicates", report.duplicates);
    reader.cleanup().await;
}

#[tokio::test]
async fn a_relay_stopped_then_restarted_resumes_where_it_confirmed() {
    let db = cdc_db(4).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    // Counted before the broker: JetStream would drop a second publish of an event id, and
    // the stream would not show it.
    let publisher = Arc::new(Counting::new(common::nats(NATS_URL, &reader.stream).await));
    let relay = start(&db, publisher.clone(), cdc_config(&db, &prefix)).await;
    let a = write(&db, WriteMode::WalOnly, "before", 10, 5, 10).await;
    reader.wait_for(a, WAIT).await;
    // Stopped at once: the stop itself reports the confirmed position to the server.
    relay.shutdown().await.unwrap();
    // Written while no relay runs: kept by the slot.
    let b = write(&db, WriteMode::WalOnly, "after", 10, 5, 10).await;
    let relay = start(&db, publisher.clone(), cdc_config(&db, &prefix)).await;
    let got = reader.wait_for(a + b, WAIT).await;
    slot_caught_up(&db).await;
    relay.shutdown().await.unwrap();
    let report = Report::of(&got);
    assert_eq!(report.unique, a + b);
    let (published, again) = {
        let published = publisher.published.lock().unwrap();
        (
            published.len(),
            published.values().filter(|n| **n > 1).count(),
        )
    };
    assert_eq!(
        (published, again),
        (a + b, 0),
        "a clean stop confirms everything it published: the next relay publishes none of it again"
    );
    reader.cleanup().await;
}

#[tokio::test]
async fn rows_written_before_the_slot_are_caught_up_from_the_table() {
    let db = outbox_on(&cdc_database_url(), 4).await;
    let before = write(&db, WriteMode::Table, "old", 5, 4, 10).await;
    let setup = cdc::setup(&db.pool, &db.tables, &cdc::CdcNames::for_tables(&db.tables))
        .await
        .unwrap();
    assert!(setup.created_slot && setup.catch_up_max_id.is_some());
    let Streaming { db, reader, relay } = streaming_on(db).await;
    let after = write(&db, WriteMode::Table, "new", 5, 4, 10).await;
    let got = reader.wait_for(before + after, WAIT).await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();
    let report = Report::of(&got);
    assert_eq!(report.unique, before + after);
    assert_eq!(report.order_violations, 0);
    reader.cleanup().await;
}

#[tokio::test]
async fn without_a_live_slot_zero_growth_and_table_less_writes_keep_rows_and_lose_nothing() {
    let db = outbox_on(&cdc_database_url(), 2).await;
    // No slot yet: nothing would stream these, so they stay in the table.
    let zero = write(&db, WriteMode::ZeroGrowth, "zero", 3, 2, 2).await;
    let wal = write(&db, WriteMode::WalOnly, "wal", 3, 2, 2).await;
    assert_eq!(rows(&db).await as usize, zero + wal);
    // A recorded slot that was dropped behind the outbox's back is no live slot either.
    let names = cdc::CdcNames::for_tables(&db.tables);
    cdc::setup(&db.pool, &db.tables, &names).await.unwrap();
    sqlx::query("SELECT pg_drop_replication_slot($1)")
        .bind(names.slot.as_str())
        .execute(&db.pool)
        .await
        .unwrap();
    let dropped = write(&db, WriteMode::ZeroGrowth, "dropped", 2, 2, 4).await;
    assert_eq!(rows(&db).await as usize, zero + wal + dropped);
    // Set up again (as after a lost slot: `outbox migrate --cdc` recreates it), the relay
    // catches every kept row up from the table and streams what follows; zero-growth writes
    // now leave nothing behind.
    assert!(
        cdc::setup(&db.pool, &db.tables, &names)
            .await
            .unwrap()
            .created_slot
    );
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let relay = start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        cdc_config(&db, &prefix),
    )
    .await;
    let streamed = write(&db, WriteMode::ZeroGrowth, "streamed", 2, 2, 4).await;
    let total = zero + wal + dropped + streamed;
    all_once_in_order(&db, &reader, relay, total).await;
    assert_eq!(
        rows(&db).await as usize,
        zero + wal + dropped,
        "streamed rows deleted"
    );
    reader.cleanup().await;
}

/// Waits for `total` events on `reader` and for the outbox to drain, stops `relay`, and checks
/// that every event arrived once, in order.
async fn all_once_in_order(db: &TestDb, reader: &NatsReader, relay: RelayHandle, total: usize) {
    let got = reader.wait_for(total, WAIT).await;
    common::drained(db, WAIT).await;
    relay.shutdown().await.unwrap();
    let report = Report::of(&got);
    assert_eq!(report.unique, total, "{report:?}");
    assert_eq!(report.order_violations, 0, "{report:?}");
}

/// The slot's `wal_status` (`None`: no such slot).
async fn wal_status(db: &TestDb, slot: &str) -> Option<String> {
    sqlx::query_scalar::<_, Option<String>>(
        "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(&db.pool)
    .await
    .unwrap()
    .flatten()
}

#[tokio::test]
async fn a_slot_invalidated_by_max_slot_wal_keep_size_is_made_again_and_loses_nothing() {
    // A server of the test's own: a slot may keep 1 MB of WAL.
    let server =
        PrivatePostgres::start_with(&["wal_level=logical", "max_slot_wal_keep_size=1"]).await;
    let db = with_slot(outbox_on(&server.url(), 2).await).await;
    let names = cdc::CdcNames::for_tables(&db.tables);
    let Streaming { db, reader, relay } = streaming_on(db).await;
    let streamed = write(&db, WriteMode::Table, "streamed", 3, 2, 2).await;
    reader.wait_for(streamed, WAIT).await;
    relay.shutdown().await.unwrap();

    // The relay is down: rows are written, and WAL past the slot's limit is removed.
    let before = write(&db, WriteMode::Table, "before", 3, 2, 2).await;
    wait_until("the slot to be lost", WAIT, || async {
        for statement in [
            "SELECT pg_logical_emit_message(false, 'filler', repeat('x', 100000))",
            "SELECT pg_switch_wal()",
            "CHECKPOINT",
        ] {
            sqlx::query(statement).execute(&db.pool).await.unwrap();
        }
        wal_status(&db, names.slot.as_str()).await.as_deref() == Some("lost")
    })
    .await;
    // Zero-growth writes see no live slot: they keep their rows.
    let meanwhile = write(&db, WriteMode::ZeroGrowth, "meanwhile", 3, 2, 2).await;

    // `outbox migrate --cdc` again: the lost slot is dropped and made anew.
    let setup = cdc::setup(&db.pool, &db.tables, &names).await.unwrap();
    assert!(setup.created_slot, "{setup:?}");
    assert_eq!(
        wal_status(&db, names.slot.as_str()).await.as_deref(),
        Some("reserved")
    );
    let relay = start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        cdc_config(&db, &reader.prefix),
    )
    .await;
    let after = write(&db, WriteMode::ZeroGrowth, "after", 3, 2, 2).await;
    let total = streamed + before + meanwhile + after;
    all_once_in_order(&db, &reader, relay, total).await;
    reader.cleanup().await;
    drop(db);
    drop(server);
}

#[tokio::test]
async fn a_permanent_failure_dead_letters_keeps_the_event_and_parks_only_its_aggregate() {
    let db = cdc_db(4).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let mut config = cdc_config(&db, &prefix);
    config.max_payload_bytes = Some(1000);
    let relay = start(&db, common::nats(NATS_URL, &reader.stream).await, config).await;
    let outbox = db.outbox().write_mode(WriteMode::WalOnly);
    let big = vec![b'x'; 5000];
    let mut tx = db.pool.begin().await.unwrap();
    outbox
        .enqueue_batch(
            &mut tx,
            &[
                Event::new("bad", "1", "Big")
                    .payload(big.clone(), "text/plain")
                    .aggregate_version(1),
                Event::new("bad", "1", "After").aggregate_version(2),
            ],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let good = write(&db, WriteMode::WalOnly, "good", 5, 4, 5).await;
    reader.wait_for(good, WAIT).await;
    wait_until("the big event to be dead-lettered", WAIT, || async {
        db.count("dead").await == 1
    })
    .await;
    let (error, payload): (String, Vec<u8>) = sqlx::query_as(
        &db.tables
            .render("SELECT last_error, payload FROM {schema}.{events} WHERE status = 'dead'"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(error.contains("over the limit of 1000 bytes"), "{error}");
    assert_eq!(payload, big, "the dead letter keeps its payload");
    assert_eq!(
        db.count("pending").await,
        1,
        "the later event waits behind its dead head"
    );
    assert!(reader
        .deliveries()
        .iter()
        .all(|d| d.aggregate_type != "bad"));

    // An operator skips the dead head: the parked event goes out, from the table.
    let dead_id: i64 = sqlx::query_scalar(
        &db.tables
            .render("SELECT id FROM {schema}.{events} WHERE status = 'dead'"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    outbox_relayer::admin::Admin::new(db.pool.clone(), &db.tables)
        .skip(&[dead_id], "test", "too big")
        .await
        .unwrap();
    let got = reader.wait_for(good + 1, WAIT).await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();
    assert!(got
        .iter()
        .any(|d| d.aggregate_type == "bad" && d.headers["event-type"] == "After"));
    reader.cleanup().await;
}

#[tokio::test]
async fn a_broker_restarted_mid_stream_loses_and_dead_letters_nothing() {
    let mut nats = NatsServer::start().await;
    let db = cdc_db(4).await;
    let prefix = unique("p");
    let reader_name = unique("S");
    let reader = NatsReader::start(&nats.url(), &reader_name, &prefix).await;
    let relay = start(
        &db,
        common::nats(&nats.url(), &reader.stream).await,
        cdc_config(&db, &prefix),
    )
    .await;
    let a = write(&db, WriteMode::ZeroGrowth, "one", 10, 3, 10).await;
    reader.wait_for(a, WAIT).await;
    // The stream is on the server's disk: a new reader after the restart reads it all.
    let first_reader = reader;
    nats.stop();
    let b = write(&db, WriteMode::ZeroGrowth, "two", 10, 3, 10).await;
    nats.restart().await;
    let reader = NatsReader::start(&nats.url(), &reader_name, &prefix).await;
    let got = reader.wait_for(a + b, WAIT).await;
    slot_caught_up(&db).await;
    relay.shutdown().await.unwrap();
    let report = Report::of(&got);
    assert_eq!(report.unique, a + b);
    assert_eq!(report.order_violations, 0);
    assert_eq!(db.count("dead").await, 0, "an outage dead-letters nothing");
    drop(first_reader);
    reader.cleanup().await;
    nats.stop();
}

#[tokio::test]
async fn postgres_restarted_mid_stream_loses_nothing() {
    let mut pg = PrivatePostgres::start_with(&[
        "wal_level=logical",
        "max_replication_slots=8",
        "max_wal_senders=8",
    ])
    .await;
    let db = with_slot(outbox_on(&pg.url(), 4).await).await;
    let Streaming { db, reader, relay } = streaming_on(db).await;
    let a = write(&db, WriteMode::Table, "before", 20, 5, 20).await;
    reader.wait_for(a / 2, WAIT).await;
    // A crash (SIGKILL of the whole server), then crash recovery.
    pg.crash();
    pg.start_again().await;
    // The pool reconnects on demand; the relay reconnects its stream by itself.
    let b = write_retrying(&db, "after", 20, 5).await;
    let got = reader.wait_for(a + b, WAIT).await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();
    let report = Report::of(&got);
    assert_eq!(
        report.unique,
        a + b,
        "nothing lost across the database restart"
    );
    assert_eq!(report.order_violations, 0);
    eprintln!(
        "cdc, PostgreSQL crashed mid-stream: {} events, {} duplicates",
        a + b,
        report.duplicates
    );
    reader.cleanup().await;
    drop(db);
}

/// Like [`write`] in table mode, one transaction per version, retrying while the restarted
/// server does not answer yet.
async fn write_retrying(db: &TestDb, kind: &str, aggregates: usize, per_aggregate: i64) -> usize {
    let outbox = db.outbox();
    let mut n = 0;
    for version in 1..=per_aggregate {
        let events: Vec<Event> = (0..aggregates)
            .map(|a| Event::new(kind, format!("a{a}"), "Happened").aggregate_version(version))
            .collect();
        wait_until("a write to succeed", WAIT, || async {
            let Ok(mut tx) = db.pool.begin().await else {
                return false;
            };
            outbox.enqueue_batch(&mut tx, &events).await.is_ok() && tx.commit().await.is_ok()
        })
        .await;
        n += events.len();
    }
    n
}

/// The real NATS publisher, failing (transiently) the first `attempts` publishes of every
/// event of aggregate `a1`.
struct FailingAggregate {
    inner: Arc<dyn Publisher>,
    attempts: u32,
    seen: Mutex<HashMap<uuid::Uuid, u32>>,
}

impl Publisher for FailingAggregate {
    fn publish<'a>(&'a self, m: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            if m.aggregate_id == "a1" {
                let mut seen = self.seen.lock().unwrap();
                let n = seen.entry(m.event_id).or_default();
                *n += 1;
                if *n <= self.attempts {
                    return Err(PublishError::transient("injected: a1 not acknowledged"));
                }
            }
            self.inner.publish(m).await
        })
    }
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn max_payload_bytes(&self) -> usize {
        self.inner.max_payload_bytes()
    }
}

#[tokio::test]
async fn batches_in_flight_keep_each_aggregate_in_order_while_one_fails_into_the_table() {
    let db = Arc::new(cdc_db(4).await);
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let failing = Arc::new(FailingAggregate {
        inner: common::nats(NATS_URL, &reader.stream).await,
        // More than the in-place rounds: a1's events go through the table path.
        attempts: 5,
        seen: Mutex::new(HashMap::new()),
    });
    let relay = start(&db, failing.clone(), cdc_config(&db, &prefix)).await;
    // Four writers of small transactions at once (many batches in flight), in every write
    // mode, over aggregates a0..a5.
    let writers: Vec<_> = [
        (WriteMode::Table, "t"),
        (WriteMode::ZeroGrowth, "z"),
        (WriteMode::WalOnly, "w"),
        (WriteMode::Table, "u"),
    ]
    .into_iter()
    .map(|(mode, kind)| {
        let db = db.clone();
        tokio::spawn(async move { write(&db, mode, kind, 6, 15, 2).await })
    })
    .collect();
    let mut total = 0;
    for w in writers {
        total += w.await.unwrap();
    }
    let got = reader.wait_for(total, WAIT).await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();
    let report = Report::of(&got);
    assert_eq!(report.unique, total, "{report:?}");
    assert_eq!(report.order_violations, 0, "{report:?}");
    assert!(
        failing.seen.lock().unwrap().values().all(|n| *n > 5),
        "every a1 event failed its first attempts, then went out"
    );
    reader.cleanup().await;
}

#[tokio::test]
async fn a_time_partitioned_outbox_streams_in_all_three_write_modes() {
    // The publication publishes through the partitioned root: the stream names the events
    // table whichever daily partition a row lands in.
    let db = TestDb::on(
        &cdc_database_url(),
        MigrateOptions {
            partitions: Some(4),
            time_partition_days: Some(1),
        },
    )
    .await;
    let Streaming { db, reader, relay } = streaming_on(with_slot(db).await).await;
    let table = write(&db, WriteMode::Table, "kept", 5, 6, 7).await;
    let zero = write(&db, WriteMode::ZeroGrowth, "zero", 5, 6, 7).await;
    let wal = write(&db, WriteMode::WalOnly, "wal", 5, 6, 7).await;
    let got = reader.wait_for(table + zero + wal, WAIT).await;
    common::drained(&db, WAIT).await;
    slot_caught_up(&db).await;
    relay.shutdown().await.unwrap();
    let report = Report::of(&got);
    assert_eq!(report.unique, table + zero + wal);
    assert_eq!(report.order_violations, 0);
    assert_eq!(
        db.count("published").await as usize,
        table,
        "only the table-mode rows stay, marked published"
    );
    assert_eq!(rows(&db).await as usize, table);
    reader.cleanup().await;
}
