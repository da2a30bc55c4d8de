//! A CDC relay that loses its leases in the middle of its work, against the logical PostgreSQL
//! and NATS: whatever it did under the lost leases, nothing is confirmed past an event it did not
//! publish, and it does not go round republishing under leases it no longer holds.

mod common;

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use futures::future::BoxFuture;

use common::cdc::{cdc_config, cdc_db, outbox_on, start, write, Counting, WAIT};
use outbox::postgres::{cdc, WriteMode};
use outbox_relayer::{Message, PublishError, Publisher, Relay};
use outbox_testkit::{cdc_database_url, unique, wait_until, NatsReader, Report, TestDb, NATS_URL};

/// The counting NATS publisher, holding every publish while `closed` (counting those it held).
struct Gate {
    inner: Arc<Counting>,
    closed: AtomicBool,
    held: AtomicU64,
    opened: tokio::sync::Notify,
}

impl Publisher for Gate {
    fn publish<'a>(&'a self, m: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            while self.closed.load(Ordering::SeqCst) {
                let opened = self.opened.notified();
                self.held.fetch_add(1, Ordering::SeqCst);
                if !self.closed.load(Ordering::SeqCst) {
                    break;
                }
                opened.await;
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

impl Gate {
    /// A closed gate in front of `inner`, counting its publishes.
    fn closed(inner: Arc<dyn Publisher>) -> Arc<Self> {
        Arc::new(Self {
            inner: Arc::new(Counting::new(inner)),
            closed: true.into(),
            held: 0.into(),
            opened: tokio::sync::Notify::new(),
        })
    }

    /// Lets every held publish and every later one through.
    fn open(&self) {
        self.closed.store(false, Ordering::SeqCst);
        self.opened.notify_waiters();
    }
}

#[tokio::test]
async fn a_relay_that_loses_its_lease_during_catch_up_stops_it_and_catches_up_once_it_is_back() {
    let db = outbox_on(&cdc_database_url(), 2).await;
    let before = write(&db, WriteMode::Table, "old", 4, 5, 10).await;
    let names = cdc::CdcNames::for_tables(&db.tables);
    assert!(cdc::setup(&db.pool, &db.tables, &names)
        .await
        .unwrap()
        .catch_up_max_id
        .is_some());
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let gate = Gate::closed(common::nats(NATS_URL, &reader.stream).await);
    let relay = start(&db, gate.clone(), cdc_config(&db, &prefix)).await;
    wait_until("the catch-up to publish a first row", WAIT, || async {
        gate.held.load(Ordering::SeqCst) > 0
    })
    .await;
    // Another relay takes every lease for two seconds while the catch-up publishes: whatever
    // the catch-up does next is fenced off.
    leases_taken_until(&db, "2 seconds").await;
    gate.open();
    // The catch-up that lost its lease must end, not go round republishing rows it can no
    // longer mark: only then can the relay take the leases back, catch up again under them,
    // finish and stream.
    let catch_up_done = db
        .tables
        .render("SELECT catch_up_max_id IS NULL FROM {schema}.cdc_slots WHERE slot = $1");
    wait_until("the catch-up to finish under new leases", WAIT, || async {
        sqlx::query_scalar::<_, bool>(&catch_up_done)
            .bind(names.slot.as_str())
            .fetch_one(&db.pool)
            .await
            .unwrap()
    })
    .await;
    let after = write(&db, WriteMode::Table, "new", 4, 5, 10).await;
    let got = reader.wait_for(before + after, WAIT).await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();
    let report = Report::of(&got);
    assert_eq!(report.unique, before + after);
    assert_eq!(report.order_violations, 0);
    // Each old row: once by the catch-up that lost its lease, once by the one under the new
    // leases, and at most once more by a session under the view of a renewal that was under way
    // at the takeover. A relay going round under leases it has lost republishes them each
    // round (36 rounds in half a second before this was fixed).
    let most = gate.inner.published.lock().unwrap().values().copied().max();
    assert!(most <= Some(3), "an event was published {most:?} times");
    reader.cleanup().await;
}

/// Takes every lease of `db`'s outbox for another relay until `until` (an SQL interval from
/// now, possibly negative): whatever the relay does next under its old leases is fenced off.
async fn leases_taken_until(db: &TestDb, until: &str) {
    sqlx::query(&db.tables.render(&format!(
        "UPDATE {{schema}}.leases SET owner = 'thief', epoch = epoch + 1, \
         expires_at = now() + interval '{until}'"
    )))
    .execute(&db.pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn a_lane_stopped_by_a_lapsed_lease_is_not_confirmed_past() {
    // One aggregate, two events, one zero-growth transaction: once streamed, the slot is the
    // only place the events exist. The relay publishes the first and is stopped while that
    // publish is held; meanwhile its leases are taken, so its lane skips the second. The stop
    // confirms what it finished: it must not confirm the transaction, or the second event is
    // gone for good.
    let db = cdc_db(1).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let gate = Gate::closed(common::nats(NATS_URL, &reader.stream).await);
    let mut config = cdc_config(&db, &prefix);
    // Leases long enough that the held publish outlives neither its timeout nor its lease:
    // what ends the lane is the renewal that finds the leases taken.
    config.lease_ttl = Duration::from_secs(20);
    config.publish_timeout = Duration::from_secs(30);
    let relay = Relay::builder(db.pool.clone(), gate.clone(), config.clone())
        .replication_url(&db.url)
        .build()
        .await
        .unwrap();
    let metrics = relay.metrics();
    let relay = relay.spawn();
    wait_until("the relay to hold its lease", WAIT, || async {
        metrics.partitions_owned.get() == 1
    })
    .await;
    let n = write(&db, WriteMode::ZeroGrowth, "order", 1, 2, 2).await;
    wait_until("the first event's publish to be held", WAIT, || async {
        gate.held.load(Ordering::SeqCst) > 0
    })
    .await;
    let stopping = tokio::spawn(relay.shutdown());
    leases_taken_until(&db, "1 hour").await;
    wait_until("the renewal to drop the taken lease", WAIT, || async {
        metrics.partitions_owned.get() == 0
    })
    .await;
    gate.open();
    stopping.await.unwrap().unwrap();
    let first_run: u32 = gate.inner.published.lock().unwrap().values().sum();
    assert_eq!(first_run, 1, "the lane stopped after the first event");
    // The leases are free again: a new relay streams from the slot's confirmed position.
    leases_taken_until(&db, "-1 second").await;
    let relay = start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        cdc_config(&db, &prefix),
    )
    .await;
    let got = reader.wait_for(n, WAIT).await;
    relay.shutdown().await.unwrap();
    let report = Report::of(&got);
    assert_eq!(report.unique, n, "{report:?}");
    assert_eq!(report.order_violations, 0);
    reader.cleanup().await;
}
