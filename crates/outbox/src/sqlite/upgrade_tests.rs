//! Upgrading a SQLite outbox through the migration that rebuilds its events table.

use sqlx::{sqlite::SqliteConnectOptions, Connection, SqliteConnection};

use super::{migrate_locked, migrate_with, MIGRATIONS, REBUILDS_EVENTS};
use crate::Tables;

#[tokio::test]
async fn the_rebuild_keeps_rows_ids_and_the_users_triggers_and_views() {
    let mut conn = SqliteConnection::connect_with(&SqliteConnectOptions::new().in_memory(true))
        .await
        .unwrap();
    let tables = Tables::new("outbox", "events").unwrap();
    let before = REBUILDS_EVENTS as usize - 1;
    migrate_with(&mut conn, &tables, &MIGRATIONS[..before])
        .await
        .unwrap();
    let sql = |s: &str| tables.render_sqlite(s);
    for statement in [
        "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('e1', 'order', '1', 'Placed', x'00'), ('e2', 'order', '2', 'Placed', x'00')",
        "DELETE FROM {events} WHERE event_id = 'e2'",
        "CREATE TABLE audit_log (event_id TEXT)",
        "CREATE TRIGGER audited AFTER INSERT ON {events} \
         BEGIN INSERT INTO audit_log VALUES (NEW.event_id); END",
        "CREATE VIEW pending_v AS SELECT id FROM {events} WHERE status = 'pending'",
    ] {
        sqlx::raw_sql(&sql(statement))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    migrate_locked(&mut conn, &tables).await.unwrap();

    sqlx::raw_sql(&sql(
        "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('e3', 'order', '3', 'Placed', x'00')",
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    let rows: Vec<(i64, String, bool)> = sqlx::query_as(&sql(
        "SELECT id, event_id, enqueued_at IS NOT NULL FROM {events} ORDER BY id",
    ))
    .fetch_all(&mut conn)
    .await
    .unwrap();
    // The id of the deleted row is not given again.
    assert_eq!(
        rows,
        vec![(1, "e1".to_owned(), true), (3, "e3".to_owned(), true)]
    );
    let audited: Vec<String> = sqlx::query_scalar("SELECT event_id FROM audit_log")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(audited, vec!["e3".to_owned()], "the trigger is back");
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM pending_v")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(pending, 2, "the view is back");
}
