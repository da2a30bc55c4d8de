//! What `outbox doctor` reads of the recent events, on each database, from rows written with
//! SQL: kinds of event told apart byte for byte (`Placed` and `placed` are two subjects on a
//! broker), destinations kept, and a row it cannot read said rather than swallowed.

use outbox_relayer::doctor::{
    database::{examine, Examine, RecentEvent},
    Level,
};
use outbox_testkit::{MySqlDb, SqliteFile, TestDb};

/// Two event types that differ only in case, one with its own destination.
const ROWS: &str = "INSERT INTO {events}
    (event_id, aggregate_type, aggregate_id, event_type, destination, payload) VALUES
    ('00000000-0000-7000-8000-000000000001', 'shop', '1', 'Placed', NULL, '{}'),
    ('00000000-0000-7000-8000-000000000002', 'shop', '2', 'placed', NULL, '{}'),
    ('00000000-0000-7000-8000-000000000003', 'shop', '3', 'placed', 'Orders.Special', '{}')";

fn expected() -> Vec<RecentEvent> {
    let event = |event_type: &str, destination: Option<&str>| RecentEvent {
        aggregate_type: "shop".into(),
        event_type: event_type.into(),
        schema_version: 1,
        destination: destination.map(str::to_owned),
    };
    vec![
        event("Placed", None),
        event("placed", None),
        event("placed", Some("Orders.Special")),
    ]
}

async fn recent(db: &dyn Examine, tables: &outbox::Tables) -> Vec<RecentEvent> {
    let mut recent = db.recent(tables).await.expect("recent events read");
    recent.sort_by(|a, b| (&a.event_type, &a.destination).cmp(&(&b.event_type, &b.destination)));
    recent
}

#[tokio::test]
async fn postgres_tells_kinds_apart_byte_for_byte() {
    let db = TestDb::new(1).await;
    db.exec(&ROWS.replace("{events}", "{schema}.{events}"))
        .await;
    assert_eq!(recent(&db.pool, &db.tables).await, expected());
}

#[tokio::test]
async fn mysql_tells_kinds_apart_byte_for_byte() {
    let db = MySqlDb::new(1).await;
    db.exec(ROWS).await;
    assert_eq!(recent(&db.pool, &db.tables).await, expected());
}

#[tokio::test]
async fn sqlite_tells_kinds_apart_byte_for_byte() {
    let db = SqliteFile::new().await;
    db.exec(ROWS).await;
    assert_eq!(recent(&db.pool, &db.tables).await, expected());
}

#[tokio::test]
async fn a_row_it_cannot_read_is_a_warning_not_silence() {
    let db = SqliteFile::new().await;
    db.exec(ROWS).await;
    // An event type that is not text: SQLite stores what it is given.
    db.exec(
        "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, payload)
         VALUES ('00000000-0000-7000-8000-000000000004', 'shop', '4', x'ff', x'7b7d')",
    )
    .await;
    let found = examine(&db.pool, "", &db.tables).await;
    let check = found
        .checks
        .iter()
        .find(|c| c.name == "recent events")
        .expect("a recent events check");
    assert_eq!(check.level, Level::Warn);
    assert!(
        check
            .detail
            .contains("the broker checks look at no destination"),
        "{check:?}"
    );
    assert!(found.recent.is_empty());
}
