//! One module per subcommand.

pub mod consumer_dead_letters;
pub mod consumer_versions;
pub mod dead_letters;
pub mod demo;
pub mod doctor;
pub mod healthcheck;
pub mod migrate;
pub mod purge;
pub mod relay;
pub mod sagas;
pub mod schema;
pub mod status;
pub mod verify;

use std::time::Duration;

use sqlx::{postgres::PgPoolOptions, Connection, PgPool};

/// Result of a subcommand: its exit code, or an error printed with its causes.
pub type CommandResult = Result<std::process::ExitCode, Box<dyn std::error::Error>>;

/// Options every database command takes.
#[derive(clap::Args, Debug, Clone)]
pub struct DatabaseArgs {
    /// PostgreSQL URL (postgres://…), MySQL or MariaDB URL (mysql://…) or SQLite file
    /// (sqlite://path/outbox.db).
    #[arg(long, env = "OUTBOX_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Schema holding the outbox.
    #[arg(long, default_value = "outbox")]
    pub schema: String,
    /// Events table in that schema.
    #[arg(long, default_value = "events")]
    pub table: String,
}

impl DatabaseArgs {
    /// The validated tables.
    pub fn tables(&self) -> Result<outbox::Tables, outbox::Error> {
        outbox::Tables::new(&self.schema, &self.table)
    }
}

/// A database the commands can work on.
#[derive(Clone)]
pub enum Db {
    /// PostgreSQL (`postgres://…`).
    Postgres(PgPool),
    /// MySQL 8 or MariaDB 10.6+ (`mysql://…`, `mariadb://…`).
    MySql(sqlx::MySqlPool),
    /// SQLite (`sqlite://path/to/file.db`), the embedded default: one relay at a time.
    Sqlite(sqlx::SqlitePool),
}

impl Db {
    /// The database as `outbox verify` audits it.
    pub fn audited(&self) -> &dyn outbox_relayer::verify::Audited {
        match self {
            Db::Postgres(pool) => pool,
            Db::MySql(pool) => pool,
            Db::Sqlite(pool) => pool,
        }
    }

    /// The database as `outbox doctor` examines it.
    pub fn examined(&self) -> &dyn outbox_relayer::doctor::database::Examine {
        match self {
            Db::Postgres(pool) => pool,
            Db::MySql(pool) => pool,
            Db::Sqlite(pool) => pool,
        }
    }
}

/// The database a URL names, by its scheme.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Postgres,
    MySql,
    Sqlite,
}

/// Which database `url` names; an unknown scheme is an error that names only the scheme (the
/// rest of the URL may hold a password).
fn kind(url: &str) -> Result<Kind, String> {
    const SPOKEN: &str =
        "use postgres://… (PostgreSQL), mysql://… (MySQL, MariaDB) or sqlite://… (SQLite)";
    if url.starts_with("sqlite:") {
        return Ok(Kind::Sqlite);
    }
    let (kind, default_port) = match url.split_once("://").map(|(scheme, _)| scheme) {
        Some("postgres" | "postgresql") => (Kind::Postgres, 5432),
        Some("mysql" | "mariadb") => (Kind::MySql, 3306),
        Some(scheme) => {
            return Err(format!(
                "unsupported database URL scheme {scheme:?}: {SPOKEN}"
            ))
        }
        None => return Err(format!("the database URL has no scheme: {SPOKEN}")),
    };
    // Refused before a parser reads part of the password as the host or the port.
    if outbox_relayer::redact::userinfo_needs_encoding(url) {
        let address = outbox_relayer::doctor::server_address(url, default_port)
            .unwrap_or_else(|| "the local socket".to_owned());
        return Err(format!(
            "the URL of the database at {address} has a `/`, `?` or `#` in its user name or \
             password: percent-encode them (%2F, %3F, %23)"
        ));
    }
    Ok(kind)
}

/// How long opening one connection may take before the server counts as not answering.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `host:port` of the server a database URL names, for messages (never the credentials).
pub fn database_address(url: &str) -> String {
    let default_port = if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        3306
    } else {
        5432
    };
    outbox_relayer::doctor::server_address(url, default_port)
        .unwrap_or_else(|| "the local socket".to_owned())
}

/// Opens one connection and closes it: its error is the server's own answer (refused, unknown
/// host, TLS, password, missing database), which a pool reports only as "pool timed out"
/// after its acquire timeout.
async fn first_connection(kind: Kind, url: &str) -> Result<(), sqlx::Error> {
    use sqlx::Connection;
    let opened = async {
        match kind {
            Kind::MySql => {
                sqlx::MySqlConnection::connect_with(&mysql_options(url)?)
                    .await?
                    .close()
                    .await
            }
            _ => sqlx::PgConnection::connect(url).await?.close().await,
        }
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, opened).await {
        Ok(result) => result,
        Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {CONNECT_TIMEOUT:?}"),
        ))),
    }
}

/// MySQL connect options (`mariadb://` is taken as `mysql://`).
fn mysql_options(url: &str) -> Result<sqlx::mysql::MySqlConnectOptions, sqlx::Error> {
    use std::str::FromStr;
    let url = match url.strip_prefix("mariadb://") {
        Some(rest) => format!("mysql://{rest}"),
        None => url.to_owned(),
    };
    sqlx::mysql::MySqlConnectOptions::from_str(&url)
}

/// Opens MySQL or MariaDB.
async fn open_mysql(url: &str, max_connections: u32) -> Result<sqlx::MySqlPool, sqlx::Error> {
    first_connection(Kind::MySql, url).await?;
    let options = mysql_options(url)?;
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .after_release(|conn, _| Box::pin(async move { Ok(!conn.is_in_transaction()) }))
        .connect_with(options)
        .await
}

/// Whether SQLite answered SQLITE_BUSY ("database is locked").
fn sqlite_locked(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "5")
}

/// Opens PostgreSQL, MySQL or SQLite by the URL's scheme (a SQLite file is created if
/// missing).
pub async fn connect_any(url: &str, max_connections: u32) -> Result<Db, String> {
    open_any(url, max_connections, true).await
}

/// Opens PostgreSQL, MySQL or SQLite by the URL's scheme; a SQLite file that does not exist
/// is created with `create`, and otherwise an error that names it.
async fn open_any(url: &str, max_connections: u32, create: bool) -> Result<Db, String> {
    if kind(url)? == Kind::MySql {
        return open_mysql(url, max_connections)
            .await
            .map(Db::MySql)
            .map_err(|e| {
                format!(
                    "cannot connect to the database at {}: {e}",
                    database_address(url)
                )
            });
    }
    if url.starts_with("sqlite:") {
        use std::str::FromStr;
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
            .map_err(|e| format!("invalid SQLite URL: {e}"))?
            .create_if_missing(create)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30));
        // Opening switches the file to WAL, which takes the file's lock without waiting on
        // the busy timeout: processes opening a new file at once (migrations in several
        // pods' init containers) get "database is locked" and try again, within the timeout.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let pool = loop {
            let opened = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(max_connections)
                .after_release(|conn, _| Box::pin(async move { Ok(!conn.is_in_transaction()) }))
                .connect_with(options.clone())
                .await;
            match opened {
                Err(e) if sqlite_locked(&e) && std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                opened => break opened,
            }
        }
        .map_err(|e| {
            // SQLITE_CANTOPEN: SQLite itself (file: URIs and in-memory databases included)
            // found no file to open.
            if !create && e.as_database_error().and_then(|d| d.code()).as_deref() == Some("14") {
                format!(
                    "the SQLite database file {} does not exist (or cannot be opened): {e}",
                    options.get_filename().display()
                )
            } else {
                format!("cannot open the SQLite database: {e}")
            }
        })?;
        return Ok(Db::Sqlite(pool));
    }
    connect(url, max_connections).await.map(Db::Postgres)
}

/// Like [`connect_any`], for a command that reads or changes an outbox and so creates no
/// database: a SQLite file that does not exist is an error naming it.
pub async fn connect_existing(url: &str, max_connections: u32) -> Result<Db, String> {
    open_any(url, max_connections, false).await
}

/// An outbox an operator command works on, PostgreSQL, MySQL or SQLite.
pub struct Outbox {
    /// The database.
    pub db: Db,
    /// Its tables.
    pub tables: outbox::Tables,
    /// Operator actions on it.
    pub admin: outbox_relayer::admin::Admin,
    /// Its backlog and partitions.
    pub store: std::sync::Arc<dyn outbox_relayer::store::Store>,
}

/// Opens the outbox `args` names; an outbox that is not migrated is an error that says so.
pub async fn open_outbox(args: &DatabaseArgs) -> Result<Outbox, Box<dyn std::error::Error>> {
    use outbox_relayer::{admin::Admin, store};
    let tables = args.tables()?;
    let db = connect_existing(require_url(args.database_url.as_deref())?, 2).await?;
    let (admin, store): (Admin, std::sync::Arc<dyn store::Store>) = match &db {
        Db::Postgres(pool) => (
            Admin::new(pool.clone(), &tables),
            std::sync::Arc::new(
                outbox_relayer::postgres::PgStore::open(pool.clone(), &tables).await?,
            ),
        ),
        Db::MySql(pool) => (
            Admin::mysql(pool.clone(), &tables),
            std::sync::Arc::new(
                outbox_relayer::mysql::MySqlStore::open(pool.clone(), &tables).await?,
            ),
        ),
        Db::Sqlite(pool) => (
            Admin::sqlite(pool.clone(), &tables),
            std::sync::Arc::new(
                outbox_relayer::sqlite::SqliteStore::open(pool.clone(), &tables).await?,
            ),
        ),
    };
    Ok(Outbox {
        db,
        tables,
        admin,
        store,
    })
}

/// Opens a small pool; the error never contains the URL (it may hold a password).
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, String> {
    postgres_scheme(url)?;
    open_pool(url, max_connections).await.map_err(|e| {
        format!(
            "cannot connect to the database at {}: {e}",
            database_address(url)
        )
    })
}

/// Refuses a URL that does not name PostgreSQL, before a byte is sent to it (PostgreSQL's
/// protocol sent to a MySQL server fails with a riddle). Names only the scheme: the rest of
/// the URL may hold a password.
fn postgres_scheme(url: &str) -> Result<(), String> {
    match kind(url)? {
        Kind::Postgres => Ok(()),
        Kind::MySql | Kind::Sqlite => Err(
            "this command needs PostgreSQL (postgres://…): sagas are stored on PostgreSQL only"
                .into(),
        ),
    }
}

async fn open_pool(url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    first_connection(Kind::Postgres, url).await?;
    // A connection returned with a transaction still open (a future dropped while it was
    // beginning one) is closed, which rolls it back, instead of pooled holding its locks.
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .after_release(|conn, _| Box::pin(async move { Ok(!conn.is_in_transaction()) }))
        .connect(url)
        .await
}

/// Like [`connect_any`], but waits for a server that cannot be reached yet (connection
/// refused or timed out, server starting up or shutting down), retrying with backoff up to 30 s:
/// a relay started before its database, or during a restart, comes up with it, as it does with
/// its broker. Each failed attempt is logged at WARN with the server's address and the
/// underlying cause, the first one at once, and `waiting` is told the same sentence (for
/// `/readyz`). Errors that waiting cannot cure (a malformed URL, a refused password, a missing
/// database) are returned at once.
pub async fn connect_waiting(
    url: &str,
    max_connections: u32,
    waiting: impl Fn(String),
) -> Result<Db, String> {
    let kind = kind(url)?;
    if kind == Kind::Sqlite {
        return connect_any(url, max_connections).await;
    }
    let address = database_address(url);
    let mut backoff =
        outbox::backoff::Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let mut waited = false;
    loop {
        let opened = match kind {
            Kind::MySql => open_mysql(url, max_connections).await.map(Db::MySql),
            _ => open_pool(url, max_connections).await.map(Db::Postgres),
        };
        match opened {
            Ok(db) => {
                if waited {
                    tracing::info!(database = %address, "connected to the database");
                }
                return Ok(db);
            }
            Err(error) if unreachable(&error) => {
                let delay = backoff.next();
                tracing::warn!(database = %address, cause = %error, retry_in = ?delay,
                    "cannot reach the database; retrying");
                waiting(format!("waiting for the database at {address}: {error}"));
                waited = true;
                tokio::time::sleep(delay).await;
            }
            Err(error) => {
                return Err(format!(
                    "cannot connect to the database at {address}: {error}"
                ))
            }
        }
    }
}

/// Whether a connection error says the server is not there (yet), rather than that the
/// settings are wrong.
fn unreachable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => true,
        // 57P01-03: shutting down, starting up; class 08: connection exceptions. MySQL: 1040
        // too many connections, 1053 shutting down.
        sqlx::Error::Database(e) => {
            e.code()
                .is_some_and(|c| c.starts_with("57P0") || c.starts_with("08"))
                || e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                    .is_some_and(|m| matches!(m.number(), 1040 | 1053))
        }
        _ => false,
    }
}

/// The database URL or an error naming the flag.
pub fn require_url(url: Option<&str>) -> Result<&str, String> {
    url.ok_or_else(|| "no database URL: pass --database-url or set OUTBOX_DATABASE_URL".to_owned())
}

/// The brokers of a `kafka://host:port[,host:port…]` URL. The error never repeats the URL
/// (credentials would be in it).
pub fn kafka_brokers(url: &str) -> Result<&str, String> {
    let brokers = url.strip_prefix("kafka://").unwrap_or(url);
    if brokers.is_empty() || brokers.contains(['@', '/']) {
        return Err("kafka:// takes host:port[,host:port…], without credentials or a path".into());
    }
    Ok(brokers)
}

/// `--kafka-property KEY=VALUE` options as librdkafka properties. The error names no value.
#[cfg(feature = "kafka")]
pub fn kafka_properties(
    options: &[String],
) -> Result<std::collections::BTreeMap<String, String>, String> {
    options
        .iter()
        .map(|property| {
            property
                .split_once('=')
                .map(|(key, value)| (key.trim().to_owned(), value.to_owned()))
                .ok_or_else(|| {
                    "--kafka-property must be KEY=VALUE (one was given without '=')".to_owned()
                })
        })
        .collect()
}

/// Writes to stdout, with every control character but line breaks and tabs (and every
/// bidirectional mark) escaped by [`crate::escape::output`]; a closed pipe
/// (`outbox status | head`) is not an error.
pub fn print(text: &str) {
    use std::io::Write;
    let text = crate::escape::output(text);
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}
