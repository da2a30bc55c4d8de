//! The database checks of `outbox doctor`: reachable (with the server's own answer), server
//! and version, migrations, privileges, vacuum and statistics, backlog and dead letters, and
//! the relays holding leases.

use std::sync::Arc;

use outbox::Tables;
use outbox_relayer::{doctor::Check, store::Store};
use sqlx::PgPool;

use crate::commands::{connect_any, database_address, Db};

const AREA: &str = "database";

/// An event recently written, for the destinations the broker checks look at.
pub struct RecentEvent {
    pub aggregate_type: String,
    pub event_type: String,
    pub schema_version: i32,
    pub destination: Option<String>,
}

/// What the database checks found.
pub struct Found {
    pub checks: Vec<Check>,
    /// Whether the server answered at all.
    pub reachable: bool,
    /// The pool, when the database is PostgreSQL (for the CDC checks).
    pub postgres: Option<PgPool>,
    /// Up to 50 distinct kinds of event among the last 1,000 written.
    pub recent: Vec<RecentEvent>,
}

/// Runs the database and relay checks.
pub async fn check(url: &str, tables: &Tables) -> Found {
    let mut found = Found {
        checks: Vec::new(),
        reachable: false,
        postgres: None,
        recent: Vec::new(),
    };
    let address = database_address(url);
    let db = match connect_any(url, 2).await {
        Ok(db) => db,
        Err(error) => {
            found.checks.push(Check::fail(
                AREA,
                "reachable",
                error.clone(),
                unreachable_fix(&error, &address),
            ));
            return found;
        }
    };
    found.reachable = true;
    let (server, migrations, store): (String, Migrations, Result<Arc<dyn Store>, String>) =
        match &db {
            Db::Postgres(pool) => {
                found.postgres = Some(pool.clone());
                let version: String = sqlx::query_scalar("SHOW server_version")
                    .fetch_one(pool)
                    .await
                    .unwrap_or_else(|e| format!("unknown ({e})"));
                let applied = applied(
                    sqlx::query_scalar::<_, i32>(
                        &tables.render("SELECT version FROM {schema}.migrations"),
                    )
                    .fetch_all(pool)
                    .await,
                );
                let store = outbox_relayer::postgres::PgStore::open(pool.clone(), tables)
                    .await
                    .map(|s| Arc::new(s) as Arc<dyn Store>)
                    .map_err(|e| e.to_string());
                (
                    format!("PostgreSQL {version} at {address}"),
                    Migrations {
                        applied,
                        shipped: outbox::postgres::MIGRATIONS,
                    },
                    store,
                )
            }
            Db::MySql(pool) => {
                let version: String = sqlx::query_scalar("SELECT VERSION()")
                    .fetch_one(pool)
                    .await
                    .unwrap_or_else(|e| format!("unknown ({e})"));
                let applied = applied(
                    sqlx::query_scalar::<_, i32>(
                        &tables.render_mysql("SELECT version FROM {migrations}"),
                    )
                    .fetch_all(pool)
                    .await,
                );
                let store = outbox_relayer::mysql::MySqlStore::open(pool.clone(), tables)
                    .await
                    .map(|s| Arc::new(s) as Arc<dyn Store>)
                    .map_err(|e| e.to_string());
                (
                    format!("MySQL/MariaDB {version} at {address}"),
                    Migrations {
                        applied,
                        shipped: outbox::mysql::MIGRATIONS,
                    },
                    store,
                )
            }
            Db::Sqlite(pool) => {
                let version: String = sqlx::query_scalar("SELECT sqlite_version()")
                    .fetch_one(pool)
                    .await
                    .unwrap_or_else(|e| format!("unknown ({e})"));
                let applied = applied(
                    sqlx::query_scalar::<_, i32>(
                        &tables.render_sqlite("SELECT version FROM {migrations}"),
                    )
                    .fetch_all(pool)
                    .await,
                );
                let store = outbox_relayer::sqlite::SqliteStore::open(pool.clone(), tables)
                    .await
                    .map(|s| Arc::new(s) as Arc<dyn Store>)
                    .map_err(|e| e.to_string());
                (
                    format!("SQLite {version}"),
                    Migrations {
                        applied,
                        shipped: outbox::sqlite::MIGRATIONS,
                    },
                    store,
                )
            }
        };
    found.checks.push(Check::ok(AREA, "reachable", server));
    let migrated = migrations.check(&mut found.checks, tables);
    if !migrated {
        return found;
    }
    if let Db::Postgres(pool) = &db {
        postgres_checks(pool, tables, &mut found.checks).await;
        found.recent = recent_events(pool, tables).await;
    }
    match store {
        Ok(store) => backlog_and_relays(store.as_ref(), &mut found.checks).await,
        Err(error) => found.checks.push(Check::fail(
            AREA,
            "outbox",
            error,
            "run `outbox migrate` with the same --database-url, --schema and --table",
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
    {
        "correct the user and password in the URL (and the server's pg_hba.conf or grants)".into()
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

/// The versions applied, as read from the migrations table.
enum Applied {
    Versions(Vec<i32>),
    /// No migrations table (or schema): never migrated.
    NotMigrated,
    /// The table exists but cannot be read (privileges).
    Unreadable(String),
}

fn applied(result: Result<Vec<i32>, sqlx::Error>) -> Applied {
    match result {
        Ok(versions) => Applied::Versions(versions),
        Err(error) => {
            let missing = error
                .as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|c| matches!(&*c, "42P01" | "3F000" | "42S02"))
                || error.to_string().contains("no such table");
            if missing {
                Applied::NotMigrated
            } else {
                Applied::Unreadable(error.to_string())
            }
        }
    }
}

struct Migrations {
    applied: Applied,
    shipped: &'static [(i32, &'static str, &'static str)],
}

impl Migrations {
    /// Pushes the migrations check; whether the outbox is fully migrated.
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
            // The privileges check says which tables and how to grant them.
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

/// The server's `autovacuum`, the table's own switch, live and dead tuples, and whether it was
/// ever analyzed.
type VacuumRow = (String, bool, Option<i64>, Option<i64>, bool);

/// Privileges, vacuum and statistics of a PostgreSQL outbox.
async fn postgres_checks(pool: &PgPool, tables: &Tables, checks: &mut Vec<Check>) {
    let schema = tables.schema().as_str();
    // Every table of the outbox's schema the relay needs to read and change.
    let lacking: Result<Vec<String>, sqlx::Error> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')
           AND NOT (has_schema_privilege(n.oid, 'USAGE')
                    AND has_table_privilege(c.oid, 'SELECT, INSERT, UPDATE, DELETE'))
         ORDER BY 1",
    )
    .bind(schema)
    .fetch_all(pool)
    .await;
    match lacking {
        Ok(lacking) if lacking.is_empty() => checks.push(Check::ok(
            AREA,
            "privileges",
            format!("SELECT, INSERT, UPDATE, DELETE on every table of schema {schema}"),
        )),
        Ok(lacking) => checks.push(Check::fail(
            AREA,
            "privileges",
            format!(
                "this user lacks SELECT, INSERT, UPDATE or DELETE on {}",
                lacking.join(", ")
            ),
            format!(
                "GRANT USAGE ON SCHEMA {schema} TO <relay user>; GRANT SELECT, INSERT, UPDATE, \
                 DELETE ON ALL TABLES IN SCHEMA {schema} TO <relay user>; GRANT USAGE ON ALL \
                 SEQUENCES IN SCHEMA {schema} TO <relay user>"
            ),
        )),
        Err(error) => checks.push(Check::warn(
            AREA,
            "privileges",
            format!("could not be read: {error}"),
            "run doctor as the relay's user",
        )),
    }
    let events = tables.render("{schema}.{events}");
    let vacuum: Result<VacuumRow, sqlx::Error> = sqlx::query_as(
        "SELECT current_setting('autovacuum'),
                    coalesce(NOT ('autovacuum_enabled=false' = ANY (c.reloptions)), true),
                    s.n_live_tup, s.n_dead_tup,
                    (s.last_analyze IS NOT NULL OR s.last_autoanalyze IS NOT NULL)
             FROM pg_class c LEFT JOIN pg_stat_all_tables s ON s.relid = c.oid
             WHERE c.oid = $1::regclass",
    )
    .bind(&events)
    .fetch_one(pool)
    .await;
    match vacuum {
        Ok((setting, table_enabled, live, dead, analyzed)) => {
            let (live, dead) = (live.unwrap_or(0), dead.unwrap_or(0));
            if setting != "on" || !table_enabled {
                checks.push(Check::warn(
                    AREA,
                    "autovacuum",
                    format!(
                        "off for {events} ({}): published rows leave dead tuples and index \
                         entries that claims read past until something vacuums ({dead} dead, \
                         {live} live now)",
                        if setting != "on" {
                            "autovacuum = off on the server"
                        } else {
                            "autovacuum_enabled = false on the table"
                        }
                    ),
                    format!(
                        "turn autovacuum on, or schedule `VACUUM (ANALYZE) {events}` every few \
                         minutes; `outbox purge` removes published rows"
                    ),
                ));
            } else if dead > 100_000 && dead > 4 * live.max(1) {
                checks.push(Check::warn(
                    AREA,
                    "autovacuum",
                    format!("{dead} dead tuples against {live} live in {events}: vacuum lags"),
                    format!(
                        "ALTER TABLE {events} SET (autovacuum_vacuum_scale_factor = 0.01, \
                         autovacuum_vacuum_cost_delay = 0)"
                    ),
                ));
            } else {
                checks.push(Check::ok(
                    AREA,
                    "autovacuum",
                    format!("on ({dead} dead, {live} live tuples)"),
                ));
            }
            checks.push(if analyzed || live + dead == 0 {
                Check::ok(
                    AREA,
                    "statistics",
                    format!("{events} has planner statistics"),
                )
            } else {
                Check::warn(
                    AREA,
                    "statistics",
                    format!("{events} was never analyzed: the planner guesses its size"),
                    format!("ANALYZE {events} (the relay also refreshes them while it runs)"),
                )
            });
        }
        Err(error) => checks.push(Check::warn(
            AREA,
            "autovacuum",
            format!("could not be read: {error}"),
            "run doctor as the relay's user",
        )),
    }
}

/// Up to 50 distinct kinds of event among the last 1,000 written.
async fn recent_events(pool: &PgPool, tables: &Tables) -> Vec<RecentEvent> {
    let sql = tables.render(
        "SELECT DISTINCT aggregate_type, event_type, schema_version, destination
         FROM (SELECT aggregate_type, event_type, schema_version, destination
               FROM {schema}.{events} ORDER BY id DESC LIMIT 1000) recent
         LIMIT 50",
    );
    sqlx::query_as::<_, (String, String, i32, Option<String>)>(&sql)
        .fetch_all(pool)
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|r| RecentEvent {
            aggregate_type: r.0,
            event_type: r.1,
            schema_version: r.2,
            destination: r.3,
        })
        .collect()
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
    let partitions = match store.partition_status().await {
        Ok(partitions) => partitions,
        Err(error) => {
            checks.push(Check::fail(
                "relays",
                "leases",
                format!("cannot be read: {error}"),
                "run doctor as the relay's user",
            ));
            return;
        }
    };
    if partitions.is_empty() {
        return;
    }
    let mut owners: Vec<&str> = partitions
        .iter()
        .filter(|p| p.live)
        .filter_map(|p| p.owner.as_deref())
        .collect();
    owners.sort_unstable();
    owners.dedup();
    let unowned: Vec<&outbox_relayer::store::PartitionStatus> =
        partitions.iter().filter(|p| !p.live).collect();
    let stranded: i64 = unowned.iter().map(|p| p.pending).sum();
    if owners.is_empty() {
        checks.push(if stranded > 0 {
            Check::warn(
                "relays",
                "alive",
                format!("no relay holds a lease, and {stranded} events are pending"),
                "start `outbox relay` with the same database, schema and table",
            )
        } else {
            Check::ok("relays", "alive", "none running (nothing pending)")
        });
        return;
    }
    checks.push(Check::ok(
        "relays",
        "alive",
        format!("{}: {}", owners.len(), owners.join(", ")),
    ));
    checks.push(if unowned.is_empty() {
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
    });
}
