//! The write side against a real PostgreSQL.

use outbox::{
    postgres::{MigrateOptions, PgOutbox},
    Error, Event, Outbox, Tables,
};
use outbox_testkit::{database_url, unique, TestDb};
use sqlx::PgPool;

#[tokio::test]
async fn enqueue_writes_inside_the_callers_transaction_only() {
    let db = TestDb::new(4).await;
    let outbox = db.outbox();
    let mut tx = db.pool.begin().await.unwrap();
    let id = outbox
        .enqueue(
            &mut tx,
            &Event::new("order", "1", "Placed").header("tenant", "acme"),
        )
        .await
        .unwrap();
    // Not visible outside the transaction before commit.
    assert_eq!(db.count("pending").await, 0);
    tx.commit().await.unwrap();
    let (event_id, headers, partition): (uuid::Uuid, serde_json::Value, i32) = sqlx::query_as(
        &db.tables
            .render("SELECT event_id, headers, partition FROM {schema}.{events}"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(event_id, id);
    assert_eq!(headers["tenant"], "acme");
    assert!((0..4).contains(&partition));

    let mut tx = db.pool.begin().await.unwrap();
    outbox
        .enqueue(&mut tx, &Event::new("order", "2", "Placed"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(
        db.count("pending").await,
        1,
        "rolled back event never existed"
    );
}

#[tokio::test]
async fn a_batch_keeps_its_order_and_the_same_aggregate_lands_in_one_partition() {
    let db = TestDb::new(16).await;
    let events: Vec<Event> = (0..100)
        .map(|v| Event::new("cart", "c-7", "ItemAdded").aggregate_version(v))
        .collect();
    let mut tx = db.pool.begin().await.unwrap();
    let ids = db.outbox().enqueue_batch(&mut tx, &events).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(ids.len(), 100);
    let rows: Vec<(uuid::Uuid, i64, i32)> = sqlx::query_as(&db.tables.render(
        "SELECT event_id, aggregate_version, partition FROM {schema}.{events} ORDER BY id",
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), ids);
    assert!(rows.windows(2).all(|w| w[0].1 < w[1].1));
    assert!(
        rows.iter().all(|r| r.2 == rows[0].2),
        "one aggregate, one partition"
    );
}

#[tokio::test]
async fn invalid_events_and_duplicate_versions_get_typed_errors_naming_the_problem() {
    let db = TestDb::new(4).await;
    let outbox = db.outbox().max_payload_bytes(1024);
    let mut tx = db.pool.begin().await.unwrap();
    let err = outbox
        .enqueue_batch(
            &mut tx,
            &[
                Event::new("a", "1", "T"),
                Event::new("a", "1", "T").payload(vec![0u8; 2048], "application/octet-stream"),
            ],
        )
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        Error::PayloadTooLarge {
            size: 2048,
            limit: 1024
        }
    ));
    let err = outbox
        .enqueue_batch(
            &mut tx,
            &[Event::new("a", "1", "T"), Event::new("a", "", "T")],
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid event: events[1].aggregate_id must not be empty"
    );

    outbox
        .enqueue(
            &mut tx,
            &Event::new("acct", "9", "Opened").aggregate_version(1),
        )
        .await
        .unwrap();
    let err = outbox
        .enqueue(
            &mut tx,
            &Event::new("acct", "9", "Credited").aggregate_version(1),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "aggregate acct/9 already has an event with version 1"
    );
    drop(tx);
    assert_eq!(db.count("pending").await, 0);
}

#[tokio::test]
async fn migrations_are_idempotent_and_safe_to_run_concurrently() {
    let pool = PgPool::connect(&database_url()).await.unwrap();
    let schema = unique("m");
    let tables = Tables::new(&schema, "outbox_messages").unwrap();
    let runs = (0..6).map(|_| {
        let (pool, tables) = (pool.clone(), tables.clone());
        tokio::spawn(async move {
            PgOutbox::new(tables)
                .migrate(
                    &pool,
                    MigrateOptions {
                        partitions: Some(8),
                        ..Default::default()
                    },
                )
                .await
        })
    });
    for run in futures::future::join_all(runs).await {
        run.unwrap().unwrap();
    }
    PgOutbox::new(tables.clone())
        .migrate(&pool, MigrateOptions::default())
        .await
        .unwrap();
    let leases: i64 = sqlx::query_scalar(&tables.render("SELECT count(*) FROM {schema}.leases"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(leases, 8);
    let err = PgOutbox::new(tables.clone())
        .migrate(
            &pool,
            MigrateOptions {
                partitions: Some(16),
                ..Default::default()
            },
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("created with 8 partitions, 16 requested"),
        "{err}"
    );
    sqlx::raw_sql(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .execute(&pool)
        .await
        .unwrap();
}
