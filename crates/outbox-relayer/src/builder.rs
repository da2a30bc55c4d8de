//! How a relay is put together: [`Relay::builder`] takes the database, the publisher and the
//! configuration, and the optional parts (the CDC source's database, fan-out downcasts) before
//! anything is opened, so that a built relay is complete.

use std::sync::Arc;

use crate::{
    admin::Admin,
    config::RelayConfig,
    error::Error,
    publisher::Publisher,
    relay::{Parts, Relay},
    store::Store,
    wire::fanout::Downcasts,
};
#[cfg(feature = "postgres")]
use crate::{
    postgres::PgCdc,
    source::cdc::{CdcDb, ReplicationTarget},
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
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    /// MySQL or MariaDB (migrated with `outbox::mysql::MySqlOutbox::migrate`). Partitions and
    /// leases as on PostgreSQL: any number of relays share the work. Each connection is set
    /// to an [`outbox::mysql::Session`] (READ COMMITTED, autocommit, the timeouts of
    /// [`RelayConfig::mysql_session`]), whatever the server's defaults.
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
    /// SQLite (migrated with `outbox::sqlite::SqliteOutbox::migrate`). One relay publishes at
    /// a time; another on the same file waits as a standby.
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
    /// Any store, already open.
    Store(Arc<dyn Store>),
}

#[cfg(feature = "postgres")]
impl From<sqlx::PgPool> for Storage {
    fn from(pool: sqlx::PgPool) -> Self {
        Self::Postgres(pool)
    }
}

#[cfg(feature = "mysql")]
impl From<sqlx::MySqlPool> for Storage {
    fn from(pool: sqlx::MySqlPool) -> Self {
        Self::MySql(pool)
    }
}

#[cfg(feature = "sqlite")]
impl From<sqlx::SqlitePool> for Storage {
    fn from(pool: sqlx::SqlitePool) -> Self {
        Self::Sqlite(pool)
    }
}

impl From<Arc<dyn Store>> for Storage {
    fn from(store: Arc<dyn Store>) -> Self {
        Self::Store(store)
    }
}

/// Where the CDC source reads the stream from.
#[cfg(feature = "postgres")]
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
    #[cfg(feature = "postgres")]
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
            #[cfg(feature = "postgres")]
            cdc: None,
            downcasts: Downcasts::new(),
        }
    }
}

impl RelayBuilder {
    /// The database URL the CDC source (`mode = "cdc"`) opens its replication connection to:
    /// the URL the pool was opened with (a pool cannot give the password back). Needs the
    /// REPLICATION attribute for the user, and a PostgreSQL storage.
    #[cfg(feature = "postgres")]
    pub fn replication_url(mut self, database_url: impl Into<String>) -> Self {
        self.cdc = Some(CdcSource::Replication(database_url.into()));
        self
    }

    /// The database the CDC source (`mode = "cdc"`) reads the stream from and runs its
    /// statements on: any [`CdcDb`] (the simulation's model; on PostgreSQL,
    /// [`RelayBuilder::replication_url`] is the way).
    #[cfg(feature = "postgres")]
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
        self.config.validate()?;
        let tables = self.config.tables();
        // The PostgreSQL pool with the relay's timeouts, which the CDC source shares.
        #[cfg(feature = "postgres")]
        let mut timed_pool = None;
        let (store, admin): (Arc<dyn Store>, Option<Admin>) = match self.storage {
            #[cfg(feature = "postgres")]
            Storage::Postgres(pool) => {
                let pool = crate::postgres::Timeouts {
                    statement: self.config.statement_timeout,
                    lock: self.config.lock_timeout,
                }
                .apply(&pool);
                let store = crate::postgres::PgStore::open(pool.clone(), &tables).await?;
                let admin = Admin::new(pool.clone(), &tables);
                timed_pool = Some(pool);
                (Arc::new(store), Some(admin))
            }
            #[cfg(feature = "mysql")]
            Storage::MySql(pool) => {
                let session = self.config.mysql_session();
                let admin = Admin::mysql_with(pool.clone(), &tables, session);
                let store = crate::mysql::MySqlStore::open_with(pool, &tables, session).await?;
                (Arc::new(store), Some(admin))
            }
            #[cfg(feature = "sqlite")]
            Storage::Sqlite(pool) => {
                let admin = Admin::sqlite(pool.clone(), &tables);
                let store = crate::sqlite::SqliteStore::open(pool, &tables).await?;
                (Arc::new(store), Some(admin))
            }
            Storage::Store(store) => (store, None),
        };
        #[cfg(feature = "postgres")]
        let cdc: Option<Arc<dyn CdcDb>> = match self.cdc {
            None => None,
            Some(CdcSource::Database(db)) => Some(db),
            Some(CdcSource::Replication(url)) => {
                let target = ReplicationTarget::from_url(&url)?;
                let pool = timed_pool.ok_or_else(|| {
                    Error::Config("a replication URL needs a PostgreSQL relay".into())
                })?;
                Some(Arc::new(PgCdc::new(pool, &tables, target)))
            }
        };
        Ok(Relay::assemble(Parts {
            store,
            admin,
            publisher: self.publisher,
            config: self.config,
            #[cfg(feature = "postgres")]
            cdc,
            downcasts: self.downcasts,
        }))
    }
}
