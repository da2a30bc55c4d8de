//! The CDC relay's catch-up (rows written before the slot, published from the table) against
//! rows the claim columns cannot read whole (and the same rows from the stream), on the
//! private logical PostgreSQL and NATS.

mod common;

use common::cdc::{cdc_config, outbox_on, start, with_slot, write, WAIT};
use outbox::postgres::WriteMode;
use outbox_testkit::{cdc_database_url, unique, wait_until, NatsReader, Report, TestDb, NATS_URL};

/// Writes, by hand, an event whose aggregate id is `bytes` long: compressible, so that the
/// aggregate index takes it, and over the 4 KiB a claim reads of a key.
async fn oversized_key(db: &TestDb, bytes: i32) -> i64 {
    sqlx::query_scalar(&db.tables.render(
        "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, event_type, \
         payload) VALUES (gen_random_uuid(), 'order', repeat('k', $1), 'Placed', '{}') \
         RETURNING id",
    ))
    .bind(bytes)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// Waits for row `id` to be a dead letter; its `last_error`.
async fn dead_letter(db: &TestDb, id: i64) -> String {
    let error = db
        .tables
        .render("SELECT last_error FROM {schema}.{events} WHERE id = $1 AND status = 'dead'");
    let read = || async {
        sqlx::query_scalar::<_, String>(&error)
            .bind(id)
            .fetch_optional(&db.pool)
            .await
            .unwrap()
    };
    wait_until(&format!("row {id} to be a dead letter"), WAIT, || async {
        read().await.is_some()
    })
    .await;
    read().await.expect("dead")
}

#[tokio::test]
async fn a_catch_up_row_with_an_oversized_aggregate_key_is_a_dead_letter_and_the_rest_flows() {
    let db = outbox_on(&cdc_database_url(), 2).await;
    let before = write(&db, WriteMode::Table, "old", 2, 2, 10).await;
    let huge = oversized_key(&db, 5000).await;
    let db = with_slot(db).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let publisher = common::nats(NATS_URL, &reader.stream).await;
    let relay = start(&db, publisher, cdc_config(&db, &prefix)).await;
    // Before the fix the catch-up read the same row again for ever (its key reads as a
    // digest the table path finds nothing under): nothing after it was ever published.
    let after = write(&db, WriteMode::Table, "new", 2, 2, 10).await;
    // The same row from the stream: a dead letter too.
    let streamed = oversized_key(&db, 6000).await;
    // Headers over 64 KiB as JSON text that compress to 1 KiB when stored: the stream and the
    // table path measure them alike (they once judged them apart, and the row went to NATS).
    let headers: i64 = sqlx::query_scalar(&db.tables.render(
        "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, event_type, \
         payload, headers) VALUES (gen_random_uuid(), 'order', 'h', 'Placed', '{}', \
         jsonb_build_object('h', repeat('a', 100000))) RETURNING id",
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let after = after + write(&db, WriteMode::Table, "newer", 2, 1, 10).await;
    let got = reader.wait_for(before + after, WAIT).await;
    let last_error = dead_letter(&db, huge).await;
    assert!(
        last_error.contains("aggregate_id is 5000 bytes"),
        "{last_error}"
    );
    dead_letter(&db, streamed).await;
    let last_error = dead_letter(&db, headers).await;
    assert!(
        last_error.contains("headers are 100009 bytes"),
        "{last_error}"
    );
    relay.shutdown().await.unwrap();
    let report = Report::of(&got);
    assert_eq!(report.unique, before + after, "{report:?}");
    assert_eq!(report.order_violations, 0, "{report:?}");
    reader.cleanup().await;
}
