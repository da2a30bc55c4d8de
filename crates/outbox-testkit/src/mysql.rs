//! A migrated MySQL / MariaDB outbox in a database of its own, dropped on drop.

use outbox::{mysql::MySqlOutbox, postgres::MigrateOptions, Event, Outbox, Tables};
use sqlx::{
    mysql::{MySqlConnectOptions, MySqlPoolOptions},
    ConnectOptions, Connection, MySqlPool,
};

/// The server the MySQL tests use: `OUTBOX_TEST_MYSQL_URL`, or the machine's MariaDB.
pub fn mysql_url() -> String {
    std::env::var("OUTBOX_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// A MySQL outbox for one test.
pub struct MySqlDb {
    /// Its database's name.
    pub database: String,
    /// `mysql://…/{database}`, what the CLI takes.
    pub url: String,
    /// A pool on it.
    pub pool: MySqlPool,
    /// Its tables (`outbox_events`, …).
    pub tables: Tables,
}

impl MySqlDb {
    /// A new database on the server of [`mysql_url`], migrated with `partitions` partitions.
    pub async fn new(partitions: i32) -> Self {
        let server: MySqlConnectOptions = mysql_url().parse().expect("a MySQL URL");
        let database = crate::unique("outbox");
        let mut admin = server.connect().await.expect("connect to MySQL");
        sqlx::raw_sql(&format!("CREATE DATABASE `{database}`"))
            .execute(&mut admin)
            .await
            .expect("create the test database");
        let _ = admin.close().await;
        let url = format!("{}/{database}", server_url());
        let pool = MySqlPoolOptions::new()
            .max_connections(8)
            .connect_with(server.database(&database))
            .await
            .expect("open the test database");
        let tables = Tables::default();
        MySqlOutbox::new(tables.clone())
            .migrate(
                &pool,
                MigrateOptions {
                    partitions: Some(partitions),
                    time_partition_days: None,
                },
            )
            .await
            .expect("migrate");
        Self {
            database,
            url,
            pool,
            tables,
        }
    }

    /// Writes `events` in one transaction.
    pub async fn enqueue(&self, events: &[Event]) {
        let mut tx = self.pool.begin().await.expect("begin");
        MySqlOutbox::new(self.tables.clone())
            .max_payload_bytes(1 << 20)
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
                .render_mysql("SELECT count(*) FROM {events} WHERE status = ?"),
        )
        .bind(status)
        .fetch_one(&self.pool)
        .await
        .expect("count")
    }

    /// Runs `sql` with its table names (`{events}`, `{holds}`, …) rendered.
    pub async fn exec(&self, sql: &str) {
        sqlx::raw_sql(&self.tables.render_mysql(sql))
            .execute(&self.pool)
            .await
            .expect("exec");
    }
}

/// [`mysql_url`] without its database.
fn server_url() -> String {
    let url = mysql_url();
    match url.rsplit_once('/') {
        Some((server, _)) if server.contains("://") && !server.ends_with('/') => server.into(),
        _ => url,
    }
}

impl Drop for MySqlDb {
    fn drop(&mut self) {
        let database = self.database.clone();
        // Drop runs outside async context guarantees: a thread with its own runtime.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let Ok(server) = mysql_url().parse::<MySqlConnectOptions>() else {
                    return;
                };
                if let Ok(mut conn) = server.connect().await {
                    // The test's own connections may still be open, one of them in a
                    // transaction whose locks would make DROP DATABASE wait: end them first.
                    let sessions: Vec<u64> = sqlx::query_scalar(
                        "SELECT id FROM information_schema.processlist WHERE db = ?",
                    )
                    .bind(&database)
                    .fetch_all(&mut conn)
                    .await
                    .unwrap_or_default();
                    for id in sessions {
                        let _ = sqlx::raw_sql(&format!("KILL {id}"))
                            .execute(&mut conn)
                            .await;
                    }
                    let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS `{database}`"))
                        .execute(&mut conn)
                        .await;
                    let _ = conn.close().await;
                }
            });
        })
        .join();
    }
}
