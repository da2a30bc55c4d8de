//! A time-partitioned outbox: the relay publishes from it unchanged, keeps partitions created
//! ahead, and its retention drops whole expired partitions, never one that still holds a
//! pending or dead event.

mod common;

use std::time::Duration;

use chrono::{Days, Utc};
use outbox::{
    postgres::{time_partitions, MigrateOptions, PgOutbox},
    Event,
};
use outbox_relay::{Relay, RelayConfig};
use outbox_testkit::{insert_sequences, unique, wait_until, NatsReader, TestDb, NATS_URL};

const WAIT: Duration = Duration::from_secs(60);

async fn partition_names(db: &TestDb) -> Vec<String> {
    time_partitions::list(&db.pool, &db.tables)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.name)
        .collect()
}

#[tokio::test]
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
    let relay = Relay::new(
        db.pool.clone(),
        common::nats(NATS_URL, &reader.stream).await,
        RelayConfig {
            purge_retention: Some(Duration::from_secs(7 * 86_400)),
            purge_interval: Duration::from_millis(200),
            ..common::fast_config(&db, &prefix)
        },
    )
    .await
    .unwrap();
    let metrics = relay.metrics();
    let relay = relay.spawn();
    let delivered = reader.wait_for(written, WAIT).await;
    assert_eq!(delivered.len(), written);
    // One pass of the relay's upkeep drops every expired partition and counts their rows.
    wait_until("the expired partitions to be dropped", WAIT, || {
        let done = metrics.encode().contains("outbox_purged_total 10");
        async move { done }
    })
    .await;
    relay.shutdown().await.unwrap();

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
