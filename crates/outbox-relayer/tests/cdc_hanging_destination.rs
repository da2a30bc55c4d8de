//! A destination that never answers, against the CDC relay on a real PostgreSQL
//! (`wal_level = logical`) and NATS JetStream, in the three write modes: it costs only its
//! own aggregates. The stream goes on publishing every other aggregate as fast as when it is
//! healthy (no batch waits on an acknowledgement that does not come), the hanging
//! destination's events wait in the table, and once it answers again they are delivered, in
//! order per aggregate.

mod common;

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use futures::future::BoxFuture;

use common::cdc::{cdc_config, cdc_db, start, WAIT};
use outbox::{postgres::WriteMode, Event, Outbox};
use outbox_relayer::{Message, PublishError, Publisher};
use outbox_testkit::{unique, wait_until, NatsReader, Report, TestDb, NATS_URL};

const MODES: [WriteMode; 3] = [WriteMode::Table, WriteMode::ZeroGrowth, WriteMode::WalOnly];

/// How long the relay waits for an acknowledgement. A batch that waited for the hanging
/// destination (with in-place retries, four times this per batch) could not deliver the
/// healthy events within [`HEALTHY_WITHIN`].
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(3);

/// The deadline for the healthy events: far longer than they take when nothing waits for the
/// hanging destination, far shorter than the publish timeouts of the batches they would
/// otherwise wait behind (one per written pair).
const HEALTHY_WITHIN: Duration = Duration::from_secs(20);

/// Pairs written while the destination hangs: one event for it, one healthy.
const PAIRS: i64 = 12;

/// The real NATS publisher; the events of aggregate type `slow` get no answer at all while
/// `hanging` is set (a broker or endpoint that accepts the connection and never replies).
struct Hanging {
    inner: Arc<dyn Publisher>,
    hanging: AtomicBool,
}

impl Publisher for Hanging {
    fn publish<'a>(&'a self, m: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            if m.aggregate_type == "slow" && self.hanging.load(Ordering::SeqCst) {
                futures::future::pending::<()>().await;
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

/// One event of `kind/id` at `version`, in a transaction of its own.
async fn write_one(db: &TestDb, mode: WriteMode, kind: &str, id: &str, version: i64) {
    let outbox = db.outbox().write_mode(mode);
    let mut tx = db.pool.begin().await.unwrap();
    outbox
        .enqueue(
            &mut tx,
            &Event::new(kind, id, "Happened").aggregate_version(version),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

fn of_kind(reader: &NatsReader, kind: &str) -> usize {
    reader
        .deliveries()
        .iter()
        .filter(|d| d.aggregate_type == kind)
        .map(|d| d.event_id.clone())
        .collect::<std::collections::HashSet<_>>()
        .len()
}

async fn hanging_destination_costs_only_its_own_aggregates(mode: WriteMode) {
    let db = cdc_db(4).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let hanging = Arc::new(Hanging {
        inner: common::nats(NATS_URL, &reader.stream).await,
        hanging: AtomicBool::new(true),
    });
    let mut config = cdc_config(&db, &prefix);
    config.publish_timeout = PUBLISH_TIMEOUT;
    // One batch in flight: any batch that waited for the hanging destination would hold up
    // every one behind it.
    config.max_inflight_batches = 1;
    let relay = start(&db, hanging.clone(), config).await;

    // The first event for the hanging destination: its publish times out, and its aggregate
    // goes to the table path.
    write_one(&db, mode, "slow", "s0", 1).await;
    wait_until("the first hanging event to be held", WAIT, || async {
        let held: i64 = sqlx::query_scalar(
            &db.tables
                .render("SELECT count(*) FROM {schema}.holds WHERE aggregate_type = 'slow'"),
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        held == 1
    })
    .await;

    // While it hangs: events for it (two aggregates, in order, and new ones) and healthy
    // events, each in a transaction of its own, each healthy one waited for before the next
    // pair (a batch of its own: every batch would wait behind a hanging one).
    let started = tokio::time::Instant::now();
    for i in 1..=PAIRS {
        write_one(&db, mode, "slow", &format!("s{}", i % 2), i / 2 + 2).await;
        write_one(&db, mode, "slow", &format!("new{i}"), 1).await;
        write_one(&db, mode, "fast", &format!("f{i}"), 1).await;
        let left = HEALTHY_WITHIN.saturating_sub(started.elapsed());
        let want = i as usize;
        wait_until(
            "the healthy events to stream past the hanging destination",
            left,
            || async { of_kind(&reader, "fast") == want },
        )
        .await;
    }
    assert_eq!(of_kind(&reader, "slow"), 0, "{mode:?}: nothing answered");

    // It answers again: everything written for it is delivered, once each at least, in order
    // per aggregate.
    hanging.hanging.store(false, Ordering::SeqCst);
    let total = 1 + 2 * PAIRS as usize + PAIRS as usize;
    let deliveries = reader.wait_for(total, WAIT).await;
    let report = Report::of(&deliveries);
    assert_eq!(report.unique, total, "{mode:?}: {report:?}");
    assert_eq!(report.order_violations, 0, "{mode:?}: {report:?}");
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();
    reader.cleanup().await;
}

#[tokio::test]
async fn a_hanging_destination_costs_only_its_own_aggregates() {
    for mode in MODES {
        hanging_destination_costs_only_its_own_aggregates(mode).await;
    }
}
