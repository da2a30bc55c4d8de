//! The relay against real PostgreSQL and NATS JetStream.

mod common;

use std::time::Duration;

use outbox::{Event, Outbox};
use outbox_testkit::{insert_sequences, unique, wait_until, NatsReader, Report, TestDb, NATS_URL};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn publishes_committed_events_unchanged_and_nothing_from_rolled_back_ones() {
    let db = TestDb::new(8).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let outbox = db.outbox();

    let rolled_back = Event::new("order", "1", "Cancelled");
    let mut tx = db.pool.begin().await.unwrap();
    outbox.enqueue(&mut tx, &rolled_back).await.unwrap();
    tx.rollback().await.unwrap();

    let payload = br#"{"total":"19.90","note":"caf\u00e9"}"#.to_vec();
    let event = Event::new("order", "1", "Placed")
        .payload(payload.clone(), "application/json")
        .aggregate_version(1)
        .schema_version(2)
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        );
    let mut tx = db.pool.begin().await.unwrap();
    let id = outbox.enqueue(&mut tx, &event).await.unwrap();
    tx.commit().await.unwrap();

    let relay = common::start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        common::fast_config(&db, &prefix),
    )
    .await;
    let got = reader.wait_for(1, WAIT).await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();

    assert_eq!(got.len(), 1, "only the committed event: {got:?}");
    let m = &got[0];
    assert_eq!(m.payload, payload, "payload bytes unchanged");
    assert_eq!(m.destination, format!("{prefix}.order.Placed"));
    assert_eq!(m.event_id, id.to_string());
    assert_eq!(m.headers["Nats-Msg-Id"], id.to_string());
    assert_eq!(m.headers["event-type"], "Placed");
    assert_eq!(m.headers["schema-version"], "2");
    assert_eq!(m.headers["aggregate-type"], "order");
    assert_eq!(m.headers["aggregate-id"], "1");
    assert_eq!(m.headers["aggregate-version"], "1");
    assert_eq!(m.headers["content-type"], "application/json");
    assert!(m.headers["traceparent"].starts_with("00-4bf9"));
    assert_eq!(db.count("published").await, 1);
    // Nothing else arrives: the rolled-back event never existed.
    assert!(reader
        .deliveries()
        .iter()
        .all(|d| d.headers["event-type"] != "Cancelled"));
    reader.cleanup().await;
}

#[tokio::test]
async fn a_transaction_that_commits_late_is_still_published() {
    let db = TestDb::new(4).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let outbox = db.outbox();
    let relay = common::start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        common::fast_config(&db, &prefix),
    )
    .await;

    // The late transaction takes the smallest id, then stays open.
    let mut late = db.pool.begin().await.unwrap();
    let late_id = outbox
        .enqueue(&mut late, &Event::new("late", "L", "Happened"))
        .await
        .unwrap();
    // Many later transactions commit and are published meanwhile.
    insert_sequences(&db, "early", 20, 5, 10).await;
    reader.wait_for(100, WAIT).await;
    assert!(reader
        .deliveries()
        .iter()
        .all(|d| d.event_id != late_id.to_string()));

    late.commit().await.unwrap();
    wait_until("the late event to be published", WAIT, || async {
        reader
            .deliveries()
            .iter()
            .any(|d| d.event_id == late_id.to_string())
    })
    .await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();
    reader.cleanup().await;
}

#[tokio::test]
async fn three_relays_keep_every_aggregate_in_order_while_one_crashes() {
    let db = TestDb::new(16).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let publisher = common::nats(NATS_URL, &reader.stream).await;
    let config = |i: usize| outbox_relayer::RelayConfig {
        relay_id: Some(format!("relay-{i}")),
        max_batch_size: 200,
        ..common::fast_config(&db, &prefix)
    };
    let a = common::start(&db, publisher.clone(), config(1)).await;
    let b = common::start(&db, publisher.clone(), config(2)).await;
    let c = common::start(&db, publisher.clone(), config(3)).await;

    let (aggregates, versions) = (200, 20);
    let writer = {
        let db_pool = db.pool.clone();
        let tables = db.tables.clone();
        tokio::spawn(async move {
            let db = outbox_testkit::TestDb::adopt(db_pool, tables);
            insert_sequences(&db, "order", aggregates, versions, 97).await
        })
    };
    // Crash one relay mid-run (no release: its leases must expire and be taken over).
    reader.wait_for(1_000, WAIT).await;
    b.abort();
    reader.wait_for(2_000, WAIT).await;
    let b2 = common::start(&db, publisher.clone(), config(4)).await;
    let written = writer.await.unwrap();
    assert_eq!(written, aggregates * versions as usize);

    common::drained(&db, WAIT).await;
    let deliveries = reader.wait_for(written, WAIT).await;
    for relay in [a, c, b2] {
        relay.shutdown().await.unwrap();
    }
    let report = Report::of(&deliveries);
    println!("three relays: {written} written, {report:?}");
    assert_eq!(report.unique, written, "every committed event delivered");
    assert_eq!(report.order_violations, 0);
    assert_eq!(db.count("dead").await, 0);
    reader.cleanup().await;
}

#[tokio::test]
async fn a_permanent_failure_dead_letters_parks_its_aggregate_and_others_flow() {
    let db = TestDb::new(4).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let outbox = db.outbox();
    let mut tx = db.pool.begin().await.unwrap();
    // An invalid subject: NATS can never take it.
    outbox
        .enqueue(
            &mut tx,
            &Event::new("order", "X", "Placed")
                .aggregate_version(1)
                .destination("not a subject"),
        )
        .await
        .unwrap();
    outbox
        .enqueue(
            &mut tx,
            &Event::new("order", "X", "Paid").aggregate_version(2),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    insert_sequences(&db, "order", 10, 3, 10).await;

    let relay = common::start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        common::fast_config(&db, &prefix),
    )
    .await;
    reader.wait_for(30, WAIT).await;
    wait_until("the bad event to be dead", WAIT, || async {
        db.count("dead").await == 1
    })
    .await;
    relay.shutdown().await.unwrap();

    let (attempts, error): (i32, String) = sqlx::query_as(
        &db.tables
            .render("SELECT attempts, last_error FROM {schema}.{events} WHERE status = 'dead'"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(attempts, 3, "dead after max_attempts");
    assert!(error.contains("not a valid NATS subject"), "{error}");
    // X's next event waits behind the dead one; nothing of X was published.
    let pending: Vec<String> = sqlx::query_scalar(
        &db.tables
            .render("SELECT event_type FROM {schema}.{events} WHERE status = 'pending'"),
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(pending, vec!["Paid"]);
    assert!(reader.deliveries().iter().all(|d| d.aggregate_id != "X"));
    assert_eq!(reader.deliveries().len(), 30, "other aggregates flowed");
    reader.cleanup().await;
}

#[tokio::test]
async fn malformed_rows_written_by_hand_get_clear_errors_and_never_stop_the_relay() {
    let db = TestDb::new(4).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    // Rows as a service in another language might write them.
    let insert = "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, \
                  event_type, payload, content_type, headers) \
                  VALUES (gen_random_uuid(), 'doc', $1, 'Saved', $2, $3, $4::jsonb)";
    let cases: Vec<(&str, Vec<u8>, &str, &str, &str)> = vec![
        (
            "array-headers",
            b"{}".to_vec(),
            "application/json",
            "[1,2]",
            "headers must be a JSON object",
        ),
        (
            "number-header",
            b"{}".to_vec(),
            "application/json",
            r#"{"n":1}"#,
            "header \"n\" must be a string",
        ),
        (
            "null-headers",
            b"{}".to_vec(),
            "application/json",
            "null",
            "found null",
        ),
        (
            "empty-type",
            b"{}".to_vec(),
            "",
            "{}",
            "content_type \"\" is empty",
        ),
        (
            "huge",
            vec![b'x'; 3 * 1024 * 1024],
            "text/plain",
            "{}",
            "over the limit",
        ),
        (
            "crlf-header",
            b"{}".to_vec(),
            "application/json",
            r#"{"x":"a\r\nb"}"#,
            "contains CR, LF",
        ),
        ("good", b"{}".to_vec(), "application/json", "{}", ""),
    ];
    for (aggregate, payload, content_type, headers, _) in &cases {
        sqlx::query(&db.tables.render(insert))
            .bind(aggregate)
            .bind(payload)
            .bind(content_type)
            .bind(headers)
            .execute(&db.pool)
            .await
            .unwrap();
    }
    // NULLs and empty names are refused at the writer, with the column named.
    let null = sqlx::query(&db.tables.render(
        "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, event_type, \
         payload) VALUES (gen_random_uuid(), 'doc', 'n', 'Saved', NULL)",
    ))
    .execute(&db.pool)
    .await
    .unwrap_err()
    .to_string();
    assert!(null.contains("payload"), "{null}");
    let empty = sqlx::query(&db.tables.render(
        "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, event_type, \
         payload) VALUES (gen_random_uuid(), '', 'n', 'Saved', '')",
    ))
    .execute(&db.pool)
    .await
    .unwrap_err()
    .to_string();
    assert!(empty.contains("aggregate_type"), "{empty}");

    let relay = common::start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        common::fast_config(&db, &prefix),
    )
    .await;
    wait_until("every bad row to be dead", WAIT, || async {
        db.count("dead").await == cases.len() as i64 - 1
    })
    .await;
    reader.wait_for(1, WAIT).await;
    // The relay is still alive and working: a new event after all that is published.
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox()
        .enqueue(&mut tx, &Event::new("doc", "after", "Saved"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    reader.wait_for(2, WAIT).await;
    relay.shutdown().await.unwrap();

    for (aggregate, _, _, _, expected) in cases.iter().filter(|c| !c.4.is_empty()) {
        let error: String = sqlx::query_scalar(&db.tables.render(
            "SELECT last_error FROM {schema}.{events} WHERE aggregate_id = $1 AND status = 'dead'",
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
