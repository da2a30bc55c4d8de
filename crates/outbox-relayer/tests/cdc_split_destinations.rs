//! One aggregate whose events go to two destinations, one of which does not answer, against
//! the CDC relay on a real PostgreSQL (`wal_level = logical`), with an in-memory broker that
//! answers as each test scripts it. The stream hands such an aggregate to the table path
//! whole: none of its events is in flight in the stream while the table path publishes it, so
//! its order holds, and none is taken for settled when the stream sends it again after a
//! restart. And a relay whose only destination never answers reads as stalled.

mod common;

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use futures::future::BoxFuture;

use common::cdc::{cdc_config, cdc_db, start, WAIT};
use outbox::{postgres::WriteMode, Event, Outbox};
use outbox_relayer::{Message, PublishError, Publisher, Relay};
use outbox_testkit::{unique, wait_until, TestDb};

/// What the broker does with one publish.
enum Answer {
    Ack,
    /// Acknowledges after a while.
    Slowly(Duration),
    /// Refuses at once (transient).
    Refuse,
    /// Never answers.
    Hang,
}

/// Decides the answer from the aggregate id, the version, the event type and how many times
/// this (aggregate, version) was published, this one included.
type Script = fn(&str, i64, &str, u32) -> Answer;

/// An in-memory broker: every acknowledged publish, in acknowledgement order.
struct Scripted {
    script: Script,
    acks: Mutex<Vec<(String, i64)>>,
    calls: Mutex<HashMap<(String, i64), u32>>,
    /// Publishes of aggregate `k` not answered yet.
    k_in_progress: AtomicUsize,
}

impl Scripted {
    fn new(script: Script) -> Arc<Self> {
        Arc::new(Self {
            script,
            acks: Mutex::default(),
            calls: Mutex::default(),
            k_in_progress: AtomicUsize::new(0),
        })
    }

    /// The versions of `k` acknowledged, in order.
    fn k_acks(&self) -> Vec<i64> {
        let acks = self.acks.lock().unwrap();
        acks.iter().filter(|a| a.0 == "k").map(|a| a.1).collect()
    }
}

/// Counts a publish of `k` in progress while it lives (a hanging one is dropped on timeout).
struct InProgress<'a>(&'a AtomicUsize);

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Publisher for Scripted {
    fn publish<'a>(&'a self, m: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            let v = m.aggregate_version.unwrap_or(0);
            let key = (m.aggregate_id.clone(), v);
            let n = {
                let mut calls = self.calls.lock().unwrap();
                let n = calls.entry(key.clone()).or_default();
                *n += 1;
                *n
            };
            let _counted = (m.aggregate_id == "k").then(|| {
                self.k_in_progress.fetch_add(1, Ordering::SeqCst);
                InProgress(&self.k_in_progress)
            });
            match (self.script)(&m.aggregate_id, v, &m.event_type, n) {
                Answer::Ack => {}
                Answer::Slowly(d) => tokio::time::sleep(d).await,
                Answer::Refuse => return Err(PublishError::transient("refused")),
                Answer::Hang => futures::future::pending::<()>().await,
            }
            self.acks.lock().unwrap().push(key);
            Ok(())
        })
    }
    fn name(&self) -> &'static str {
        "scripted"
    }
    fn max_payload_bytes(&self) -> usize {
        1 << 20
    }
}

async fn held(db: &TestDb, id: &str) -> bool {
    let n: i64 = sqlx::query_scalar(
        &db.tables
            .render("SELECT count(*) FROM {schema}.holds WHERE aggregate_id = $1"),
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    n == 1
}

async fn commit(db: &TestDb, mode: WriteMode, events: &[Event]) {
    let outbox = db.outbox().write_mode(mode);
    let mut tx = db.pool.begin().await.unwrap();
    for e in events {
        outbox.enqueue(&mut tx, e).await.unwrap();
    }
    tx.commit().await.unwrap();
}

/// Makes the `Hang` destination unanswered: `x`'s event to it times out and `x` is held.
async fn hang_destination(db: &TestDb, mode: WriteMode) {
    commit(
        db,
        mode,
        &[Event::new("t", "x", "Hang").aggregate_version(1)],
    )
    .await;
    wait_until("x to be held", WAIT, || async { held(db, "x").await }).await;
}

/// `k` v1 to the healthy destination (slow, once), v2 to the unanswered one (which answers
/// `k`), in one transaction.
fn split(aggregate: &str, v: i64, event_type: &str, n: u32) -> Answer {
    match (aggregate, v, event_type, n) {
        ("x", _, "Hang", _) => Answer::Hang,
        ("k", 1, _, 1) => Answer::Slowly(Duration::from_millis(600)),
        _ => Answer::Ack,
    }
}

async fn split_aggregate(mode: WriteMode) -> Vec<i64> {
    let db = cdc_db(1).await;
    let broker = Scripted::new(split);
    let mut config = cdc_config(&db, &unique("p"));
    config.publish_timeout = Duration::from_secs(1);
    let relay = start(&db, broker.clone(), config).await;
    hang_destination(&db, mode).await;
    commit(
        &db,
        mode,
        &[
            Event::new("t", "k", "Ok").aggregate_version(1),
            Event::new("t", "k", "Hang").aggregate_version(2),
        ],
    )
    .await;
    wait_until(
        "k v1 and v2 acknowledged, nothing of k in flight",
        WAIT,
        || async {
            let acks = broker.k_acks();
            acks.contains(&1)
                && acks.contains(&2)
                && broker.k_in_progress.load(Ordering::SeqCst) == 0
        },
    )
    .await;
    relay.shutdown().await.unwrap();
    broker.k_acks()
}

#[tokio::test]
async fn an_aggregate_split_between_two_destinations_keeps_its_order() {
    for mode in [WriteMode::ZeroGrowth, WriteMode::WalOnly, WriteMode::Table] {
        let acks = split_aggregate(mode).await;
        let first_v2 = acks.iter().position(|v| *v == 2).unwrap();
        assert!(
            !acks[first_v2..].contains(&1) && acks[..first_v2].contains(&1),
            "{mode:?}: k acknowledged as {acks:?}"
        );
    }
}

/// Every first publish of `k` gets no answer; later ones are acknowledged.
fn first_hangs(aggregate: &str, _: i64, _: &str, n: u32) -> Answer {
    match (aggregate, n) {
        ("x", _) | ("k", 1) => Answer::Hang,
        _ => Answer::Ack,
    }
}

/// The session ends while `k` v1 is in flight and v2 is in the table: the next session gets
/// v1 again from the stream, and must publish it, before v2.
async fn split_then_session_ends(mode: WriteMode) -> Vec<i64> {
    let db = cdc_db(1).await;
    let broker = Scripted::new(first_hangs);
    let mut config = cdc_config(&db, &unique("p"));
    config.publish_timeout = Duration::from_secs(3);
    config.lease_ttl = Duration::from_secs(10);
    let relay = start(&db, broker.clone(), config).await;
    hang_destination(&db, mode).await;
    commit(
        &db,
        mode,
        &[
            Event::new("t", "k", "Ok").aggregate_version(1),
            Event::new("t", "k", "Hang").aggregate_version(2),
        ],
    )
    .await;
    wait_until("k to be held", WAIT, || async { held(&db, "k").await }).await;
    let slot = outbox::postgres::cdc::CdcNames::for_tables(&db.tables).slot;
    sqlx::query(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot.as_str())
    .execute(&db.pool)
    .await
    .unwrap();
    wait_until("k v1 and v2 acknowledged", WAIT, || async {
        let acks = broker.k_acks();
        acks.contains(&1) && acks.contains(&2)
    })
    .await;
    relay.shutdown().await.unwrap();
    broker.k_acks()
}

#[tokio::test]
async fn a_split_aggregate_loses_nothing_when_the_session_ends() {
    for mode in [WriteMode::ZeroGrowth, WriteMode::WalOnly] {
        let acks = split_then_session_ends(mode).await;
        let first_v1 = acks.iter().position(|v| *v == 1).unwrap();
        let first_v2 = acks.iter().position(|v| *v == 2).unwrap();
        assert!(first_v1 < first_v2, "{mode:?}: k acknowledged as {acks:?}");
    }
}

/// `k` v1 is refused at once for its first four publishes (the stream's and its three rounds
/// in place).
fn refuse_first(aggregate: &str, v: i64, _: &str, n: u32) -> Answer {
    match (aggregate, v, n) {
        ("x", _, _) => Answer::Hang,
        ("k", 1, n) if n <= 4 => Answer::Refuse,
        _ => Answer::Ack,
    }
}

/// The same split inside a transaction published in chunks: at its commit, the aggregate's
/// events go to the table in stream order.
async fn split_in_chunk(mode: WriteMode) -> Vec<i64> {
    let db = cdc_db(1).await;
    let broker = Scripted::new(refuse_first);
    let mut config = cdc_config(&db, &unique("p"));
    config.publish_timeout = Duration::from_secs(1);
    config.cdc.max_transaction_events = 2;
    let relay = start(&db, broker.clone(), config).await;
    hang_destination(&db, mode).await;
    commit(
        &db,
        mode,
        &[
            Event::new("t", "k", "Ok").aggregate_version(1),
            Event::new("t", "k", "Hang").aggregate_version(2),
            Event::new("t", "z", "Ok").aggregate_version(1),
            Event::new("t", "z", "Ok").aggregate_version(2),
        ],
    )
    .await;
    wait_until("k v1 and v2 acknowledged", WAIT, || async {
        let acks = broker.k_acks();
        acks.contains(&1) && acks.contains(&2)
    })
    .await;
    relay.shutdown().await.unwrap();
    broker.k_acks()
}

#[tokio::test]
async fn a_split_aggregate_in_a_chunked_transaction_keeps_its_order() {
    for mode in [WriteMode::ZeroGrowth, WriteMode::WalOnly, WriteMode::Table] {
        let acks = split_in_chunk(mode).await;
        let first_v1 = acks.iter().position(|v| *v == 1).unwrap();
        let first_v2 = acks.iter().position(|v| *v == 2).unwrap();
        assert!(first_v1 < first_v2, "{mode:?}: k acknowledged as {acks:?}");
    }
}

fn hang_all(_: &str, _: i64, _: &str, _: u32) -> Answer {
    Answer::Hang
}

/// Every publish hangs: retries from the table path are not progress, and once nothing is
/// published for the stall timeout, readiness says `stalled` (G7).
#[tokio::test]
async fn a_relay_whose_destination_never_answers_reads_as_stalled() {
    let db = cdc_db(1).await;
    let broker = Scripted::new(hang_all);
    let mut config = cdc_config(&db, &unique("p"));
    config.publish_timeout = Duration::from_millis(500);
    config.stall_timeout = Duration::from_secs(3);
    let relay = Relay::builder(db.pool.clone(), broker.clone(), config)
        .replication_url(&db.url)
        .build()
        .await
        .unwrap();
    let health = relay.health();
    let relay = relay.spawn();
    commit(
        &db,
        WriteMode::Table,
        &[Event::new("t", "a", "E").aggregate_version(1)],
    )
    .await;
    wait_until("the relay to read as stalled", WAIT, || async {
        health
            .readiness()
            .is_err_and(|not_ready| not_ready.reason == "stalled")
    })
    .await;
    assert!(broker.acks.lock().unwrap().is_empty());
    relay.shutdown().await.unwrap();
}
