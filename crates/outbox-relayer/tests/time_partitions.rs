//! A time-partitioned outbox: the relay publishes from it unchanged, keeps partitions created
//! ahead, and its retention drops whole expired partitions, never one that still holds a
//! pending or dead event, and never by waiting for a lock on the events table.

mod common;

use std::time::Duration;

use chrono::{Days, Utc};
use outbox::{
    postgres::{time_partitions, MigrateOptions, PgOutbox},
    Event, Outbox,
};
use outbox_relayer::{Relay, RelayConfig};
use outbox_testkit::{insert_sequences, unique, wait_until, NatsReader, TestDb, NATS_URL};
use sqlx::{Connection, PgConnection, Postgres, Transaction};
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(60);

async fn partition_names(db: &TestDb) -> Vec<String> {
    time_partitions::list(&db.pool, &db.tables)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.name)
        .collect()
}

// Two workers: the relay's upkeep task may still be finishing a run, inside a transaction, when
// the test ends; on a second worker it completes while dropping the schema waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_publishes_from_time_partitions_and_drops_expired_ones() {
    let db = TestDb::with_options(MigrateOptions {
        partitions: Some(4),
        time_partition_days: Some(1),
    })
    .await;
    let kind: String =
        sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE oid = $1::regclass")
            .bind(db.tables.render("{schema}.{events}"))
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(kind, "p", "the events table is partitioned");
    let today = Utc::now().date_naive();
    let names = partition_names(&db).await;
    assert!(names.len() >= 8, "today and a week ahead exist: {names:?}");

    // Past partitions, as if the outbox had run for three weeks.
    let created = time_partitions::ensure(&db.pool, &db.tables, today - Days::new(20), today)
        .await
        .unwrap();
    assert_eq!(created.len(), 20);
    let name_of =
        |days_ago: u64| format!("events_p{}", (today - Days::new(days_ago)).format("%Y%m%d"));
    // 15 days ago: published only (droppable). 12 days ago: one dead event (must stay).
    db.exec(
        "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, event_type,
             payload, occurred_at, status, published_at)
         SELECT gen_random_uuid(), 'old', 'o' || g, 'Happened', '\\x7b7d',
                now() - interval '15 days', 'published', now() - interval '15 days'
         FROM generate_series(1, 10) g",
    )
    .await;
    db.exec(
        "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, event_type,
             payload, occurred_at, status, last_error)
         VALUES (gen_random_uuid(), 'old', 'x', 'Happened', '\\x7b7d',
                 now() - interval '12 days', 'dead', 'kept for the operator')",
    )
    .await;

    // Writes through the library work, and the version rule holds across partitions.
    let written = insert_sequences(&db, "order", 10, 5, 50).await;
    let mut tx = db.pool.begin().await.unwrap();
    let duplicate = db
        .outbox()
        .enqueue(
            &mut tx,
            &Event::new("order", "a0", "Happened")
                .json(&serde_json::json!({}))
                .unwrap()
                .aggregate_version(1),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(duplicate, outbox::Error::DuplicateAggregateVersion { .. }),
        "{duplicate}"
    );
    drop(tx);

    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let relay = Relay::builder(
        db.pool.clone(),
        common::nats(NATS_URL, &reader.stream).await,
        RelayConfig {
            purge_retention: Some(Duration::from_secs(7 * 86_400)),
            purge_interval: Duration::from_millis(200),
            ..common::fast_config(&db, &prefix)
        },
    )
    .build()
    .await
    .unwrap();
    let metrics = relay.metrics();
    let relay = relay.spawn();
    let delivered = reader.wait_for(written, WAIT).await;
    assert_eq!(delivered.len(), written);
    // The relay's upkeep drops each expired partition on a run that finds the events table
    // free at that instant; a run that does not may first remove the published rows by row
    // purge. Either way the 10 rows are counted once, and only the partition holding the dead
    // event stays.
    let cutoff = Utc::now() - chrono::Duration::days(7);
    wait_until("the expired partitions to be dropped", WAIT, || async {
        let expired: Vec<String> = time_partitions::list(&db.pool, &db.tables)
            .await
            .unwrap()
            .into_iter()
            .filter(|p| p.to.and_hms_opt(0, 0, 0).unwrap().and_utc() <= cutoff)
            .map(|p| p.name)
            .collect();
        expired == [name_of(12)]
    })
    .await;
    relay.shutdown().await.unwrap();
    assert!(
        metrics.encode().contains("outbox_purged_total 10"),
        "{}",
        metrics.encode()
    );

    let names = partition_names(&db).await;
    assert!(!names.contains(&name_of(15)), "{names:?}");
    assert!(
        names.contains(&name_of(12)),
        "a partition with a dead event is kept"
    );
    assert_eq!(db.count("dead").await, 1);
    assert_eq!(
        db.count("published").await as usize,
        written,
        "today's rows untouched"
    );
    reader.cleanup().await;
}

#[tokio::test]
async fn time_partitioning_is_chosen_at_creation_only() {
    let db = TestDb::new(2).await;
    let err = PgOutbox::new(db.tables.clone())
        .migrate(
            &db.pool,
            MigrateOptions {
                partitions: None,
                time_partition_days: Some(1),
            },
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("exists as a plain table"), "{err}");
    // On a plain table the partition operations are no-ops.
    assert!(time_partitions::list(&db.pool, &db.tables)
        .await
        .unwrap()
        .is_empty());
    let report = time_partitions::drop_expired(&db.pool, &db.tables, Utc::now(), false, false)
        .await
        .unwrap();
    assert_eq!(report, time_partitions::DropReport::default());

    let schema = unique("t");
    let tables = outbox::Tables::new(&schema, "events").unwrap();
    let err = PgOutbox::new(tables)
        .migrate(
            &db.pool,
            MigrateOptions {
                partitions: Some(2),
                time_partition_days: Some(0),
            },
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("1 to 366 days"), "{err}");
    sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(&db.pool)
        .await
        .unwrap();
}

/// A time-partitioned outbox (one-day partitions) with an extra partition `days_ago` days back
/// holding `published` published events and `dead` dead ones; returns it and that partition.
async fn with_old_partition(days_ago: u64, published: i64, dead: i64) -> (TestDb, String) {
    let db = TestDb::with_options(MigrateOptions {
        partitions: Some(4),
        time_partition_days: Some(1),
    })
    .await;
    let day = Utc::now().date_naive() - Days::new(days_ago);
    let created = time_partitions::ensure(&db.pool, &db.tables, day, day)
        .await
        .unwrap();
    assert_eq!(created.len(), 1);
    db.exec(&format!(
        "INSERT INTO {{schema}}.{{events}} (event_id, aggregate_type, aggregate_id, event_type,
             payload, occurred_at, status, published_at, last_error)
         SELECT gen_random_uuid(), 'old', 'o' || g, 'Happened', '\\x7b7d',
                now() - interval '{days_ago} days',
                CASE WHEN g <= {published} THEN 'published' ELSE 'dead' END,
                CASE WHEN g <= {published} THEN now() - interval '{days_ago} days' END,
                CASE WHEN g > {published} THEN 'kept for the operator' END
         FROM generate_series(1, {}) g",
        published + dead
    ))
    .await;
    (db, created[0].clone())
}

/// A transaction that has written an event and stays open: until it ends it holds the
/// ROW EXCLUSIVE lock every writer takes on the events table.
async fn open_writer(db: &TestDb) -> Transaction<'static, Postgres> {
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox()
        .enqueue(
            &mut tx,
            &Event::new("order", "open", "Placed")
                .json(&serde_json::json!({}))
                .unwrap(),
        )
        .await
        .unwrap();
    tx
}

/// Lock requests on the outbox's tables that wait (not granted), of session `pid` if given.
async fn queued_locks(db: &TestDb, pid: Option<i32>) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks l
         JOIN pg_class c ON c.oid = l.relation
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND NOT l.granted AND ($2::int IS NULL OR l.pid = $2)",
    )
    .bind(&db.schema)
    .bind(pid)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// Starts a drop with a 7-day retention and waits until it has either returned or queued a
/// lock request on the outbox's tables; returns the drop and whether it queued.
async fn start_drop(
    db: &TestDb,
) -> (
    JoinHandle<Result<time_partitions::DropReport, outbox::Error>>,
    bool,
) {
    let (pool, tables) = (db.pool.clone(), db.tables.clone());
    let drop = tokio::spawn(async move {
        let cutoff = Utc::now() - chrono::Duration::days(7);
        time_partitions::drop_expired(&pool, &tables, cutoff, false, false).await
    });
    wait_until("the drop to return or to queue for a lock", WAIT, || {
        let finished = drop.is_finished();
        async move { finished || queued_locks(db, None).await > 0 }
    })
    .await;
    let queued = queued_locks(db, None).await > 0;
    (drop, queued)
}

#[tokio::test]
async fn a_drop_behind_an_open_writer_skips_the_partition_at_once_and_never_blocks_writers() {
    let (db, expired) = with_old_partition(15, 10, 0).await;
    let open = open_writer(&db).await;
    let (drop, drop_queued) = start_drop(&db).await;

    // With the first writer's transaction still open, a second writer inserts and commits.
    let mut second = PgConnection::connect(&db.url).await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut second)
        .await
        .unwrap();
    let insert = db.tables.render(
        "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, event_type,
             payload)
         VALUES (gen_random_uuid(), 'order', 'second', 'Placed', '\\x7b7d')",
    );
    let writer = tokio::spawn(async move { sqlx::query(&insert).execute(&mut second).await });
    wait_until("the second writer to commit or to queue", WAIT, || {
        let finished = writer.is_finished();
        let db = &db;
        async move { finished || queued_locks(db, Some(pid)).await > 0 }
    })
    .await;
    let writer_queued = queued_locks(&db, Some(pid)).await > 0;
    let written = writer.await.unwrap();
    let report = drop.await.unwrap();
    // The open transaction ends before any assertion, so a failure cannot leave it open.
    open.commit().await.unwrap();
    assert!(
        !drop_queued && !writer_queued,
        "the drop queued for a lock on the events table behind an open transaction \
         ({drop_queued}), and a writer queued behind the drop ({writer_queued}); the drop \
         returned {report:?}"
    );
    written.expect("the second writer commits");
    assert_eq!(
        report.expect("a busy outbox is no error"),
        time_partitions::DropReport {
            busy: vec![expired.clone()],
            ..Default::default()
        },
        "the partition is left for the next run"
    );
    assert!(partition_names(&db).await.contains(&expired));

    // With no transaction in the way, the next run drops the partition.
    let cutoff = Utc::now() - chrono::Duration::days(7);
    let report = time_partitions::drop_expired(&db.pool, &db.tables, cutoff, false, false)
        .await
        .unwrap();
    assert_eq!(report.dropped, vec![(expired.clone(), 10)]);
    assert!(!partition_names(&db).await.contains(&expired));
}

#[tokio::test]
async fn a_partition_kept_for_a_dead_event_is_examined_without_locking_the_events_table() {
    let (db, expired) = with_old_partition(12, 5, 1).await;
    // Any request for the table lock would conflict with this writer's lock and show.
    let open = open_writer(&db).await;
    let (drop, queued) = start_drop(&db).await;
    let report = drop.await.unwrap();
    open.commit().await.unwrap();
    assert!(
        !queued,
        "the drop queued for the events table's lock to examine a partition it keeps; it \
         returned {report:?}"
    );
    assert_eq!(
        report.expect("a kept partition is no error"),
        time_partitions::DropReport {
            kept: vec![expired.clone()],
            ..Default::default()
        },
        "kept for its dead event, found without asking for the table lock"
    );
    assert!(partition_names(&db).await.contains(&expired));
    assert_eq!(db.count("dead").await, 1);
}

#[tokio::test]
async fn while_another_process_drops_partitions_a_drop_skips_its_run_without_waiting() {
    let (db, expired) = with_old_partition(15, 3, 0).await;
    // What a drop running elsewhere holds for its transaction.
    let mut other = db.pool.begin().await.unwrap();
    let taken: bool = sqlx::query_scalar(
        "SELECT pg_try_advisory_xact_lock(hashtextextended('outbox.drop_partitions.' || $1, 0))",
    )
    .bind(db.tables.render("{schema}.{events}"))
    .fetch_one(&mut *other)
    .await
    .unwrap();
    assert!(taken);
    let (drop, queued) = start_drop(&db).await;
    let report = drop.await.unwrap();
    other.rollback().await.unwrap();
    assert!(!queued, "the drop queued for a lock");
    assert_eq!(
        report.unwrap(),
        time_partitions::DropReport {
            busy: vec![expired.clone()],
            ..Default::default()
        },
        "one process at a time drops partitions; the other leaves them for its next run"
    );
    let cutoff = Utc::now() - chrono::Duration::days(7);
    let report = time_partitions::drop_expired(&db.pool, &db.tables, cutoff, false, false)
        .await
        .unwrap();
    assert_eq!(report.dropped, vec![(expired, 3)]);
}

/// The one-version-per-aggregate check of a time-partitioned outbox (a trigger) lets the
/// same event, written again with `ON CONFLICT DO NOTHING` (the CDC relay writing a streamed
/// event into the table again after a restart), do nothing, as a plain table does; it used to
/// raise a duplicate-version error first, which dead-lettered the event as unwritable. Another
/// event at the same version is still refused.
#[tokio::test]
async fn the_same_event_written_again_is_no_duplicate_version() {
    let db = TestDb::on(
        &outbox_testkit::database_url(),
        MigrateOptions {
            partitions: Some(2),
            time_partition_days: Some(1),
        },
    )
    .await;
    let insert = db.tables.render(
        "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, \
         aggregate_version, event_type, payload, occurred_at) \
         VALUES ($1, 'order', '1', 1, 'Placed', '{}', '2026-01-02T03:04:05Z') \
         ON CONFLICT DO NOTHING",
    );
    let event = uuid::Uuid::now_v7();
    let first = sqlx::query(&insert).bind(event).execute(&db.pool).await;
    assert_eq!(first.unwrap().rows_affected(), 1);
    let again = sqlx::query(&insert).bind(event).execute(&db.pool).await;
    assert_eq!(
        again
            .expect("the same event again is not a duplicate version")
            .rows_affected(),
        0
    );
    let other = sqlx::query(&insert)
        .bind(uuid::Uuid::now_v7())
        .execute(&db.pool)
        .await
        .expect_err("another event at version 1");
    assert!(
        other.to_string().contains("aggregate_version_key"),
        "{other}"
    );
}
