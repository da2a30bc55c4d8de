//! One contract, three databases: the writer ([`Outbox`]) and the inbox ([`Inbox`]) of
//! PostgreSQL, MySQL/MariaDB and SQLite, each driven through the traits only and checked from
//! outside through SQL. A fourth backend enters here with one fixture.

use std::time::Duration;

use outbox::{DomainEvent, Event, Inbox, MigrateOptions, Outbox, Seen, Tables};
use outbox_testkit::{unique, MySqlDb, SqliteFile, TestDb};
use sqlx::Pool;

/// A fresh outbox of one backend, migrated, removed when dropped, and the reads the contract is
/// checked with.
trait Fixture: Sized {
    type O: Outbox;
    async fn new() -> Self;
    fn pool(&self) -> &Pool<<Self::O as Outbox>::Database>;
    /// The writer of this outbox, accepting payloads up to `max_payload_bytes`.
    fn outbox(&self, max_payload_bytes: usize) -> Self::O;
    /// A writer of an outbox on the same database that was never migrated.
    fn elsewhere(&self, tables: Tables) -> Self::O;
    /// The events' ids, in the order of the table's `id`.
    async fn event_ids(&self) -> Vec<String>;
    /// The inbox's rows: consumer, message id, event type.
    async fn inbox_rows(&self) -> Vec<(String, String, Option<String>)>;
    /// Makes every inbox row but `keep`'s eight days old.
    async fn age_inbox_except(&self, keep: &str);
}

impl Fixture for TestDb {
    type O = outbox::postgres::PgOutbox;
    async fn new() -> Self {
        TestDb::new(4).await
    }
    fn pool(&self) -> &sqlx::PgPool {
        &self.pool
    }
    fn outbox(&self, max_payload_bytes: usize) -> Self::O {
        self.outbox().max_payload_bytes(max_payload_bytes)
    }
    fn elsewhere(&self, tables: Tables) -> Self::O {
        outbox::postgres::PgOutbox::new(tables)
    }
    async fn event_ids(&self) -> Vec<String> {
        let sql = "SELECT event_id::text FROM {schema}.{events} ORDER BY id";
        sqlx::query_scalar(&self.tables.render(sql))
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }
    async fn inbox_rows(&self) -> Vec<(String, String, Option<String>)> {
        let sql = "SELECT consumer, event_id, event_type FROM {schema}.inbox";
        sqlx::query_as(&self.tables.render(sql))
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }
    async fn age_inbox_except(&self, keep: &str) {
        let sql = "UPDATE {schema}.inbox SET processed_at = now() - interval '8 days' \
                   WHERE event_id <> $1";
        sqlx::query(&self.tables.render(sql))
            .bind(keep)
            .execute(&self.pool)
            .await
            .unwrap();
    }
}

impl Fixture for MySqlDb {
    type O = outbox::mysql::MySqlOutbox;
    async fn new() -> Self {
        MySqlDb::new(4).await
    }
    fn pool(&self) -> &sqlx::MySqlPool {
        &self.pool
    }
    fn outbox(&self, max_payload_bytes: usize) -> Self::O {
        outbox::mysql::MySqlOutbox::new(self.tables.clone()).max_payload_bytes(max_payload_bytes)
    }
    fn elsewhere(&self, tables: Tables) -> Self::O {
        outbox::mysql::MySqlOutbox::new(tables)
    }
    async fn event_ids(&self) -> Vec<String> {
        let sql = "SELECT CAST(event_id AS CHAR) FROM {events} ORDER BY id";
        sqlx::query_scalar(&self.tables.render_mysql(sql))
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }
    async fn inbox_rows(&self) -> Vec<(String, String, Option<String>)> {
        let sql = "SELECT CAST(consumer AS CHAR), CAST(event_id AS CHAR), \
                   CAST(event_type AS CHAR) FROM {inbox}";
        sqlx::query_as(&self.tables.render_mysql(sql))
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }
    async fn age_inbox_except(&self, keep: &str) {
        let sql = "UPDATE {inbox} SET processed_at = UTC_TIMESTAMP(6) - INTERVAL 8 DAY \
                   WHERE event_id <> ?";
        sqlx::query(&self.tables.render_mysql(sql))
            .bind(keep)
            .execute(&self.pool)
            .await
            .unwrap();
    }
}

impl Fixture for SqliteFile {
    type O = outbox::sqlite::SqliteOutbox;
    async fn new() -> Self {
        SqliteFile::new().await
    }
    fn pool(&self) -> &sqlx::SqlitePool {
        &self.pool
    }
    fn outbox(&self, max_payload_bytes: usize) -> Self::O {
        outbox::sqlite::SqliteOutbox::new(self.tables.clone()).max_payload_bytes(max_payload_bytes)
    }
    fn elsewhere(&self, tables: Tables) -> Self::O {
        outbox::sqlite::SqliteOutbox::new(tables)
    }
    async fn event_ids(&self) -> Vec<String> {
        let sql = "SELECT event_id FROM {events} ORDER BY id";
        sqlx::query_scalar(&self.tables.render_sqlite(sql))
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }
    async fn inbox_rows(&self) -> Vec<(String, String, Option<String>)> {
        let sql = "SELECT consumer, event_id, event_type FROM {inbox}";
        sqlx::query_as(&self.tables.render_sqlite(sql))
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }
    async fn age_inbox_except(&self, keep: &str) {
        let sql = "UPDATE {inbox} SET processed_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', \
                   '-8 days') WHERE event_id <> ?";
        sqlx::query(&self.tables.render_sqlite(sql))
            .bind(keep)
            .execute(&self.pool)
            .await
            .unwrap();
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Opened {
    owner: String,
}

impl DomainEvent for Opened {
    const AGGREGATE_TYPE: &'static str = "acct";
    const EVENT_TYPE: &'static str = "Opened";
}

/// Committed events are there in the order written; rolled-back ones never existed.
async fn enqueue_is_transactional_and_ordered<F: Fixture>() {
    let db = F::new().await;
    let outbox = db.outbox(1 << 20);
    let mut tx = db.pool().begin().await.unwrap();
    let mut ids = outbox
        .enqueue_batch(
            &mut tx,
            &[
                Event::new("acct", "1", "Credited").aggregate_version(2),
                Event::new("acct", "1", "Debited").aggregate_version(3),
            ],
        )
        .await
        .unwrap();
    ids.push(
        outbox
            .publish(
                &mut tx,
                2,
                &Opened {
                    owner: "ann".into(),
                },
            )
            .await
            .unwrap(),
    );
    tx.commit().await.unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    outbox
        .enqueue(&mut tx, &Event::new("acct", "3", "Opened"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let written: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
    assert_eq!(db.event_ids().await, written);
    let mut tx = db.pool().begin().await.unwrap();
    assert_eq!(
        outbox.enqueue_batch(&mut tx, &[]).await.unwrap(),
        Vec::<uuid::Uuid>::new(),
        "an empty batch writes nothing"
    );
}

/// Bad events are refused with errors naming the problem, and nothing of their batch is written.
async fn bad_events_get_errors_naming_the_problem<F: Fixture>() {
    let db = F::new().await;
    let outbox = db.outbox(64);
    let mut tx = db.pool().begin().await.unwrap();
    outbox
        .enqueue(
            &mut tx,
            &Event::new("acct", "1", "Opened").aggregate_version(1),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut tx = db.pool().begin().await.unwrap();
    let err = outbox
        .enqueue(
            &mut tx,
            &Event::new("acct", "1", "Debited").aggregate_version(1),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "aggregate acct/1 already has an event with version 1"
    );
    drop(tx);
    let mut tx = db.pool().begin().await.unwrap();
    // Keys compare byte for byte: "ACCT" is another aggregate than "acct".
    outbox
        .enqueue(
            &mut tx,
            &Event::new("ACCT", "1", "Opened").aggregate_version(1),
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
    assert!(
        err.to_string().contains("over the limit of 64 bytes"),
        "{err}"
    );
    let err = outbox
        .enqueue_batch(
            &mut tx,
            &[Event::new("a", "2", "T"), Event::new("a", "", "T")],
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid event: events[1].aggregate_id must not be empty"
    );
    tx.commit().await.unwrap();
    assert_eq!(db.event_ids().await.len(), 2, "nothing of a refused batch");
}

/// Writing into an outbox that was never migrated says to migrate.
async fn an_outbox_not_migrated_says_to_migrate<F: Fixture>() {
    let db = F::new().await;
    let outbox = db.elsewhere(Tables::new(&unique("none"), "events").unwrap());
    let mut tx = db.pool().begin().await.unwrap();
    let err = outbox
        .enqueue(&mut tx, &Event::new("a", "1", "T"))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "outbox schema: outbox tables not found; run `outbox migrate` first"
    );
}

/// `migrate` runs again with nothing to do, from several callers at once, and a printed
/// script of a migrated outbox holds no migration.
async fn migrations_are_idempotent_and_concurrent<F: Fixture>() {
    let db = F::new().await;
    let fresh = db.elsewhere(Tables::new(&unique("m"), "events").unwrap());
    let runs = (0..3).map(|_| fresh.migrate(db.pool(), MigrateOptions::default()));
    for result in futures::future::join_all(runs).await {
        result.unwrap();
    }
    fresh
        .migrate(db.pool(), MigrateOptions::default())
        .await
        .unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    fresh
        .enqueue(&mut tx, &Event::new("a", "1", "T"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let script = fresh
        .migration_script(Some(db.pool()), MigrateOptions::default())
        .await
        .unwrap();
    assert!(
        script.ends_with("-- Nothing to apply: the database has every migration of this build.\n"),
        "{script}"
    );
    let new = fresh
        .migration_script(None, MigrateOptions::default())
        .await
        .unwrap();
    assert!(new.contains("-- Migration 0001: "), "{new}");
}

/// Each event is new once per consumer; a rolled-back record never happened; the purge removes
/// old rows only, in batches.
async fn the_inbox_sees_each_event_once_per_consumer_and_purges_by_age<F: Fixture>() {
    let db = F::new().await;
    let inbox = db.outbox(1 << 20).inbox();
    let id = uuid::Uuid::now_v7();
    let mut tx = db.pool().begin().await.unwrap();
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
    assert_eq!(
        inbox.record(&mut tx, "Billing", id).await.unwrap(),
        Seen::New,
        "consumer names compare byte for byte"
    );
    tx.rollback().await.unwrap();
    // Rolled back with the business change: the event is new again.
    let mut tx = db.pool().begin().await.unwrap();
    assert!(inbox.record(&mut tx, "billing", id).await.unwrap().is_new());
    for _ in 0..25 {
        inbox
            .record(&mut tx, "billing", uuid::Uuid::now_v7())
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    db.age_inbox_except(&id.to_string()).await;
    let removed = inbox
        .purge(db.pool(), Duration::from_secs(7 * 86_400), 10)
        .await
        .unwrap();
    assert_eq!(removed, 25);
    let left = db.inbox_rows().await;
    assert_eq!(left, [("billing".into(), id.to_string(), None)]);
    let mut tx = db.pool().begin().await.unwrap();
    let err = inbox
        .record(&mut tx, " ", id)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(err, "invalid event: consumer must not be empty");
}

/// Any text id is a key of its own, a UUID recorded either way is one key, and ids no column
/// keeps as given are refused.
async fn the_inbox_takes_any_text_id_and_records_the_event_type<F: Fixture>() {
    let db = F::new().await;
    let inbox = db.outbox(1 << 20).inbox();
    let id = uuid::Uuid::now_v7();
    let mut tx = db.pool().begin().await.unwrap();
    let text = "A234-1234-1234";
    let event_type = Some("OrderPlaced");
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
    assert!(inbox.record(&mut tx, "billing", id).await.unwrap().is_new());
    let longest = "é".repeat(255);
    assert!(
        inbox
            .record_message(&mut tx, "billing", &longest, None)
            .await
            .unwrap()
            .is_new(),
        "255 characters of two bytes each fit"
    );
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
    let err = inbox
        .record_message(&mut tx, "billing", "ok", Some(""))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.ends_with("event_type must not be empty"), "{err}");
    tx.commit().await.unwrap();
    let mut rows = db.inbox_rows().await;
    rows.sort();
    let mut expected = vec![
        ("billing".into(), text.into(), event_type.map(String::from)),
        ("billing".into(), "a234-1234-1234".into(), None),
        ("billing".into(), id.to_string(), None),
        ("billing".into(), longest, None),
    ];
    expected.sort();
    assert_eq!(rows, expected);
}

/// A batch the database refuses half-way (a version already taken) writes none of its events,
/// even when the caller commits anyway, and the error names the event whose version is taken.
async fn a_batch_refused_by_the_database_writes_nothing<F: Fixture>() {
    let db = F::new().await;
    let outbox = db.outbox(1 << 20);
    let mut tx = db.pool().begin().await.unwrap();
    outbox
        .enqueue(
            &mut tx,
            &Event::new("acct", "1", "Opened").aggregate_version(1),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    let err = outbox
        .enqueue_batch(
            &mut tx,
            &[
                Event::new("acct", "2", "Opened").aggregate_version(1),
                Event::new("acct", "1", "Credited").aggregate_version(7),
                Event::new("acct", "1", "Debited").aggregate_version(1),
            ],
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "aggregate acct/1 already has an event with version 1"
    );
    // PostgreSQL has aborted the transaction; MySQL and SQLite commit what it holds.
    let _ = tx.commit().await;
    assert_eq!(db.event_ids().await.len(), 1, "none of the refused batch");
    let mut tx = db.pool().begin().await.unwrap();
    outbox
        .enqueue_batch(
            &mut tx,
            &[
                Event::new("acct", "2", "Opened").aggregate_version(1),
                Event::new("acct", "1", "Credited").aggregate_version(2),
            ],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.event_ids().await.len(), 3, "a good batch after it");
}

/// A consumer name no key column keeps as given is refused: two consumers whose names share
/// their first 255 characters must not share an inbox.
async fn the_inbox_refuses_consumer_names_it_cannot_keep<F: Fixture>() {
    let db = F::new().await;
    let inbox = db.outbox(1 << 20).inbox();
    let id = uuid::Uuid::now_v7();
    let mut tx = db.pool().begin().await.unwrap();
    let stem = "orders-projection-".repeat(15);
    for suffix in ["billing", "shipping"] {
        let err = inbox
            .record(&mut tx, &format!("{stem}{suffix}"), id)
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "invalid event: consumer must be at most 255 characters"
        );
    }
    let err = inbox
        .record(&mut tx, "bill\0ing", id)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(err, "invalid event: consumer must not contain NUL");
    let longest = "é".repeat(255);
    assert!(inbox.record(&mut tx, &longest, id).await.unwrap().is_new());
    tx.commit().await.unwrap();
    assert_eq!(db.inbox_rows().await, [(longest, id.to_string(), None)]);
}

/// The same tests, run against each backend.
macro_rules! conformance {
    ($($backend:ident: $fixture:ty),* $(,)?) => {$(
        mod $backend {
            #[tokio::test]
            async fn enqueue_is_transactional_and_ordered() {
                super::enqueue_is_transactional_and_ordered::<$fixture>().await
            }
            #[tokio::test]
            async fn bad_events_get_errors_naming_the_problem() {
                super::bad_events_get_errors_naming_the_problem::<$fixture>().await
            }
            #[tokio::test]
            async fn an_outbox_not_migrated_says_to_migrate() {
                super::an_outbox_not_migrated_says_to_migrate::<$fixture>().await
            }
            #[tokio::test]
            async fn migrations_are_idempotent_and_concurrent() {
                super::migrations_are_idempotent_and_concurrent::<$fixture>().await
            }
            #[tokio::test]
            async fn the_inbox_sees_each_event_once_per_consumer_and_purges_by_age() {
                super::the_inbox_sees_each_event_once_per_consumer_and_purges_by_age::<$fixture>()
                    .await
            }
            #[tokio::test]
            async fn a_batch_refused_by_the_database_writes_nothing() {
                super::a_batch_refused_by_the_database_writes_nothing::<$fixture>().await
            }
            #[tokio::test]
            async fn the_inbox_refuses_consumer_names_it_cannot_keep() {
                super::the_inbox_refuses_consumer_names_it_cannot_keep::<$fixture>().await
            }
            #[tokio::test]
            async fn the_inbox_takes_any_text_id_and_records_the_event_type() {
                super::the_inbox_takes_any_text_id_and_records_the_event_type::<$fixture>().await
            }
        }
    )*};
}

conformance! {
    postgres: outbox_testkit::TestDb,
    mysql: outbox_testkit::MySqlDb,
    sqlite: outbox_testkit::SqliteFile,
}
