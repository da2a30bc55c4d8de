//! The database checks of `outbox doctor`: reachable (with the server's own answer), server
//! and version, migrations, the backend's own settings (PostgreSQL: privileges, vacuum and
//! statistics), backlog and dead letters, and the relays holding leases.
//!
//! The checks are written once here; each backend answers the questions they ask through
//! [`Examine`], implemented on its pool in its own folder (`postgres/doctor.rs`, …) with its
//! statements beside its others (`postgres/sql/doctor.sql`, …).

use std::sync::Arc;

use futures::future::BoxFuture;
use outbox::Tables;

use super::Check;
use crate::store::{PartitionStatus, Store};

const AREA: &str = "database";

/// The migrations a build ships: (version, name, script), as `outbox::postgres::MIGRATIONS`.
pub type Shipped = &'static [(i32, &'static str, &'static str)];

/// An event recently written, for the destinations the broker checks look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecentEvent {
    /// Its aggregate type.
    pub aggregate_type: String,
    /// Its event type.
    pub event_type: String,
    /// Its schema version.
    pub schema_version: i32,
    /// The destination its writer chose, if any.
    pub destination: Option<String>,
}

/// A row of the backends' `recent` statement: aggregate type, event type, schema version,
/// destination.
impl From<(String, String, i32, Option<String>)> for RecentEvent {
    fn from(
        (aggregate_type, event_type, schema_version, destination): (
            String,
            String,
            i32,
            Option<String>,
        ),
    ) -> Self {
        Self {
            aggregate_type,
            event_type,
            schema_version,
            destination,
        }
    }
}

/// What the doctor asks a database, answered by each backend on its pool.
pub trait Examine: Send + Sync {
    /// The server as the report names it: `PostgreSQL`, `MySQL/MariaDB`, `SQLite`.
    fn product(&self) -> &'static str;
    /// Whether the database is a server at an address (SQLite is a file: no address).
    fn served(&self) -> bool {
        true
    }
    /// The server's version, as it reports it.
    fn version(&self) -> BoxFuture<'_, Result<String, sqlx::Error>>;
    /// The migration versions recorded as applied.
    fn applied<'a>(&'a self, tables: &'a Tables) -> BoxFuture<'a, Result<Vec<i32>, sqlx::Error>>;
    /// The migrations this build ships.
    fn shipped(&self) -> Shipped;
    /// The relay's store on this database (it refuses an outbox it cannot work with).
    fn store<'a>(
        &'a self,
        tables: &'a Tables,
    ) -> BoxFuture<'a, Result<Arc<dyn Store>, crate::Error>>;
    /// The backend's own checks of a migrated outbox (PostgreSQL: privileges, autovacuum,
    /// statistics); none by default.
    fn settings<'a>(&'a self, _tables: &'a Tables) -> BoxFuture<'a, Vec<Check>> {
        Box::pin(async { Vec::new() })
    }
    /// Up to 50 distinct kinds of event among the last 1,000 written.
    fn recent<'a>(
        &'a self,
        tables: &'a Tables,
    ) -> BoxFuture<'a, Result<Vec<RecentEvent>, sqlx::Error>>;
}

/// What the database checks found.
#[derive(Debug, Default)]
pub struct Found {
    /// One per check, in the order run.
    pub checks: Vec<Check>,
    /// Up to 50 distinct kinds of event among the last 1,000 written (none when the outbox
    /// is not migrated or cannot be read).
    pub recent: Vec<RecentEvent>,
}

/// The check of a database that could not be reached: the server's own `error`, and the fix
/// its words point to. `address` is the server's host and port, as the report shows them.
pub fn unreachable(error: &str, address: &str) -> Check {
    Check::fail(
        AREA,
        "reachable",
        error.to_owned(),
        unreachable_fix(error, address),
    )
}

/// Runs the checks of a database the doctor reached at `address`.
pub async fn examine(db: &dyn Examine, address: &str, tables: &Tables) -> Found {
    let mut found = Found::default();
    let version = db
        .version()
        .await
        .unwrap_or_else(|e| format!("unknown ({e})"));
    let server = if db.served() {
        format!("{} {version} at {address}", db.product())
    } else {
        format!("{} {version}", db.product())
    };
    found.checks.push(Check::ok(AREA, "reachable", server));
    let applied = match db.applied(tables).await {
        Ok(versions) => Applied::Versions(versions),
        Err(error) if missing(&error) => Applied::NotMigrated,
        Err(error) => Applied::Unreadable(error.to_string()),
    };
    let migrations = Migrations {
        applied,
        shipped: db.shipped(),
    };
    if !migrations.check(&mut found.checks, tables) {
        return found;
    }
    found.checks.extend(db.settings(tables).await);
    match db.recent(tables).await {
        Ok(recent) => found.recent = recent,
        // Said, not swallowed: without them, no destination is checked on the broker.
        Err(error) => found.checks.push(Check::warn(
            AREA,
            "recent events",
            format!(
                "cannot be read, so the broker checks look at no destination: {}",
                outbox::error_chain(&error)
            ),
            "look for a row with a malformed type or destination among the last 1,000",
        )),
    }
    match db.store(tables).await {
        Ok(store) => backlog_and_relays(store.as_ref(), &mut found.checks).await,
        Err(error) => found.checks.push(Check::fail(
            AREA,
            "outbox",
            outbox::error_chain(&error),
            "run `outbox migrate` with the same --database-url, --schema and --table, or \
             grant this user what the error says it lacks",
        )),
    }
    found
}

/// The fix for a connection that failed, from the words of its error.
fn unreachable_fix(error: &str, address: &str) -> String {
    let lower = error.to_ascii_lowercase();
    if lower.contains("refused") {
        format!("start the database server, or correct the host and port ({address}) in the URL")
    } else if lower.contains("password")
        || lower.contains("authentication")
        || lower.contains("access denied")
        || (lower.contains("role") && lower.contains("does not exist"))
    {
        "correct the user and password in the URL (and the server's pg_hba.conf or grants)".into()
    } else if lower.contains("sqlite database file") {
        "correct the file's path in the URL, or create the outbox there with `outbox migrate`"
            .into()
    } else if lower.contains("does not exist") || lower.contains("unknown database") {
        "create the database, or correct its name in the URL".into()
    } else if lower.contains("tls") || lower.contains("ssl") || lower.contains("certificate") {
        "correct the TLS settings (sslmode / ssl-mode and the certificates) in the URL".into()
    } else if lower.contains("lookup")
        || lower.contains("resolve")
        || lower.contains("name or service")
    {
        format!("correct the host name in the URL ({address} does not resolve)")
    } else {
        format!("check that the server at {address} is up and reachable from here")
    }
}

/// Whether `error`, reading the migrations table, says that it (or its schema) does not
/// exist: PostgreSQL's undefined table or schema, MySQL's unknown table, SQLite's words.
fn missing(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| matches!(&*c, "42P01" | "3F000" | "42S02"))
        || error.to_string().contains("no such table")
}

/// The versions applied, as read from the migrations table.
enum Applied {
    Versions(Vec<i32>),
    /// No migrations table (or schema): never migrated.
    NotMigrated,
    /// The table exists but cannot be read (privileges).
    Unreadable(String),
}

struct Migrations {
    applied: Applied,
    shipped: Shipped,
}

impl Migrations {
    /// Pushes the migrations check; whether the outbox is fully migrated (or its migrations
    /// cannot be read, which the privileges check explains: the checks go on).
    fn check(&self, checks: &mut Vec<Check>, tables: &Tables) -> bool {
        let migrate = format!(
            "outbox migrate --database-url … --schema {} --table {}",
            tables.schema().as_str(),
            tables.events().as_str()
        );
        let latest = self.shipped.iter().map(|m| m.0).max().unwrap_or(0);
        let applied = match &self.applied {
            Applied::Versions(applied) => applied,
            Applied::NotMigrated => {
                checks.push(Check::fail(
                    AREA,
                    "migrations",
                    format!(
                        "the outbox {}.{} is not migrated (no migrations table)",
                        tables.schema().as_str(),
                        tables.events().as_str()
                    ),
                    migrate,
                ));
                return false;
            }
            Applied::Unreadable(error) => {
                checks.push(Check::fail(
                    AREA,
                    "migrations",
                    format!("cannot be read: {error}"),
                    "grant this user access to the outbox's tables (see the privileges check)",
                ));
                return true;
            }
        };
        let missing: Vec<String> = self
            .shipped
            .iter()
            .filter(|m| !applied.contains(&m.0))
            .map(|m| format!("{} ({})", m.0, m.1))
            .collect();
        let newest = applied.iter().copied().max().unwrap_or(0);
        if newest > latest {
            checks.push(Check::fail(
                AREA,
                "migrations",
                format!(
                    "the outbox is at migration {newest}, newer than this outbox binary knows \
                     ({latest})"
                ),
                "run the relay and the tools of the version that migrated it, or newer",
            ));
            false
        } else if !missing.is_empty() {
            checks.push(Check::fail(
                AREA,
                "migrations",
                format!(
                    "{} of {} applied; missing: {}",
                    self.shipped.len() - missing.len(),
                    self.shipped.len(),
                    missing.join(", ")
                ),
                migrate,
            ));
            false
        } else {
            checks.push(Check::ok(
                AREA,
                "migrations",
                format!("current ({latest} applied)"),
            ));
            true
        }
    }
}

/// Pending and dead events, the oldest pending age, and the relays holding leases.
async fn backlog_and_relays(store: &dyn Store, checks: &mut Vec<Check>) {
    match store.backlog().await {
        Ok(backlog) => {
            let oldest = backlog
                .oldest_age
                .map_or("-".to_owned(), |a| format!("{:.1}s", a.as_secs_f64()));
            checks.push(Check::ok(
                AREA,
                "backlog",
                format!("{} pending (oldest {oldest})", backlog.pending),
            ));
            checks.push(if backlog.dead == 0 {
                Check::ok(AREA, "dead letters", "none")
            } else {
                Check::warn(
                    AREA,
                    "dead letters",
                    format!(
                        "{} dead-lettered events: their aggregates are parked behind them",
                        backlog.dead
                    ),
                    "outbox dead-letters list, then replay or skip them",
                )
            });
        }
        Err(error) => checks.push(Check::fail(
            AREA,
            "backlog",
            format!("cannot be read: {error}"),
            "run doctor as the relay's user",
        )),
    }
    match store.partition_status().await {
        Ok(partitions) => checks.extend(relays(&partitions)),
        Err(error) => checks.push(Check::fail(
            "relays",
            "leases",
            format!("cannot be read: {error}"),
            "run doctor as the relay's user",
        )),
    }
}

/// The relays alive and the partitions they own, from the lease table's `partitions`.
fn relays(partitions: &[PartitionStatus]) -> Vec<Check> {
    if partitions.is_empty() {
        return Vec::new();
    }
    let mut owners: Vec<&str> = partitions
        .iter()
        .filter(|p| p.live)
        .filter_map(|p| p.owner.as_deref())
        .collect();
    owners.sort_unstable();
    owners.dedup();
    let unowned: Vec<&PartitionStatus> = partitions.iter().filter(|p| !p.live).collect();
    let stranded: i64 = unowned.iter().map(|p| p.pending).sum();
    if owners.is_empty() {
        return vec![if stranded > 0 {
            Check::warn(
                "relays",
                "alive",
                format!("no relay holds a lease, and {stranded} events are pending"),
                "start `outbox relay` with the same database, schema and table",
            )
        } else {
            Check::ok("relays", "alive", "none running (nothing pending)")
        }];
    }
    vec![
        Check::ok(
            "relays",
            "alive",
            format!("{}: {}", owners.len(), owners.join(", ")),
        ),
        if unowned.is_empty() {
            Check::ok(
                "relays",
                "partitions",
                format!("all {} owned by a live lease", partitions.len()),
            )
        } else {
            Check::warn(
                "relays",
                "partitions",
                format!(
                    "{} of {} have no live lease ({stranded} events pending in them); the live \
                     relays take them over within a lease_ttl",
                    unowned.len(),
                    partitions.len()
                ),
                "if this lasts, look at the relays' logs (they may be unable to renew)",
            )
        },
    ]
}

#[cfg(test)]
#[path = "database_tests.rs"]
mod tests;
