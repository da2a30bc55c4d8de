//! How a relay is put together: [`Relay::builder`] takes the database, the publisher and the
//! configuration, and the optional parts (the CDC source's database, fan-out downcasts) before
//! anything is opened, so that a built relay is complete.

use std::sync::Arc;

use sqlx::{MySqlPool, PgPool, SqlitePool};

use crate::{
    admin::Admin,
    config::RelayConfig,
    error::Error,
    publisher::Publisher,
    relay::Relay,
    source::cdc::{CdcDb, PgCdc, ReplicationTarget},
    store::{MySqlStore, PgStore, SqliteStore, Store, Timeouts},
    wire::fanout::Downcasts,
};

/// The database a relay reads its outbox from.
///
/// Each pool converts into it (`pool.into()`): the relay opens that database's store and its
/// operator actions (the periodic purge). [`Storage::Store`] takes any [`Store`], without
/// operator actions (the simulation's model, a test double).
pub enum Storage {
    /// PostgreSQL (migrated with `outbox::postgres::PgOutbox::migrate`). The relay opens its
    /// own connections, lazily, with the pool's connect options and size, adding
    /// `statement_timeout` and `lock_timeout` from the configuration; its lease statements
    /// have two connections of their own.
    Postgres(PgPool),
    /// MySQL or MariaDB (migrated with `outbox::mysql::MySqlOutbox::migrate`). Partitions and
    /// leases as on PostgreSQL: any number of relays share the work. Each connection is set
    /// to an [`outbox::mysql::Session`] (READ COMMITTED, autocommit, the timeouts of
    /// [`RelayConfig::mysql_session`]), whatever the server's defaults.
    MySql(MySqlPool),
    /// SQLite (migrated with `outbox::sqlite::SqliteOutbox::migrate`). One relay publishes at
    /// a time; another on the same file waits as a standby.
    Sqlite(SqlitePool),
    /// Any store, already open.
    Store(Arc<dyn Store>),
}

impl From<PgPool> for Storage {
    fn from(pool: PgPool) -> Self {
        Self::Postgres(pool)
    }
}

impl From<MySqlPool> for Storage {
    fn from(pool: MySqlPool) -> Self {
        Self::MySql(pool)
    }
}

impl From<SqlitePool> for Storage {
    fn from(pool: SqlitePool) -> Self {
        Self::Sqlite(pool)
    }
}

impl From<Arc<dyn Store>> for Storage {
    fn from(store: Arc<dyn Store>) -> Self {
        Self::Store(store)
    }
}

/// Where the CDC source reads the stream from.
enum CdcSource {
    /// PostgreSQL's logical replication, on a connection to this URL.
    Replication(String),
    /// Any [`CdcDb`] (the simulation's model).
    Database(Arc<dyn CdcDb>),
}

/// A relay being put together; [`RelayBuilder::build`] opens it.
pub struct RelayBuilder {
    storage: Storage,
    publisher: Arc<dyn Publisher>,
    config: RelayConfig,
    cdc: Option<CdcSource>,
    downcasts: Downcasts,
}

impl Relay {
    /// A relay over `storage` (a PostgreSQL, MySQL or SQLite pool, or any [`Store`]),
    /// publishing through `publisher` as `config` says. Nothing is opened before
    /// [`RelayBuilder::build`].
    pub fn builder(
        storage: impl Into<Storage>,
        publisher: Arc<dyn Publisher>,
        config: RelayConfig,
    ) -> RelayBuilder {
        RelayBuilder {
            storage: storage.into(),
            publisher,
            config,
            cdc: None,
            downcasts: Downcasts::new(),
        }
    }
}

impl RelayBuilder {
    /// The database URL the CDC source (`mode = "cdc"`) opens its replication connection to:
    /// the URL the pool was opened with (a pool cannot give the password back). Needs the
    /// REPLICATION attribute for the user, and a PostgreSQL storage.
    pub fn replication_url(mut self, database_url: impl Into<String>) -> Self {
        self.cdc = Some(CdcSource::Replication(database_url.into()));
        self
    }

    /// The database the CDC source (`mode = "cdc"`) reads the stream from and runs its
    /// statements on: any [`CdcDb`] (the simulation's model; on PostgreSQL,
    /// [`RelayBuilder::replication_url`] is the way).
    pub fn cdc_database(mut self, db: Arc<dyn CdcDb>) -> Self {
        self.cdc = Some(CdcSource::Database(db));
        self
    }

    /// Fan-out copies made with these Rust downcasts where they apply (instead of the
    /// copies' `keep_fields` / `drop_fields`). See [`crate::wire::fanout`].
    pub fn downcasts(mut self, downcasts: Downcasts) -> Self {
        self.downcasts = downcasts;
        self
    }

    /// Validates the configuration and opens the store (whose schema must have been
    /// migrated) and, for CDC, the source's statements.
    pub async fn build(self) -> Result<Relay, Error> {
        let Self {
            storage,
            publisher,
            config,
            cdc,
            downcasts,
        } = self;
        config.validate()?;
        let tables = config.tables();
        let (store, admin, pool): (Arc<dyn Store>, _, _) = match storage {
            Storage::Postgres(pool) => {
                let pool = Timeouts {
                    statement: config.statement_timeout,
                    lock: config.lock_timeout,
                }
                .apply(&pool);
                let store = PgStore::open(pool.clone(), &tables).await?;
                let admin = Admin::new(pool.clone(), &tables);
                (Arc::new(store), Some(admin), Some(pool))
            }
            Storage::MySql(pool) => {
                let session = config.mysql_session();
                let admin = Admin::mysql_with(pool.clone(), &tables, session);
                let store = MySqlStore::open_with(pool, &tables, session).await?;
                (Arc::new(store), Some(admin), None)
            }
            Storage::Sqlite(pool) => {
                let admin = Admin::sqlite(pool.clone(), &tables);
                let store = SqliteStore::open(pool, &tables).await?;
                (Arc::new(store), Some(admin), None)
            }
            Storage::Store(store) => (store, None, None),
        };
        let cdc: Option<Arc<dyn CdcDb>> = match cdc {
            None => None,
            Some(CdcSource::Database(db)) => Some(db),
            Some(CdcSource::Replication(url)) => {
                let target = ReplicationTarget::from_url(&url)?;
                let pool = pool.ok_or_else(|| {
                    Error::Config("a replication URL needs a PostgreSQL relay".into())
                })?;
                Some(Arc::new(PgCdc::new(pool, &tables, target)))
            }
        };
        Ok(Relay::assemble(
            store, admin, publisher, config, cdc, downcasts,
        ))
    }
}
