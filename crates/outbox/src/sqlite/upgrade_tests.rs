//! Upgrading a SQLite outbox through the migration that rebuilds its events table.

use crate::backend::Outbox;
use sqlx::{sqlite::SqliteConnectOptions, Connection, SqliteConnection};

use super::{migrate_locked, migrate_with, MIGRATIONS, REBUILDS_EVENTS};
use crate::ident::Tables;
use crate::sqlite::SqliteOutbox;

#[tokio::test]
async fn the_rebuild_keeps_rows_ids_and_the_users_triggers_and_views() {
    let mut conn = SqliteConnection::connect_with(&SqliteConnectOptions::new().in_memory(true))
        .await
        .unwrap();
    let tables = Tables::new("outbox", "events").unwrap();
    before_the_rebuild(&mut conn, &tables).await;
    migrate_locked(&mut conn, &tables).await.unwrap();
    assert_rebuilt(&mut conn, &tables).await;
}

#[tokio::test]
async fn a_printed_script_sets_the_users_triggers_and_views_aside_too() {
    let path = std::env::temp_dir().join(format!("outbox-print-{}.db", uuid::Uuid::now_v7()));
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true);
    let tables = Tables::new("outbox", "events").unwrap();
    let mut conn = SqliteConnection::connect_with(&options).await.unwrap();
    before_the_rebuild(&mut conn, &tables).await;
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    let script = SqliteOutbox::new(tables.clone())
        .migration_script(Some(&pool), Default::default())
        .await
        .unwrap();
    pool.close().await;
    assert!(script.contains("DROP VIEW \"pending_v\""), "{script}");
    // The script without sqlite3's `.bail on`, which is not SQL.
    let sql: String = script
        .lines()
        .filter(|line| !line.starts_with('.'))
        .map(|line| format!("{line}\n"))
        .collect();
    sqlx::raw_sql(&sql).execute(&mut conn).await.unwrap();
    assert_rebuilt(&mut conn, &tables).await;
    drop(conn);
    let _ = std::fs::remove_file(&path);
}

/// An outbox at the migration before the rebuild, with rows (one deleted), a user's trigger
/// and a user's view.
async fn before_the_rebuild(conn: &mut SqliteConnection, tables: &Tables) {
    let before = REBUILDS_EVENTS as usize - 1;
    migrate_with(conn, tables, &MIGRATIONS[..before])
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
            .execute(&mut *conn)
            .await
            .unwrap();
    }
}

/// The rebuilt outbox kept its rows and ids, and the user's trigger and view work.
async fn assert_rebuilt(conn: &mut SqliteConnection, tables: &Tables) {
    let sql = |s: &str| tables.render_sqlite(s);

    sqlx::raw_sql(&sql(
        "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('e3', 'order', '3', 'Placed', x'00')",
    ))
    .execute(&mut *conn)
    .await
    .unwrap();
    let rows: Vec<(i64, String, bool)> = sqlx::query_as(&sql(
        "SELECT id, event_id, enqueued_at IS NOT NULL FROM {events} ORDER BY id",
    ))
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    // The id of the deleted row is not given again.
    assert_eq!(
        rows,
        vec![(1, "e1".to_owned(), true), (3, "e3".to_owned(), true)]
    );
    let audited: Vec<String> = sqlx::query_scalar("SELECT event_id FROM audit_log")
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    assert_eq!(audited, vec!["e3".to_owned()], "the trigger is back");
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM pending_v")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(pending, 2, "the view is back");
}
