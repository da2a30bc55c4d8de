//! The write side, the inbox and the migrations on MySQL (run on the machine's MariaDB).

use outbox::{
    mysql::{MySqlInbox, MySqlOutbox},
    postgres::MigrateOptions,
    Event, Seen, Tables,
};
use outbox_testkit::MySqlDb;

#[tokio::test]
async fn enqueue_is_transactional_ordered_and_validated() {
    let db = MySqlDb::new(4).await;
    let outbox = MySqlOutbox::new(Tables::default()).max_payload_bytes(64);
    let mut tx = db.pool.begin().await.unwrap();
    let ids = outbox
        .enqueue_batch(
            &mut tx,
            &[
                Event::new("acct", "1", "Opened").aggregate_version(1),
                Event::new("acct", "1", "Credited").aggregate_version(2),
            ],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    outbox
        .enqueue(&mut tx, &Event::new("acct", "2", "Opened"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let stored: Vec<String> = sqlx::query_scalar("SELECT event_id FROM outbox_events ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        stored,
        ids.iter().map(|i| i.to_string()).collect::<Vec<_>>()
    );

    let mut tx = db.pool.begin().await.unwrap();
    let err = outbox
        .enqueue(
            &mut tx,
            &Event::new("acct", "1", "Debited").aggregate_version(2),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "aggregate acct/1 already has an event with version 2"
    );
    // Keys compare byte for byte: "ACCT" is another aggregate than "acct".
    outbox
        .enqueue(
            &mut tx,
            &Event::new("ACCT", "1", "Opened").aggregate_version(2),
        )
        .await
        .unwrap();
    let err = outbox
        .enqueue(
            &mut tx,
            &Event::new("a", "1", "T").payload(vec![0; 65], "x/y"),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("over the limit of 64 bytes"));
    tx.rollback().await.unwrap();
}

#[tokio::test]
async fn a_plain_sql_insert_gets_the_defaults_and_a_partition() {
    let db = MySqlDb::new(8).await;
    db.exec(
        "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, payload)
         VALUES ('0190b7a4-1c3e-7cc1-9d5e-3f1a2b3c4d5e', 'order', '42', 'Placed', '{}')",
    )
    .await;
    let row: (String, String, String, i32, String, i64) = sqlx::query_as(
        "SELECT content_type, CAST(headers AS CHAR), status, `partition`,
                CAST(occurred_at AS CHAR), attempts
         FROM outbox_events",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(row.0, "application/json");
    assert_eq!(row.1, "{}");
    assert_eq!(row.2, "pending");
    assert!((0..8).contains(&row.3), "{}", row.3);
    // UTC_TIMESTAMP, whatever the writer's session time zone.
    let age = chrono::Utc::now().naive_utc()
        - chrono::NaiveDateTime::parse_from_str(&row.4, "%Y-%m-%d %H:%M:%S%.f").unwrap();
    assert!(age.num_seconds().abs() < 300, "{}", row.4);
    assert_eq!(row.5, 0);
}

#[tokio::test]
async fn the_inbox_records_once_and_purges_by_age() {
    let db = MySqlDb::new(1).await;
    let inbox = MySqlInbox::default();
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
        inbox.record(&mut tx, "Billing", id).await.unwrap(),
        Seen::New,
        "consumer names compare byte for byte"
    );
    for _ in 0..12 {
        inbox
            .record(&mut tx, "billing", uuid::Uuid::now_v7())
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    sqlx::query("UPDATE outbox_inbox SET processed_at = '2000-01-01' WHERE event_id <> ?")
        .bind(id.to_string())
        .execute(&db.pool)
        .await
        .unwrap();
    let removed = inbox
        .purge(&db.pool, std::time::Duration::from_secs(86_400), 5)
        .await
        .unwrap();
    assert_eq!(removed, 12);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_inbox")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, 2);
}

#[tokio::test]
async fn concurrent_migrations_queue_and_a_second_count_is_refused() {
    let db = MySqlDb::new(4).await;
    let tables = Tables::new("other", "events").unwrap();
    let runs = (0..4).map(|_| {
        let (pool, tables) = (db.pool.clone(), tables.clone());
        tokio::spawn(async move {
            MySqlOutbox::new(tables)
                .migrate(&pool, MigrateOptions::default())
                .await
        })
    });
    for run in futures::future::join_all(runs).await {
        run.unwrap().unwrap();
    }
    let leases: i64 = sqlx::query_scalar("SELECT count(*) FROM other_leases")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(leases, i64::from(outbox::mysql::DEFAULT_PARTITIONS));
    let err = MySqlOutbox::new(tables)
        .migrate(
            &db.pool,
            MigrateOptions {
                partitions: Some(3),
                time_partition_days: None,
            },
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("created with 32 partitions, 3 requested"),
        "{err}"
    );
}

#[tokio::test]
async fn writing_before_migrating_says_to_migrate() {
    let db = MySqlDb::new(1).await;
    let mut tx = db.pool.begin().await.unwrap();
    let err = MySqlOutbox::new(Tables::new("missing", "events").unwrap())
        .enqueue(&mut tx, &Event::new("a", "1", "T"))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        outbox::Error::Schema(outbox::SchemaError::Missing).to_string()
    );
}

#[tokio::test]
async fn the_inbox_takes_any_text_id_and_records_the_event_type() {
    let db = MySqlDb::new(1).await;
    let inbox = MySqlInbox::default();
    let mut tx = db.pool.begin().await.unwrap();
    let long = "é".repeat(255);
    for id in ["A234-1234-1234", "a234-1234-1234", long.as_str()] {
        assert_eq!(
            inbox
                .record_message(&mut tx, "billing", id, Some("OrderPlaced"))
                .await
                .unwrap(),
            Seen::New,
            "ids compare byte for byte, up to 255 characters"
        );
        assert_eq!(
            inbox
                .record_message(&mut tx, "billing", id, Some("OrderPlaced"))
                .await
                .unwrap(),
            Seen::Duplicate
        );
    }
    let err = inbox
        .record_message(&mut tx, "billing", &"x".repeat(256), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.ends_with("message_id must be at most 255 characters"),
        "{err}"
    );
    tx.commit().await.unwrap();
    let stored: Vec<(String, Option<String>)> =
        // A `_bin` collation reads back as binary in sqlx: converted to text here.
        sqlx::query_as(
            "SELECT CONVERT(event_id USING utf8mb4), event_type FROM outbox_inbox",
        )
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(stored.len(), 3);
    assert!(stored.contains(&(long.clone(), Some("OrderPlaced".into()))));
}
