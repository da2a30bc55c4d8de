//! The write side against a real PostgreSQL.

use outbox::{
    postgres::{MigrateOptions, PgOutbox},
    Error, Event, Tables,
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

#[tokio::test]
async fn enqueue_into_a_missing_outbox_says_to_migrate() {
    let pool = PgPool::connect(&database_url()).await.unwrap();
    let outbox = PgOutbox::new(Tables::new(&unique("none"), "events").unwrap());
    let mut tx = pool.begin().await.unwrap();
    let err = outbox
        .enqueue(&mut tx, &Event::new("a", "1", "T"))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "outbox schema: outbox tables not found; run `outbox migrate` first"
    );
}

#[tokio::test]
async fn the_inbox_sees_each_event_once_per_consumer_and_purges_by_age() {
    use outbox::postgres::{PgInbox, Seen};
    let db = TestDb::new(4).await;
    let inbox = PgInbox::new(&db.tables);
    let id = uuid::Uuid::now_v7();
    let mut tx = db.pool.begin().await.unwrap();
    assert_eq!(
        inbox.record(&mut tx, "billing", id).await.unwrap(),
        Seen::New
    );
    assert_eq!(
        inbox.record(&mut tx, "billing", id).await.unwrap(),
        Seen::Duplicate
    );
    assert_eq!(
        inbox.record(&mut tx, "shipping", id).await.unwrap(),
        Seen::New
    );
    tx.rollback().await.unwrap();
    // Rolled back with the business change: the event is new again.
    let mut tx = db.pool.begin().await.unwrap();
    assert!(inbox.record(&mut tx, "billing", id).await.unwrap().is_new());
    for _ in 0..25 {
        inbox
            .record(&mut tx, "billing", uuid::Uuid::now_v7())
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    sqlx::query(&db.tables.render(
        "UPDATE {schema}.inbox SET processed_at = now() - interval '8 days' WHERE event_id <> $1",
    ))
    .bind(id.to_string())
    .execute(&db.pool)
    .await
    .unwrap();
    let removed = inbox
        .purge(&db.pool, std::time::Duration::from_secs(7 * 86_400), 10)
        .await
        .unwrap();
    assert_eq!(removed, 25);
    let left: i64 = sqlx::query_scalar(&db.tables.render("SELECT count(*) FROM {schema}.inbox"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, 1);
    let mut tx = db.pool.begin().await.unwrap();
    let err = inbox
        .record(&mut tx, " ", id)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(err, "invalid event: consumer must not be empty");
}

#[tokio::test]
async fn the_inbox_takes_any_text_id_and_records_the_event_type() {
    use outbox::postgres::{PgInbox, Seen};
    let db = TestDb::new(1).await;
    let inbox = PgInbox::new(&db.tables);
    let id = uuid::Uuid::now_v7();
    let mut tx = db.pool.begin().await.unwrap();
    let record = |id: &'static str| (id, Some("OrderPlaced"));
    let (text, event_type) = record("A234-1234-1234");
    assert_eq!(
        inbox
            .record_message(&mut tx, "billing", text, event_type)
            .await
            .unwrap(),
        Seen::New
    );
    assert_eq!(
        inbox
            .record_message(&mut tx, "billing", text, event_type)
            .await
            .unwrap(),
        Seen::Duplicate
    );
    assert!(inbox
        .record_message(&mut tx, "billing", "a234-1234-1234", None)
        .await
        .unwrap()
        .is_new());
    // A UUID recorded either way is one key.
    assert!(inbox.record(&mut tx, "billing", id).await.unwrap().is_new());
    assert_eq!(
        inbox
            .record_message(&mut tx, "billing", &id.to_string(), None)
            .await
            .unwrap(),
        Seen::Duplicate
    );
    let long = "x".repeat(256);
    for (bad, expected) in [
        ("", "message_id must not be empty"),
        (long.as_str(), "message_id must be at most 255 characters"),
        ("a\0b", "message_id must not contain NUL"),
    ] {
        let err = inbox
            .record_message(&mut tx, "billing", bad, None)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.ends_with(expected), "{err}");
    }
    tx.commit().await.unwrap();
    let rows: Vec<(String, Option<String>)> =
        sqlx::query_as(&db.tables.render(
            "SELECT event_id, event_type FROM {schema}.inbox ORDER BY processed_at, event_id",
        ))
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows.len(), 3);
    assert!(rows.contains(&("A234-1234-1234".into(), Some("OrderPlaced".into()))));
    assert!(rows.contains(&(id.to_string(), None)));
}
