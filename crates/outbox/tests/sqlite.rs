//! The write side and the inbox on SQLite.

use outbox::{
    sqlite::{SqliteInbox, SqliteOutbox},
    Event, Seen, Tables,
};
use sqlx::{sqlite::SqlitePoolOptions, SqlitePool};

async fn pool() -> (SqlitePool, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!("{}.db", outbox_testkit::unique("lib")));
    let pool = SqlitePoolOptions::new()
        .connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap();
    let outbox = SqliteOutbox::default();
    outbox.migrate(&pool).await.unwrap();
    outbox.migrate(&pool).await.unwrap();
    (pool, path)
}

#[tokio::test]
async fn enqueue_is_transactional_ordered_and_validated() {
    let (pool, path) = pool().await;
    let outbox = SqliteOutbox::new(Tables::default()).max_payload_bytes(64);
    let mut tx = pool.begin().await.unwrap();
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
    let mut tx = pool.begin().await.unwrap();
    outbox
        .enqueue(&mut tx, &Event::new("acct", "2", "Opened"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let stored: Vec<String> = sqlx::query_scalar("SELECT event_id FROM outbox_events ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        stored,
        ids.iter().map(|i| i.to_string()).collect::<Vec<_>>()
    );

    let mut tx = pool.begin().await.unwrap();
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
    let err = outbox
        .enqueue(
            &mut tx,
            &Event::new("a", "1", "T").payload(vec![0; 65], "x/y"),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("over the limit of 64 bytes"));
    drop(tx);
    let _ = std::fs::remove_file(path);
}

#[tokio::test]
async fn the_inbox_records_once_and_purges_by_age() {
    let (pool, path) = pool().await;
    let inbox = SqliteInbox::default();
    let id = uuid::Uuid::now_v7();
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        inbox.record(&mut tx, "billing", id).await.unwrap(),
        Seen::New
    );
    assert_eq!(
        inbox.record(&mut tx, "billing", id).await.unwrap(),
        Seen::Duplicate
    );
    for _ in 0..12 {
        inbox
            .record(&mut tx, "billing", uuid::Uuid::now_v7())
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    sqlx::query(
        "UPDATE outbox_inbox SET processed_at = '2000-01-01T00:00:00.000Z' WHERE event_id <> ?",
    )
    .bind(id.to_string())
    .execute(&pool)
    .await
    .unwrap();
    let removed = inbox
        .purge(&pool, std::time::Duration::from_secs(86_400), 5)
        .await
        .unwrap();
    assert_eq!(removed, 12);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_inbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 1);
    let _ = std::fs::remove_file(path);
}

#[tokio::test]
async fn the_inbox_takes_any_text_id_and_records_the_event_type() {
    let (pool, path) = pool().await;
    let inbox = SqliteInbox::default();
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        inbox
            .record_message(&mut tx, "billing", "A234-1234-1234", Some("OrderPlaced"))
            .await
            .unwrap(),
        Seen::New
    );
    assert_eq!(
        inbox
            .record_message(&mut tx, "billing", "A234-1234-1234", Some("OrderPlaced"))
            .await
            .unwrap(),
        Seen::Duplicate
    );
    let err = inbox
        .record_message(&mut tx, "billing", "", None)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.ends_with("message_id must not be empty"), "{err}");
    tx.commit().await.unwrap();
    let stored: (String, Option<String>) =
        sqlx::query_as("SELECT event_id, event_type FROM outbox_inbox")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        stored,
        ("A234-1234-1234".into(), Some("OrderPlaced".into()))
    );
    let _ = std::fs::remove_file(path);
}
