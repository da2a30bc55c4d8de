//! Rows that used to be published wrong or take the relay down: on SQLite, an event id that is
//! not a UUID (published as the nil UUID, which the broker's deduplication and every inbox then
//! took for one event) and a time that cannot be parsed (published as "now"); anywhere, a
//! publisher that panics on one event. Each ends as a dead letter naming the reason, after a
//! bounded number of attempts, and the other events flow.

mod common;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::future::BoxFuture;
use outbox::{sqlite::SqliteOutbox, Event, Outbox, Tables};
use outbox_relayer::{retry::RetryPolicy, Message, PublishError, Publisher, Relay, RelayConfig};
use outbox_testkit::{wait_until, SqliteFile};

/// Records what it acknowledges; panics on the events whose aggregate id is `panic` (when the
/// publish starts) or `panic-later` (while it runs).
#[derive(Default)]
struct Recorder(Mutex<Vec<Message>>);

impl Publisher for Recorder {
    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        if message.aggregate_id == "panic" {
            panic!("a publisher bug this event triggers");
        }
        Box::pin(async move {
            tokio::task::yield_now().await;
            if message.aggregate_id == "panic-later" {
                panic!("a bug while publishing");
            }
            self.0.lock().unwrap().push(message.clone());
            Ok(())
        })
    }
    fn name(&self) -> &'static str {
        "recorder"
    }
    fn max_payload_bytes(&self) -> usize {
        1 << 20
    }
}

fn config() -> RelayConfig {
    RelayConfig {
        lease_ttl: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(500),
        poll_interval: Duration::from_millis(100),
        stats_interval: Duration::from_millis(500),
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(100),
            max_transient_backoff: Duration::from_millis(100),
            max_attempts: 3,
        },
        ..Default::default()
    }
}

/// The status, last error and attempts of the row of `aggregate_id`.
async fn status(db: &SqliteFile, aggregate_id: &str) -> (String, Option<String>, i32) {
    sqlx::query_as(
        &db.tables.render_sqlite(
            "SELECT status, last_error, attempts FROM {events} WHERE aggregate_id = ?",
        ),
    )
    .bind(aggregate_id)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn sqlite_rows_with_an_id_or_a_time_the_relay_cannot_read_are_dead_letters() {
    let db = SqliteFile::new().await;
    let insert = Tables::default().render_sqlite(
        "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, payload, \
         occurred_at) VALUES (?, 'order', ?, 'Placed', X'7B7D', coalesce(?, \
         strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))",
    );
    for (event_id, aggregate_id, occurred_at) in [
        ("not-a-uuid", "bad-id", None),
        ("42", "numeric-id", None),
        (
            "0192f0c4-7d1e-7b3a-9c55-1d2e3f405162",
            "bad-time",
            Some("yesterday"),
        ),
        ("0192f0c4-7d1e-7b3a-9c55-1d2e3f405163", "good", None),
    ] {
        sqlx::query(&insert)
            .bind(event_id)
            .bind(aggregate_id)
            .bind(occurred_at)
            .execute(&db.pool)
            .await
            .unwrap();
    }
    let recorder = Arc::new(Recorder::default());
    let relay = Relay::builder(db.pool.clone(), recorder.clone(), config())
        .build()
        .await
        .unwrap()
        .spawn();
    wait_until(
        "the readable event published, the others dead",
        Duration::from_secs(20),
        || async {
            status(&db, "good").await.0 == "published"
                && status(&db, "bad-id").await.0 == "dead"
                && status(&db, "numeric-id").await.0 == "dead"
                && status(&db, "bad-time").await.0 == "dead"
        },
    )
    .await;
    relay.shutdown().await.unwrap();
    for (aggregate_id, reason) in [
        ("bad-id", "event_id \"not-a-uuid\" is not a UUID"),
        ("numeric-id", "event_id \"42\" is not a UUID"),
        (
            "bad-time",
            "occurred_at \"yesterday\" is not a time the relay can read",
        ),
    ] {
        let error = status(&db, aggregate_id).await.1.unwrap_or_default();
        assert!(error.contains(reason), "{aggregate_id}: {error}");
    }
    let published: Vec<String> = (recorder.0.lock().unwrap().iter())
        .map(|m| m.event_id.to_string())
        .collect();
    assert_eq!(
        published,
        vec!["0192f0c4-7d1e-7b3a-9c55-1d2e3f405163"],
        "only the readable event reached the broker"
    );

    // The operators see these rows as they are, with rows written in types no writer should
    // use beside them (bytes that are not UTF-8, a text version, headers that are not JSON),
    // and can replay them.
    sqlx::raw_sql(&db.tables.render_sqlite(
        "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type,
                               schema_version, payload, headers, status, last_error)
         VALUES ('0192f0c4-7d1e-7b3a-9c55-1d2e3f405164', X'FF6F72646572', 'bytes', 'Placed',
                 'one', 'text payload', 'not json', 'dead', 'permanent: hand-written')",
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let admin = outbox_relayer::admin::Admin::sqlite(db.pool.clone(), &db.tables);
    let dead = admin.dead_letters(&Default::default()).await.unwrap();
    let shown: Vec<(&str, &str, Option<String>)> = dead
        .iter()
        .map(|d| {
            let at = d.occurred_at.map(|_| "a time".to_owned());
            (d.aggregate_id.as_str(), d.event_id.as_str(), at)
        })
        .collect();
    assert_eq!(
        shown,
        vec![
            ("bad-id", "not-a-uuid", Some("a time".into())),
            ("numeric-id", "42", Some("a time".into())),
            ("bad-time", "0192f0c4-7d1e-7b3a-9c55-1d2e3f405162", None),
            (
                "bytes",
                "0192f0c4-7d1e-7b3a-9c55-1d2e3f405164",
                Some("a time".into())
            ),
        ]
    );
    let bytes = &dead[3];
    assert_eq!(bytes.aggregate_type, "\u{FFFD}order");
    assert_eq!(bytes.schema_version, 0, "'one' cast to a number");
    assert_eq!(bytes.headers, serde_json::json!("not json"));
    assert_eq!(bytes.payload_size, 12);
    let ids: Vec<i64> = dead.iter().map(|d| d.id).collect();
    assert_eq!(admin.replay(&ids, "test", "hostile rows").await.unwrap(), 4);
    assert_eq!(status(&db, "bad-id").await.0, "pending");
    let audit = admin.audit(10).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(
        (audit[0].action.as_str(), &audit[0].event_ids),
        ("replay", &ids)
    );
}

#[tokio::test]
async fn an_event_that_makes_the_publisher_panic_is_dead_lettered_and_the_rest_flow() {
    let db = SqliteFile::new().await;
    let outbox = SqliteOutbox::new(Tables::default());
    let mut tx = db.pool.begin().await.unwrap();
    let events: Vec<Event> = ["panic", "a", "panic-later", "b", "c"]
        .iter()
        .map(|id| Event::new("order", *id, "Placed").payload(b"{}".to_vec(), "application/json"))
        .collect();
    outbox.enqueue_batch(&mut tx, &events).await.unwrap();
    tx.commit().await.unwrap();
    let recorder = Arc::new(Recorder::default());
    let relay = Relay::builder(db.pool.clone(), recorder.clone(), config())
        .build()
        .await
        .unwrap()
        .spawn();
    wait_until(
        "the panicking events dead",
        Duration::from_secs(20),
        || async {
            status(&db, "panic").await.0 == "dead" && status(&db, "panic-later").await.0 == "dead"
        },
    )
    .await;
    wait_until("the others published", Duration::from_secs(20), || async {
        recorder.0.lock().unwrap().len() == 3
    })
    .await;
    assert!(!relay.is_finished(), "the relay is still running");
    relay.shutdown().await.unwrap();
    let (_, error, attempts) = status(&db, "panic").await;
    let error = error.unwrap_or_default();
    assert!(
        error.contains("the recorder publisher panicked: a publisher bug this event triggers"),
        "{error}"
    );
    assert_eq!(
        attempts, 3,
        "dead after max_attempts permanent failures, not a crash loop"
    );
    let (_, error, _) = status(&db, "panic-later").await;
    assert!(error
        .unwrap_or_default()
        .contains("the recorder publisher panicked: a bug while publishing"));
}

/// PostgreSQL rows the relay's own statements used to stumble on.
mod postgres {
    use outbox_testkit::TestDb;

    use super::*;

    async fn insert(db: &TestDb, aggregate_id: &str, attempts: i32) {
        db.exec(&format!(
            "INSERT INTO {{schema}}.{{events}} (event_id, aggregate_type, aggregate_id, \
             event_type, payload, attempts, permanent_failures) VALUES (gen_random_uuid(), \
             'order', '{aggregate_id}', 'Placed', '\\x7b7d', {attempts}, {attempts})"
        ))
        .await;
    }

    /// A writer may store anything in the relay's columns: `attempts` at i32::MAX made the
    /// batch's `mark_published` fail ("integer out of range"), for ever, and with it every other
    /// event of the batch stayed unrecorded and was published again and again.
    #[tokio::test]
    async fn a_row_whose_counters_are_at_their_limit_is_published_and_recorded() {
        let db = TestDb::new(1).await;
        insert(&db, "at-the-limit", i32::MAX).await;
        for i in 0..5 {
            insert(&db, &format!("a{i}"), 0).await;
        }
        let recorder = Arc::new(Recorder::default());
        let relay = common::start(&db, recorder.clone(), common::fast_config(&db, "p")).await;
        common::drained(&db, Duration::from_secs(20)).await;
        relay.shutdown().await.unwrap();
        assert_eq!(db.count("published").await, 6);
        let attempts: i32 =
            sqlx::query_scalar(&db.tables.render(
                "SELECT attempts FROM {schema}.{events} WHERE aggregate_id = 'at-the-limit'",
            ))
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(attempts, i32::MAX, "saturated, not overflowed");
    }

    /// When the database refuses a batch's record for one row (here a user's trigger; any
    /// data exception, integrity or limit error alike), the other outcomes are written one by
    /// one: the partition goes on, and the refused row stays pending until it can be recorded.
    #[tokio::test]
    async fn outcomes_the_database_refuses_for_one_row_do_not_hold_back_the_others() {
        let db = TestDb::new(1).await;
        db.exec(
            "CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 RAISE EXCEPTION 'refused by a trigger' USING ERRCODE = '23514';
             END $$;
             CREATE TRIGGER refuse BEFORE UPDATE ON {schema}.{events} FOR EACH ROW
                 WHEN (OLD.aggregate_id = 'refused' AND NEW.status = 'published')
                 EXECUTE FUNCTION {schema}.refuse();",
        )
        .await;
        insert(&db, "refused", 0).await;
        for i in 0..5 {
            insert(&db, &format!("a{i}"), 0).await;
        }
        let recorder = Arc::new(Recorder::default());
        let relay = common::start(&db, recorder.clone(), common::fast_config(&db, "p")).await;
        wait_until(
            "the other events recorded",
            Duration::from_secs(20),
            || async { db.count("published").await == 5 },
        )
        .await;
        assert_eq!(
            db.count("pending").await,
            1,
            "the refused row stays pending"
        );
        db.exec("DROP TRIGGER refuse ON {schema}.{events}").await;
        common::drained(&db, Duration::from_secs(20)).await;
        relay.shutdown().await.unwrap();
        assert_eq!(db.count("published").await, 6);
    }
}
