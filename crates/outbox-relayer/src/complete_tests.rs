//! `Completer::record` against a real SQLite outbox behind a store that fails on demand.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use futures::future::BoxFuture;
use outbox::{sqlite::SqliteOutbox, Event, Outbox};
use outbox_testkit::SqliteFile;

use super::Completer;
use crate::{
    health::Health,
    lease::Leases,
    retry::RetryPolicy,
    sqlite::SqliteStore,
    store::{Backlog, Claimed, Failure, Fence, Marking, Store},
    telemetry::Metrics,
};

/// A store whose first `failures` calls of `mark_failed` fail as a dropped connection would,
/// and whose first `refusals` calls of `mark_published` are refused for their data.
struct FlakyFailures {
    inner: SqliteStore,
    failures: AtomicUsize,
    refusals: AtomicUsize,
}

/// A refusal for the data (SQLSTATE 23514, a check constraint), as a user's trigger or
/// constraint on the outbox table would raise.
#[derive(Debug)]
struct Refusal;

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("new row violates check constraint")
    }
}

impl std::error::Error for Refusal {}

impl sqlx::error::DatabaseError for Refusal {
    fn message(&self) -> &str {
        "new row violates check constraint"
    }
    fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
        Some("23514".into())
    }
    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }
    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }
    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }
    fn kind(&self) -> sqlx::error::ErrorKind {
        sqlx::error::ErrorKind::CheckViolation
    }
}

fn taken(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

impl Store for FlakyFailures {
    fn partitions(&self) -> i32 {
        self.inner.partitions()
    }
    fn heartbeat<'a>(
        &'a self,
        relay_id: &'a str,
        hostname: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<String>, sqlx::Error>> {
        self.inner.heartbeat(relay_id, hostname, ttl)
    }
    fn deregister<'a>(&'a self, relay_id: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        self.inner.deregister(relay_id)
    }
    fn renew<'a>(
        &'a self,
        relay_id: &'a str,
        held: &'a [Fence],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<i32>, sqlx::Error>> {
        self.inner.renew(relay_id, held, ttl)
    }
    fn acquire<'a>(
        &'a self,
        relay_id: &'a str,
        n: i64,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Fence>, sqlx::Error>> {
        self.inner.acquire(relay_id, n, ttl)
    }
    fn release<'a>(
        &'a self,
        relay_id: &'a str,
        leases: &'a [Fence],
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        self.inner.release(relay_id, leases)
    }
    fn claim<'a>(
        &'a self,
        partitions: &'a [(i32, i64)],
        limit: i64,
        max_payload_bytes: usize,
        byte_budget: i64,
    ) -> BoxFuture<'a, Result<Claimed, sqlx::Error>> {
        self.inner
            .claim(partitions, limit, max_payload_bytes, byte_budget)
    }
    fn mark_published<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        ids: &'a [i64],
        marking: Marking,
    ) -> BoxFuture<'a, Result<Vec<i64>, sqlx::Error>> {
        if taken(&self.refusals) {
            return Box::pin(async { Err(sqlx::Error::Database(Box::new(Refusal))) });
        }
        self.inner.mark_published(relay_id, fences, ids, marking)
    }
    fn mark_failed<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        failures: &'a [Failure],
        park_on_dead: bool,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>> {
        if taken(&self.failures) {
            return Box::pin(async { Err(sqlx::Error::PoolTimedOut) });
        }
        self.inner
            .mark_failed(relay_id, fences, failures, park_on_dead)
    }
    fn backlog(&self) -> BoxFuture<'_, Result<Backlog, sqlx::Error>> {
        self.inner.backlog()
    }
}

#[tokio::test]
async fn a_failure_retried_after_a_transient_error_does_not_count_the_published_as_lost() {
    let file = SqliteFile::new().await;
    let mut tx = file.pool.begin().await.unwrap();
    SqliteOutbox::new(file.tables.clone())
        .enqueue_batch(
            &mut tx,
            &[
                Event::new("order", "a", "Placed"),
                Event::new("order", "b", "Placed"),
            ],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let inner = SqliteStore::open(file.pool.clone(), &file.tables)
        .await
        .unwrap();
    let fences = inner
        .acquire("r1", 1, Duration::from_secs(60))
        .await
        .unwrap();
    let claimed = inner
        .claim(&[(fences[0].0, 0)], 10, 1 << 20, i64::MAX)
        .await
        .unwrap();
    let ids: Vec<i64> = claimed.rows.iter().map(|r| r.id).collect();
    assert_eq!(ids.len(), 2);
    let store = Arc::new(FlakyFailures {
        inner,
        failures: AtomicUsize::new(1),
        refusals: AtomicUsize::new(0),
    });
    let leases = Leases::default();
    leases.add_for_test(&fences);
    let metrics = Arc::new(Metrics::new());
    let completer = Completer {
        store: store.clone(),
        relay_id: "r1".into(),
        metrics: metrics.clone(),
        health: Arc::new(Health::new(Duration::from_secs(60))),
        leases: Arc::new(leases),
        retry: RetryPolicy::default(),
        park: true,
        answer_within: Duration::from_secs(10),
    };
    let failure = Failure {
        id: ids[1],
        error: "transient: broker busy".into(),
        backoff: Duration::from_secs(1),
        dead: false,
        permanent: false,
    };
    let recorded = completer
        .record(&fences, &ids[..1], &[failure], Marking::Claimed)
        .await;
    assert_eq!(recorded, super::Recorded::Done);
    // Before: the retry marked the published row again, found it settled, and counted it
    // (and logged it) as lost to another relay.
    assert_eq!(
        metrics.fenced_out.get(),
        0,
        "nothing was lost to another relay"
    );
    assert_eq!(
        store.failures.load(Ordering::SeqCst),
        0,
        "the failure was retried"
    );
    let status: Vec<(i64, String, i32)> = sqlx::query_as(
        &file
            .tables
            .render_sqlite("SELECT id, status, attempts FROM {events} ORDER BY id"),
    )
    .fetch_all(&file.pool)
    .await
    .unwrap();
    assert_eq!(
        status,
        vec![
            (ids[0], "published".to_owned(), 1),
            (ids[1], "pending".to_owned(), 1)
        ]
    );
}

/// One claimed row of a fresh SQLite outbox, with its store (refusing `refusals` marks) and
/// a completer over it.
async fn one_row(refusals: usize) -> (SqliteFile, Arc<FlakyFailures>, Completer, Vec<Fence>, i64) {
    let file = SqliteFile::new().await;
    let mut tx = file.pool.begin().await.unwrap();
    SqliteOutbox::new(file.tables.clone())
        .enqueue(&mut tx, &Event::new("order", "a", "Placed"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let inner = SqliteStore::open(file.pool.clone(), &file.tables)
        .await
        .unwrap();
    let fences = inner
        .acquire("r1", 1, Duration::from_secs(60))
        .await
        .unwrap();
    let claimed = inner
        .claim(&[(fences[0].0, 0)], 10, 1 << 20, i64::MAX)
        .await
        .unwrap();
    let id = claimed.rows[0].id;
    let store = Arc::new(FlakyFailures {
        inner,
        failures: AtomicUsize::new(0),
        refusals: AtomicUsize::new(refusals),
    });
    let leases = Leases::default();
    leases.add_for_test(&fences);
    let completer = Completer {
        store: store.clone(),
        relay_id: "r1".into(),
        metrics: Arc::new(Metrics::new()),
        health: Arc::new(Health::new(Duration::from_secs(60))),
        leases: Arc::new(leases),
        retry: RetryPolicy::default(),
        park: true,
        answer_within: Duration::from_secs(10),
    };
    (file, store, completer, fences, id)
}

async fn status_of(file: &SqliteFile, id: i64) -> String {
    sqlx::query_scalar(
        &file
            .tables
            .render_sqlite("SELECT status FROM {events} WHERE id = ?"),
    )
    .bind(id)
    .fetch_one(&file.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_refused_streamed_mark_is_retried_until_it_is_written() {
    // Before: a streamed mark the database refused was given up, the row stayed pending under
    // its hold, and the CDC table path published it again at once, round after round, each
    // round counted as progress (readiness stayed green).
    let (file, store, completer, fences, id) = one_row(2).await;
    let recorded = completer
        .record(&fences, &[id], &[], Marking::Streamed)
        .await;
    assert_eq!(recorded, super::Recorded::Done);
    assert_eq!(
        store.refusals.load(Ordering::SeqCst),
        0,
        "both refusals met"
    );
    assert_eq!(status_of(&file, id).await, "published");
    assert_eq!(completer.metrics.database_errors.get(), 2);
}

#[tokio::test]
async fn a_refused_claimed_mark_leaves_the_row_pending_and_goes_on() {
    let (file, store, completer, fences, id) = one_row(1).await;
    let recorded = completer
        .record(&fences, &[id], &[], Marking::Claimed)
        .await;
    assert_eq!(recorded, super::Recorded::Done);
    assert_eq!(store.refusals.load(Ordering::SeqCst), 0);
    // Given up after one try: claimed again later.
    assert_eq!(status_of(&file, id).await, "pending");
    assert_eq!(completer.metrics.database_errors.get(), 1);
}
