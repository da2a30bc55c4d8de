//! Writers' text printed by CLI commands other than `dead-letters` (which escape field by
//! field) reaches the terminal escaped too: an event type with U+202E passes the relay's
//! printable check and is stored by a consumer in `consumer_held`; saga correlation ids and
//! states come from event data.

mod support;

use outbox_testkit::TestDb;
use support::run;

fn dangerous(text: &str) -> bool {
    text.chars()
        .any(|c| (c.is_control() && c != '\n') || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}'))
}

#[tokio::test]
async fn consumer_versions_held_escapes_writer_text() {
    let db = TestDb::new(2).await;
    sqlx::query(&db.tables.render(
        "INSERT INTO {schema}.consumer_held (consumer, message_id, event_id, event_type, \
         aggregate_type, aggregate_id, version, destination, headers, payload, reason, \
         next_attempt_at) VALUES ('c1', 'm1', gen_random_uuid(), $1, 'ord', 'o1', 3, 'x', \
         '\\x', '\\x', $2, now())",
    ))
    .bind("Order\u{202e}devreseR")
    .bind("waiting \x1b]0;pwned\x07\x1b[2J")
    .execute(&db.pool)
    .await
    .unwrap();
    let out = run(&[
        "consumer-versions",
        "held",
        "--consumer",
        "c1",
        "--database-url",
        &db.url,
        "--schema",
        &db.schema,
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(
        !dangerous(&text),
        "raw control/bidi characters reach the terminal: {text:?}"
    );
}

#[tokio::test]
async fn sagas_list_escapes_writer_text() {
    let db = TestDb::new(2).await;
    sqlx::query(&db.tables.render(
        "INSERT INTO {schema}.sagas (saga_type, correlation_id, state, data) \
         VALUES ('checkout', $1, 'paid', '{}')",
    ))
    .bind("o1\x1b[2J\x1b[HFAKE")
    .execute(&db.pool)
    .await
    .unwrap();
    let out = run(&[
        "sagas",
        "list",
        "--database-url",
        &db.url,
        "--schema",
        &db.schema,
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(
        !dangerous(&text),
        "raw control characters reach the terminal: {text:?}"
    );
}
