//! A migrated SQLite outbox in a file of its own, removed (with its WAL files) on drop.

use std::{path::PathBuf, time::Duration};

use outbox::{sqlite::SqliteOutbox, Event, Outbox, Tables};
use sqlx::{
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions},
    Connection,
};

/// A SQLite outbox for one test.
pub struct SqliteFile {
    /// The file.
    pub path: PathBuf,
    /// `sqlite://{path}`, what the CLI takes.
    pub url: String,
    /// A pool on it.
    pub pool: SqlitePool,
    /// Its tables (`outbox_events`, …).
    pub tables: Tables,
}

impl SqliteFile {
    /// A new file in the temporary directory, migrated.
    pub async fn new() -> Self {
        let path = std::env::temp_dir().join(format!("{}.db", crate::unique("outbox")));
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30));
        // A relay aborted mid-begin returns its connection inside a transaction: close it
        // (rolling back) rather than pool it holding the write lock.
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .after_release(|conn, _| Box::pin(async move { Ok(!conn.is_in_transaction()) }))
            .connect_with(options)
            .await
            .expect("open the SQLite file");
        let tables = Tables::default();
        SqliteOutbox::new(tables.clone())
            .migrate(&pool, Default::default())
            .await
            .expect("migrate");
        Self {
            url: format!("sqlite://{}", path.display()),
            path,
            pool,
            tables,
        }
    }

    /// Writes `events` in one transaction.
    pub async fn enqueue(&self, events: &[Event]) {
        let mut tx = self.pool.begin().await.expect("begin");
        SqliteOutbox::new(self.tables.clone())
            .enqueue_batch(&mut tx, events)
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
    }

    /// Rows with `status`.
    pub async fn count(&self, status: &str) -> i64 {
        sqlx::query_scalar(
            &self
                .tables
                .render_sqlite("SELECT count(*) FROM {events} WHERE status = ?"),
        )
        .bind(status)
        .fetch_one(&self.pool)
        .await
        .expect("count")
    }

    /// Runs `sql` with its table names (`{events}`, `{holds}`, …) rendered.
    pub async fn exec(&self, sql: &str) {
        sqlx::raw_sql(&self.tables.render_sqlite(sql))
            .execute(&self.pool)
            .await
            .expect("exec");
    }
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.path.display()));
        }
    }
}
