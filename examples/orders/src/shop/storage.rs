//! Where a run keeps its shop and its outbox: a schema of its own on PostgreSQL, a database of
//! its own on MySQL/MariaDB, a file of its own on SQLite (the embedded default). Each removed
//! at the end unless kept.

use std::{path::PathBuf, str::FromStr, sync::Arc, time::Duration};

use outbox::{
    mysql::{MySqlInbox, MySqlOutbox},
    postgres::{PgInbox, PgOutbox},
    sqlite::{SqliteInbox, SqliteOutbox},
    Inbox, MigrateOptions, Outbox, Seen, Tables,
};
use outbox_relayer::{Publisher, Relay, RelayConfig};
use sqlx::{
    mysql::{MySqlConnectOptions, MySqlPoolOptions},
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions},
    Connection, Database, Executor, IntoArguments, MySqlPool, PgPool, Pool, SqlitePool,
};
use uuid::Uuid;

use super::{apply, insert_order, Dialect, Order, OrderCreated, Statements, PRODUCTS};
use crate::BoxError;

/// Partitions of a run's outbox: a few, so that a takeover moves some.
const PARTITIONS: i32 = 8;

/// The shop and its outbox on one database.
pub struct Storage {
    db: Db,
    tables: Tables,
    sql: Statements,
}

enum Db {
    Postgres {
        pool: PgPool,
        outbox: PgOutbox,
        inbox: PgInbox,
    },
    MySql {
        pool: MySqlPool,
        outbox: MySqlOutbox,
        inbox: MySqlInbox,
        /// A connection to the URL's own database, to drop the run's at the end.
        server: MySqlPool,
        database: String,
    },
    Sqlite {
        pool: SqlitePool,
        outbox: SqliteOutbox,
        inbox: SqliteInbox,
        file: PathBuf,
    },
}

impl Storage {
    /// Opens the database of `url` (`postgres://…`, `mysql://…`, `mariadb://…`), or a new SQLite
    /// file in the temporary directory when `url` is `None`; creates the run's schema, database
    /// or file, migrates the outbox into it and installs the shop.
    pub async fn open(url: Option<&str>) -> Result<Self, BoxError> {
        let name = format!("orders_{:08x}", rand::random::<u32>());
        let storage = match url.map(|u| (u, u.split_once("://").map(|(scheme, _)| scheme))) {
            None => Self::open_sqlite(&name).await?,
            Some((url, Some("postgres" | "postgresql"))) => Self::open_postgres(url, &name).await?,
            Some((url, Some("mysql" | "mariadb"))) => Self::open_mysql(url, &name).await?,
            Some((url, _)) => {
                return Err(format!(
                    "--database-url: {url:?} is neither postgres://, mysql:// nor mariadb:// \
                     (without the flag the demo runs on SQLite, in a file of its own)"
                )
                .into())
            }
        };
        storage.install().await?;
        Ok(storage)
    }

    async fn open_postgres(url: &str, schema: &str) -> Result<Self, BoxError> {
        let pool = PgPool::connect(url).await?;
        let tables = Tables::new(schema, "events")?;
        let outbox = PgOutbox::new(tables.clone());
        let options = MigrateOptions {
            partitions: Some(PARTITIONS),
            ..Default::default()
        };
        outbox.migrate(&pool, options).await?;
        let db = Db::Postgres {
            pool,
            inbox: PgInbox::new(&tables),
            outbox,
        };
        Ok(Self::with(db, Dialect::Postgres, tables))
    }

    async fn open_mysql(url: &str, database: &str) -> Result<Self, BoxError> {
        let url = match url.strip_prefix("mariadb://") {
            Some(rest) => format!("mysql://{rest}"),
            None => url.to_owned(),
        };
        let server = MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await?;
        server
            .execute(format!("CREATE DATABASE {database}").as_str())
            .await?;
        let options = MySqlConnectOptions::from_str(&url)?.database(database);
        let pool = MySqlPoolOptions::new()
            .max_connections(16)
            .after_release(|conn, _| Box::pin(async move { Ok(!conn.is_in_transaction()) }))
            .connect_with(options)
            .await?;
        let tables = Tables::default();
        let outbox = MySqlOutbox::new(tables.clone());
        let options = MigrateOptions {
            partitions: Some(PARTITIONS),
            ..Default::default()
        };
        outbox.migrate(&pool, options).await?;
        let db = Db::MySql {
            pool,
            inbox: MySqlInbox::new(&tables),
            outbox,
            server,
            database: database.to_owned(),
        };
        Ok(Self::with(db, Dialect::MySql, tables))
    }

    async fn open_sqlite(name: &str) -> Result<Self, BoxError> {
        let dir = std::env::temp_dir().join(format!("outbox-demo-{name}"));
        std::fs::create_dir_all(&dir)?;
        let file = dir.join("shop.db");
        // The run aborts its first relay mid-flight (its `kill -9`): a transaction it had half
        // begun when its future was dropped is still open on the connection it returns. Such a
        // connection is closed, which rolls the transaction back, instead of pooled holding
        // SQLite's write lock (everyone else then failed with "database is locked" after the
        // 30 s busy timeout).
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .after_release(|conn, _| Box::pin(async move { Ok(!conn.is_in_transaction()) }))
            .connect_with(
                SqliteConnectOptions::new()
                    .filename(&file)
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .busy_timeout(Duration::from_secs(30)),
            )
            .await?;
        let tables = Tables::default();
        let outbox = SqliteOutbox::new(tables.clone());
        outbox.migrate(&pool, Default::default()).await?;
        let db = Db::Sqlite {
            pool,
            inbox: SqliteInbox::new(&tables),
            outbox,
            file,
        };
        Ok(Self::with(db, Dialect::Sqlite, tables))
    }

    fn with(db: Db, dialect: Dialect, tables: Tables) -> Self {
        Self {
            sql: Statements::new(dialect, &tables),
            db,
            tables,
        }
    }

    /// Where the outbox is.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    /// The shop's statements on this database.
    pub fn statements(&self) -> &Statements {
        &self.sql
    }

    /// The PostgreSQL pool, for the consumer runners (PostgreSQL only).
    pub fn postgres(&self) -> Option<&PgPool> {
        match &self.db {
            Db::Postgres { pool, .. } => Some(pool),
            _ => None,
        }
    }

    /// The database and where in it the run is, in words.
    pub fn describe(&self) -> String {
        match &self.db {
            Db::Postgres { .. } => format!("PostgreSQL (schema {})", self.tables.schema()),
            Db::MySql { database, .. } => format!("MySQL/MariaDB (database {database})"),
            Db::Sqlite { file, .. } => format!("SQLite ({})", file.display()),
        }
    }

    async fn install(&self) -> Result<(), sqlx::Error> {
        match &self.db {
            Db::Postgres { pool, .. } => install(pool, &self.sql).await,
            Db::MySql { pool, .. } => install(pool, &self.sql).await,
            Db::Sqlite { pool, .. } => install(pool, &self.sql).await,
        }
    }

    /// The order service: the `n`-th order and its `OrderCreated` event commit together.
    pub async fn place_order(&self, n: i64) -> Result<Uuid, BoxError> {
        let order = Order::nth(n);
        match &self.db {
            Db::Postgres { pool, outbox, .. } => place(pool, outbox, &self.sql, &order).await,
            Db::MySql { pool, outbox, .. } => place(pool, outbox, &self.sql, &order).await,
            Db::Sqlite { pool, outbox, .. } => place(pool, outbox, &self.sql, &order).await,
        }
    }

    /// Applies `order` for `consumer` once: the inbox row and the effect commit together; a
    /// duplicate changes nothing.
    pub async fn consume(
        &self,
        consumer: &str,
        event_id: Uuid,
        order: &OrderCreated,
    ) -> Result<Seen, BoxError> {
        let sql = &self.sql;
        match &self.db {
            Db::Postgres { pool, inbox, .. } => {
                consume(pool, inbox, sql, consumer, event_id, order).await
            }
            Db::MySql { pool, inbox, .. } => {
                consume(pool, inbox, sql, consumer, event_id, order).await
            }
            Db::Sqlite { pool, inbox, .. } => {
                consume(pool, inbox, sql, consumer, event_id, order).await
            }
        }
    }

    /// The single number `sql` (one of [`Statements`]' counts) selects.
    pub async fn count(&self, sql: &str) -> Result<i64, sqlx::Error> {
        match &self.db {
            Db::Postgres { pool, .. } => sqlx::query_scalar(sql).fetch_one(pool).await,
            Db::MySql { pool, .. } => sqlx::query_scalar(sql).fetch_one(pool).await,
            Db::Sqlite { pool, .. } => sqlx::query_scalar(sql).fetch_one(pool).await,
        }
    }

    /// A relay over this outbox.
    pub async fn relay(
        &self,
        publisher: Arc<dyn Publisher>,
        config: RelayConfig,
    ) -> Result<Relay, outbox_relayer::Error> {
        let storage: outbox_relayer::Storage = match &self.db {
            Db::Postgres { pool, .. } => pool.clone().into(),
            Db::MySql { pool, .. } => pool.clone().into(),
            Db::Sqlite { pool, .. } => pool.clone().into(),
        };
        Relay::builder(storage, publisher, config).build().await
    }

    /// Drops the run's schema or database, or deletes its SQLite file.
    pub async fn remove(&self) {
        match &self.db {
            Db::Postgres { pool, .. } => {
                let drop = self.tables.render("DROP SCHEMA IF EXISTS {schema} CASCADE");
                let _ = sqlx::raw_sql(&drop).execute(pool).await;
            }
            Db::MySql {
                pool,
                server,
                database,
                ..
            } => {
                pool.close().await;
                let drop = format!("DROP DATABASE IF EXISTS {database}");
                let _ = server.execute(drop.as_str()).await;
            }
            Db::Sqlite { pool, file, .. } => {
                pool.close().await;
                if let Some(dir) = file.parent() {
                    let _ = std::fs::remove_dir_all(dir);
                }
            }
        }
    }
}

/// The order and its event in one transaction, on any database: written against the
/// [`Outbox`] trait.
async fn place<O: Outbox>(
    pool: &Pool<O::Database>,
    outbox: &O,
    sql: &Statements,
    order: &Order,
) -> Result<Uuid, BoxError>
where
    for<'e> &'e mut <O::Database as Database>::Connection: Executor<'e, Database = O::Database>,
    for<'q> <O::Database as Database>::Arguments<'q>: IntoArguments<'q, O::Database>,
    for<'q> i64: sqlx::Encode<'q, O::Database> + sqlx::Type<O::Database>,
    for<'q> String: sqlx::Encode<'q, O::Database> + sqlx::Type<O::Database>,
{
    let mut tx = pool.begin().await?;
    insert_order::<O::Database>(&mut tx, sql, order).await?;
    let id = outbox.publish(&mut tx, order.id, &order.created()).await?;
    tx.commit().await?;
    Ok(id)
}

/// The inbox row and the effect in one transaction, on any database: written against the
/// [`Inbox`] trait.
async fn consume<I: Inbox>(
    pool: &Pool<I::Database>,
    inbox: &I,
    sql: &Statements,
    consumer: &str,
    event_id: Uuid,
    order: &OrderCreated,
) -> Result<Seen, BoxError>
where
    for<'e> &'e mut <I::Database as Database>::Connection: Executor<'e, Database = I::Database>,
    for<'q> <I::Database as Database>::Arguments<'q>: IntoArguments<'q, I::Database>,
    for<'q> i64: sqlx::Encode<'q, I::Database> + sqlx::Type<I::Database>,
    for<'q> String: sqlx::Encode<'q, I::Database> + sqlx::Type<I::Database>,
{
    let mut tx = pool.begin().await?;
    let seen = inbox.record(&mut tx, consumer, event_id).await?;
    if seen == Seen::New {
        apply::<I::Database>(&mut tx, sql, consumer, event_id, order).await?;
    }
    tx.commit().await?;
    Ok(seen)
}

/// Creates the shop's tables and stocks its products.
async fn install<DB>(pool: &Pool<DB>, sql: &Statements) -> Result<(), sqlx::Error>
where
    DB: Database,
    for<'e> &'e mut DB::Connection: Executor<'e, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    for statement in &sql.install {
        sqlx::query::<DB>(statement).execute(pool).await?;
    }
    for (sku, available) in PRODUCTS {
        sqlx::query::<DB>(&sql.stock)
            .bind((*sku).to_owned())
            .bind(*available)
            .execute(pool)
            .await?;
    }
    Ok(())
}
