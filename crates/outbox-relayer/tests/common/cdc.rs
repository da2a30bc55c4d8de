//! Set-up of the CDC relay tests: an outbox with its slot on the logical server (the private
//! server of `scripts/tools/pg_cdc.sh`), the CDC relay, writes in each write mode.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::future::BoxFuture;

use outbox::{
    postgres::{cdc, MigrateOptions, WriteMode},
    Event, Outbox,
};
use outbox_relayer::{Message, Mode, PublishError, Publisher, Relay, RelayConfig, RelayHandle};
use outbox_testkit::{cdc_database_url, wait_until, TestDb};

/// How long a CDC test waits for a condition.
pub const WAIT: Duration = Duration::from_secs(60);

/// A migrated outbox of `partitions` on the server at `url`, without a slot.
pub async fn outbox_on(url: &str, partitions: i32) -> TestDb {
    TestDb::on(
        url,
        MigrateOptions {
            partitions: Some(partitions),
            ..Default::default()
        },
    )
    .await
}

/// `db` with its slot and publication.
pub async fn with_slot(db: TestDb) -> TestDb {
    cdc::setup(&db.pool, &db.tables, &cdc::CdcNames::for_tables(&db.tables))
        .await
        .expect("cdc setup");
    db
}

/// A migrated outbox on the logical server, with its slot and publication.
pub async fn cdc_db(partitions: i32) -> TestDb {
    with_slot(outbox_on(&cdc_database_url(), partitions).await).await
}

/// The fast test settings in CDC mode, with a short stream heartbeat.
pub fn cdc_config(db: &TestDb, prefix: &str) -> RelayConfig {
    let mut config = super::fast_config(db, prefix);
    config.mode = Mode::Cdc;
    config.cdc.heartbeat_interval = Duration::from_millis(500);
    config
}

/// Starts a CDC relay on `db` in this process.
pub async fn start(
    db: &TestDb,
    publisher: Arc<dyn outbox_relayer::Publisher>,
    config: RelayConfig,
) -> RelayHandle {
    Relay::builder(db.pool.clone(), publisher, config)
        .replication_url(&db.url)
        .build()
        .await
        .expect("relay")
        .spawn()
}

/// Writes `per_aggregate` versions for each of `aggregates` aggregates in transactions of
/// `chunk` events, with `mode`.
pub async fn write(
    db: &TestDb,
    mode: WriteMode,
    kind: &str,
    aggregates: usize,
    per_aggregate: i64,
    chunk: usize,
) -> usize {
    let outbox = db.outbox().write_mode(mode);
    let mut events = Vec::new();
    for version in 1..=per_aggregate {
        for a in 0..aggregates {
            events.push(
                Event::new(kind, format!("a{a}"), "Happened")
                    .json(&serde_json::json!({ "a": a, "v": version }))
                    .unwrap()
                    .aggregate_version(version),
            );
        }
    }
    for part in events.chunks(chunk) {
        let mut tx = db.pool.begin().await.unwrap();
        outbox.enqueue_batch(&mut tx, part).await.unwrap();
        tx.commit().await.unwrap();
    }
    events.len()
}

/// How many rows the events table holds.
pub async fn rows(db: &TestDb) -> i64 {
    sqlx::query_scalar(&db.tables.render("SELECT count(*) FROM {schema}.{events}"))
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// The slot's confirmed position reaches the current WAL end (nothing left unconfirmed).
pub async fn slot_caught_up(db: &TestDb) {
    let slot = cdc::CdcNames::for_tables(&db.tables).slot;
    wait_until(
        "the slot to be confirmed up to the WAL end",
        WAIT,
        || async {
            let lag: Option<i64> = sqlx::query_scalar(
                "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint \
             FROM pg_replication_slots WHERE slot_name = $1",
            )
            .bind(slot.as_str())
            .fetch_one(&db.pool)
            .await
            .unwrap();
            // The heartbeat itself writes WAL: a few hundred bytes behind is caught up.
            lag.is_some_and(|l| l < 4096)
        },
    )
    .await;
}

/// A publisher (the real NATS one in these tests) counting the publishes of each event before
/// the broker sees them: JetStream would drop a second publish of an event id.
pub struct Counting {
    inner: Arc<dyn Publisher>,
    /// Publishes per event id.
    pub published: Mutex<HashMap<uuid::Uuid, u32>>,
}

impl Counting {
    /// Counts what goes through `inner`.
    pub fn new(inner: Arc<dyn Publisher>) -> Self {
        Self {
            inner,
            published: Mutex::default(),
        }
    }
}

impl Publisher for Counting {
    fn publish<'a>(&'a self, m: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        *self
            .published
            .lock()
            .unwrap()
            .entry(m.event_id)
            .or_default() += 1;
        self.inner.publish(m)
    }
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn max_payload_bytes(&self) -> usize {
        self.inner.max_payload_bytes()
    }
}
