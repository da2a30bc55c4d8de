//! The relay against a real MySQL-family database (the machine's MariaDB) and NATS JetStream:
//! several relays sharing the partitions while one crashes, and rows written by hand.

mod common;

use std::{sync::Arc, time::Duration};

use outbox::Event;
use outbox_relayer::{Publisher, Relay, RelayConfig, RelayHandle};
use outbox_testkit::{unique, wait_until, MySqlDb, NatsReader, Report, NATS_URL};

const WAIT: Duration = Duration::from_secs(90);

/// `common::fast_config`, for the MySQL outbox (its tables are `outbox_*`).
fn config(prefix: &str, relay: &str) -> RelayConfig {
    RelayConfig {
        relay_id: Some(relay.into()),
        max_batch_size: 200,
        ..common::fast_config_for("outbox", prefix)
    }
}

async fn start(db: &MySqlDb, publisher: Arc<dyn Publisher>, config: RelayConfig) -> RelayHandle {
    Relay::builder(db.pool.clone(), publisher, config)
        .build()
        .await
        .expect("relay")
        .spawn()
}

async fn drained(db: &MySqlDb) {
    wait_until("the outbox to drain", WAIT, || async {
        db.count("pending").await == 0
    })
    .await;
}

/// Writes `versions` events for each of `aggregates` aggregates, in transactions of `chunk`
/// events that interleave the aggregates; returns how many.
async fn write_sequences(db: &MySqlDb, aggregates: usize, versions: i64, chunk: usize) -> usize {
    let all: Vec<Event> = (1..=versions)
        .flat_map(|v| {
            (0..aggregates)
                .map(move |a| Event::new("order", format!("a{a}"), "Placed").aggregate_version(v))
        })
        .collect();
    for events in all.chunks(chunk) {
        db.enqueue(events).await;
    }
    all.len()
}

#[tokio::test]
async fn three_relays_keep_every_aggregate_in_order_while_one_crashes() {
    let db = Arc::new(MySqlDb::new(16).await);
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let publisher = common::nats(NATS_URL, &reader.stream).await;
    let a = start(&db, publisher.clone(), config(&prefix, "relay-1")).await;
    let b = start(&db, publisher.clone(), config(&prefix, "relay-2")).await;
    let c = start(&db, publisher.clone(), config(&prefix, "relay-3")).await;
    let (aggregates, versions) = (200, 20);
    let writer = {
        let db = db.clone();
        tokio::spawn(async move { write_sequences(&db, aggregates, versions, 97).await })
    };
    // Crash one relay mid-run (no release: its leases must expire and be taken over).
    reader.wait_for(1_000, WAIT).await;
    b.abort();
    reader.wait_for(2_000, WAIT).await;
    let b2 = start(&db, publisher.clone(), config(&prefix, "relay-4")).await;
    let written = writer.await.unwrap();
    assert_eq!(written, aggregates * versions as usize);
    drained(&db).await;
    let deliveries = reader.wait_for(written, WAIT).await;
    for relay in [a, c, b2] {
        relay.shutdown().await.unwrap();
    }
    let report = Report::of(&deliveries);
    println!("three relays on MySQL: {written} written, {report:?}");
    assert_eq!(report.unique, written, "every committed event delivered");
    assert_eq!(report.order_violations, 0);
    assert_eq!(db.count("dead").await, 0);
    reader.cleanup().await;
}

#[tokio::test]
async fn rows_written_by_hand_get_clear_errors_and_never_stop_the_relay() {
    let db = MySqlDb::new(4).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    // Rows as a service in another language might write them, at the SQL text level.
    let insert = "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, \
                  payload, content_type, headers) VALUES (?, 'doc', ?, 'Saved', ?, ?, ?)";
    let uuid = || uuid::Uuid::now_v7().to_string();
    // (aggregate id, event id, payload, content type, headers, the error expected)
    type Case = (
        &'static str,
        String,
        Vec<u8>,
        &'static str,
        &'static str,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            "not-a-uuid",
            "order-17".into(),
            b"{}".to_vec(),
            "application/json",
            "{}",
            "event_id \"order-17\" is not a UUID",
        ),
        (
            "array-headers",
            uuid(),
            b"{}".to_vec(),
            "application/json",
            "[1,2]",
            "headers must be a JSON object",
        ),
        (
            "number-header",
            uuid(),
            b"{}".to_vec(),
            "application/json",
            r#"{"n":1}"#,
            "header \"n\" must be a string",
        ),
        (
            "empty-type",
            uuid(),
            b"{}".to_vec(),
            "",
            "{}",
            "content_type \"\" is empty",
        ),
        (
            "huge",
            uuid(),
            vec![b'x'; 3 * 1024 * 1024],
            "text/plain",
            "{}",
            "over the limit",
        ),
        (
            "crlf-header",
            uuid(),
            b"{}".to_vec(),
            "application/json",
            r#"{"x":"a\r\nb"}"#,
            "contains CR, LF",
        ),
        ("good", uuid(), b"{}".to_vec(), "application/json", "{}", ""),
    ];
    for (aggregate, event_id, payload, content_type, headers, _) in &cases {
        sqlx::query(&db.tables.render_mysql(insert))
            .bind(event_id)
            .bind(aggregate)
            .bind(payload)
            .bind(content_type)
            .bind(headers)
            .execute(&db.pool)
            .await
            .unwrap();
    }
    // What the table refuses, it refuses at the writer, naming the column.
    for (sql, column) in [
        (
            "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES (UUID(), 'doc', 'n', 'Saved', NULL)",
            "payload",
        ),
        (
            "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES (UUID(), '', 'n', 'Saved', '')",
            "aggregate_type",
        ),
        (
            "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, payload, \
             headers) VALUES (UUID(), 'doc', 'n', 'Saved', '', '{not json')",
            "headers",
        ),
        (
            "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES (UUID(), 'doc', REPEAT('x', 256), 'Saved', '')",
            "aggregate_id",
        ),
    ] {
        let error = sqlx::query(&db.tables.render_mysql(sql))
            .execute(&db.pool)
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains(column), "{column}: {error}");
    }

    let relay = start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        config(&prefix, "relay-1"),
    )
    .await;
    wait_until("every bad row to be dead", WAIT, || async {
        db.count("dead").await == cases.len() as i64 - 1
    })
    .await;
    reader.wait_for(1, WAIT).await;
    // The relay is still alive and working: a new event after all that is published.
    db.enqueue(&[Event::new("doc", "after", "Saved")]).await;
    reader.wait_for(2, WAIT).await;
    relay.shutdown().await.unwrap();
    for (aggregate, _, _, _, _, expected) in cases.iter().filter(|c| !c.5.is_empty()) {
        let error: String = sqlx::query_scalar(&db.tables.render_mysql(
            "SELECT last_error FROM {events} WHERE aggregate_id = ? AND status = 'dead'",
        ))
        .bind(aggregate)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert!(
            error.contains(expected),
            "{aggregate}: {error:?} lacks {expected:?}"
        );
    }
    reader.cleanup().await;
}
