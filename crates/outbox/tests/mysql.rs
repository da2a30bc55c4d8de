//! What is MySQL's own in the write side and the migrations (run on the machine's MariaDB);
//! the contract all backends share is in conformance.rs.

use outbox::{mysql::MySqlOutbox, MigrateOptions, Outbox, Tables};
use outbox_testkit::MySqlDb;

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
