//! The run's private database, PostgreSQL or MariaDB: the server the monkey crashes, and the
//! pool the writers and the tally use. Each operation is written once per database.

use std::time::Duration;

use outbox::{
    mysql::MySqlOutbox,
    postgres::{MigrateOptions, PgOutbox, WriteMode},
    Event, Outbox,
};
use outbox_testkit::{PrivateMariaDb, PrivatePostgres};
use sqlx::{mysql::MySqlPoolOptions, postgres::PgPoolOptions, MySql, MySqlPool, PgPool, Postgres};
use uuid::Uuid;

use super::tally::Row;

/// Which database a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatabaseKind {
    /// A private PostgreSQL (`initdb`, `postgres`).
    Postgres,
    /// A private MariaDB (`mariadb-install-db`, `mariadbd`).
    MariaDb,
}

/// The private server.
pub enum Server {
    /// PostgreSQL.
    Postgres(PrivatePostgres),
    /// MariaDB.
    MariaDb(PrivateMariaDb),
}

impl Server {
    /// Starts a server of `kind`; PostgreSQL with `wal_level = logical` when `logical`.
    pub async fn start(kind: DatabaseKind, logical: bool) -> Self {
        match (kind, logical) {
            (DatabaseKind::Postgres, false) => Self::Postgres(PrivatePostgres::start().await),
            (DatabaseKind::Postgres, true) => {
                Self::Postgres(PrivatePostgres::start_with(&["wal_level=logical"]).await)
            }
            (DatabaseKind::MariaDb, false) => Self::MariaDb(PrivateMariaDb::start().await),
            (DatabaseKind::MariaDb, true) => panic!("CDC needs PostgreSQL"),
        }
    }

    /// Its URL, as the relays and `outbox verify` take it.
    pub fn url(&self) -> String {
        match self {
            Self::Postgres(pg) => pg.url(),
            Self::MariaDb(my) => my.url(),
        }
    }

    /// Its name in the log.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Postgres(_) => "postgres",
            Self::MariaDb(_) => "mariadbd",
        }
    }

    /// SIGKILL.
    pub fn crash(&mut self) {
        match self {
            Self::Postgres(pg) => pg.crash(),
            Self::MariaDb(my) => my.crash(),
        }
    }

    /// Starts it again and waits until it answers (after crash recovery).
    pub async fn start_again(&mut self) {
        match self {
            Self::Postgres(pg) => pg.start_again().await,
            Self::MariaDb(my) => my.start_again().await,
        }
    }
}

/// A pool on the private server.
#[derive(Clone)]
pub enum Pool {
    /// PostgreSQL.
    Pg(PgPool),
    /// MariaDB.
    My(MySqlPool),
}

/// The writers' outbox on either database.
#[derive(Clone)]
pub struct Outboxes {
    pg: PgOutbox,
    my: MySqlOutbox,
}

impl Outboxes {
    /// PostgreSQL's writes in `mode` (MySQL has only the table).
    pub fn new(mode: WriteMode) -> Self {
        Self {
            pg: PgOutbox::default().write_mode(mode),
            my: MySqlOutbox::default(),
        }
    }
}

impl Pool {
    /// Connects to `server` with up to `max` connections.
    pub async fn connect(server: &Server, max: u32) -> Self {
        let url = server.url();
        match server {
            Server::Postgres(_) => Self::Pg(
                PgPoolOptions::new()
                    .max_connections(max)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect(&url)
                    .await
                    .expect("connect to the private PostgreSQL"),
            ),
            Server::MariaDb(_) => Self::My(
                MySqlPoolOptions::new()
                    .max_connections(max)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect(&url)
                    .await
                    .expect("connect to the private MariaDB"),
            ),
        }
    }

    /// Creates the outbox with `partitions` partitions.
    pub async fn migrate(&self, partitions: i32) {
        let options = MigrateOptions {
            partitions: Some(partitions),
            ..Default::default()
        };
        match self {
            Self::Pg(pool) => PgOutbox::default().migrate(pool, options).await,
            Self::My(pool) => MySqlOutbox::default().migrate(pool, options).await,
        }
        .expect("migrate");
    }

    /// The business table: one row per aggregate with its latest version.
    pub async fn prepare(&self, ids: &[String]) {
        match self {
            Self::Pg(pool) => {
                sqlx::raw_sql(
                    "CREATE TABLE chaos_aggregates (id text PRIMARY KEY, \
                     version bigint NOT NULL DEFAULT 0)",
                )
                .execute(pool)
                .await
                .expect("create chaos_aggregates");
                sqlx::query("INSERT INTO chaos_aggregates (id) SELECT unnest($1::text[])")
                    .bind(ids)
                    .execute(pool)
                    .await
                    .expect("insert aggregates");
            }
            Self::My(pool) => {
                sqlx::raw_sql(
                    "CREATE TABLE chaos_aggregates (id VARCHAR(64) PRIMARY KEY, \
                     version BIGINT NOT NULL DEFAULT 0) ENGINE = InnoDB",
                )
                .execute(pool)
                .await
                .expect("create chaos_aggregates");
                for id in ids {
                    sqlx::query("INSERT INTO chaos_aggregates (id) VALUES (?)")
                        .bind(id)
                        .execute(pool)
                        .await
                        .expect("insert aggregates");
                }
            }
        }
    }

    /// The final `(id, version)` of every aggregate.
    pub async fn business_versions(&self) -> Vec<(String, i64)> {
        let sql = "SELECT id, version FROM chaos_aggregates ORDER BY id";
        match self {
            Self::Pg(pool) => sqlx::query_as(sql).fetch_all(pool).await,
            Self::My(pool) => sqlx::query_as(sql).fetch_all(pool).await,
        }
        .expect("read chaos_aggregates")
    }

    /// Every row of the outbox table.
    pub async fn committed_rows(&self) -> Vec<Row> {
        type Raw = (String, String, Option<i64>, String);
        let rows: Vec<Raw> = match self {
            Self::Pg(pool) => {
                sqlx::query_as(
                    "SELECT event_id::text, aggregate_id, aggregate_version, status \
                 FROM outbox.events",
                )
                .fetch_all(pool)
                .await
            }
            Self::My(pool) => {
                sqlx::query_as(
                    "SELECT event_id, CONVERT(aggregate_id USING utf8mb4), aggregate_version, \
                 status FROM outbox_events",
                )
                .fetch_all(pool)
                .await
            }
        }
        .expect("read the outbox");
        rows.into_iter()
            .map(|(event_id, aggregate_id, version, status)| Row {
                event_id: Uuid::parse_str(&event_id).expect("the writers' event ids"),
                aggregate_id,
                version: version.unwrap_or(0),
                status,
            })
            .collect()
    }

    /// Pending rows (`i64::MAX` when the database cannot say).
    pub async fn pending(&self) -> i64 {
        match self {
            Self::Pg(pool) => {
                sqlx::query_scalar("SELECT count(*) FROM outbox.events WHERE status = 'pending'")
                    .fetch_one(pool)
                    .await
            }
            Self::My(pool) => {
                sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE status = 'pending'")
                    .fetch_one(pool)
                    .await
            }
        }
        .unwrap_or(i64::MAX)
    }

    /// A transaction.
    pub async fn begin(&self) -> Result<Txn, sqlx::Error> {
        Ok(match self {
            Self::Pg(pool) => Txn::Pg(pool.begin().await?),
            Self::My(pool) => Txn::My(pool.begin().await?),
        })
    }

    /// Closes the pool.
    pub async fn close(&self) {
        match self {
            Self::Pg(pool) => pool.close().await,
            Self::My(pool) => pool.close().await,
        }
    }
}

/// A writer's transaction.
pub enum Txn {
    /// PostgreSQL.
    Pg(sqlx::Transaction<'static, Postgres>),
    /// MariaDB.
    My(sqlx::Transaction<'static, MySql>),
}

impl Txn {
    /// The aggregate's version, its row locked until the end of the transaction.
    pub async fn lock_version(&mut self, aggregate: &str) -> Result<i64, String> {
        match self {
            Self::Pg(tx) => {
                sqlx::query_scalar("SELECT version FROM chaos_aggregates WHERE id = $1 FOR UPDATE")
                    .bind(aggregate)
                    .fetch_one(&mut **tx)
                    .await
            }
            Self::My(tx) => {
                sqlx::query_scalar("SELECT version FROM chaos_aggregates WHERE id = ? FOR UPDATE")
                    .bind(aggregate)
                    .fetch_one(&mut **tx)
                    .await
            }
        }
        .map_err(|e| e.to_string())
    }

    /// Sets the aggregate's version.
    pub async fn set_version(&mut self, aggregate: &str, version: i64) -> Result<(), String> {
        match self {
            Self::Pg(tx) => sqlx::query("UPDATE chaos_aggregates SET version = $2 WHERE id = $1")
                .bind(aggregate)
                .bind(version)
                .execute(&mut **tx)
                .await
                .map(drop),
            Self::My(tx) => sqlx::query("UPDATE chaos_aggregates SET version = ? WHERE id = ?")
                .bind(version)
                .bind(aggregate)
                .execute(&mut **tx)
                .await
                .map(drop),
        }
        .map_err(|e| e.to_string())
    }

    /// One event through `enqueue`, several through `enqueue_batch`.
    pub async fn enqueue(
        &mut self,
        outboxes: &Outboxes,
        batch: &[Event],
    ) -> Result<Vec<Uuid>, String> {
        match (self, batch) {
            (Self::Pg(tx), [event]) => outboxes.pg.enqueue(tx, event).await.map(|id| vec![id]),
            (Self::Pg(tx), _) => outboxes.pg.enqueue_batch(tx, batch).await,
            (Self::My(tx), [event]) => outboxes.my.enqueue(tx, event).await.map(|id| vec![id]),
            (Self::My(tx), _) => outboxes.my.enqueue_batch(tx, batch).await,
        }
        .map_err(|e| e.to_string())
    }

    /// Commits.
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        match self {
            Self::Pg(tx) => tx.commit().await,
            Self::My(tx) => tx.commit().await,
        }
    }

    /// Rolls back.
    pub async fn rollback(self) -> Result<(), sqlx::Error> {
        match self {
            Self::Pg(tx) => tx.rollback().await,
            Self::My(tx) => tx.rollback().await,
        }
    }
}
