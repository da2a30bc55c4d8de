//! `outbox migrate`.

use outbox::Outbox;
use std::process::ExitCode;

use outbox::postgres::{cdc, MigrateOptions, PgOutbox};

use super::{connect_any, kind, require_url, CommandResult, DatabaseArgs, Db, Kind};

/// Options of `outbox migrate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Partition count of a new outbox (default 32); on an existing one it must match.
    #[arg(long)]
    partitions: Option<i32>,
    /// Create the events table range-partitioned by occurred_at in slices of this many days,
    /// so purge drops whole partitions (PostgreSQL; only when the outbox is created).
    #[arg(long, value_name = "DAYS")]
    time_partition_days: Option<i32>,
    /// Also set up change data capture for `outbox relay --mode cdc`: the publication and the
    /// logical replication slot (PostgreSQL with wal_level = logical; the user needs the
    /// REPLICATION attribute). Idempotent; a lost slot is recreated and the rows it missed
    /// are caught up from the table.
    #[arg(long)]
    cdc: bool,
    /// Drop the CDC slot and publication (stop the CDC relays first): a slot nobody reads
    /// retains WAL until the disk is full.
    #[arg(long, conflicts_with = "cdc")]
    drop_cdc: bool,
    /// Replication slot name [default: the one already set up for this outbox, else
    /// {schema}_{table}, with a suffix of its own when another database of the cluster has a
    /// slot of that name].
    #[arg(long)]
    slot: Option<String>,
    /// Publication name [default: {schema}_{table}].
    #[arg(long)]
    publication: Option<String>,
    /// Print the SQL instead of running it, for DBAs who apply migrations with their own
    /// tools: what this database lacks (read, nothing written), with the bookkeeping rows that
    /// tell a later `migrate` and every relay that it is applied. Apply it with psql -v
    /// ON_ERROR_STOP=1 -f, mysql or sqlite3.
    #[arg(long, conflicts_with_all = ["cdc", "drop_cdc"])]
    print: bool,
    /// With --print: connect to nothing and print every migration, for a new outbox (the
    /// database URL's scheme picks the dialect: postgres://, mysql:// or sqlite:).
    #[arg(long, requires = "print")]
    offline: bool,
}

/// Applies pending migrations, or prints them.
pub async fn run(args: Args) -> CommandResult {
    if args.print {
        return print(args).await;
    }
    let tables = args.db.tables()?;
    let options = MigrateOptions {
        partitions: args.partitions,
        time_partition_days: args.time_partition_days,
    };
    // The events table as the database names it: `"outbox"."events"` on PostgreSQL,
    // `outbox_events` on MySQL and SQLite (prefixed tables in the URL's database).
    let table = match connect_any(require_url(args.db.database_url.as_deref())?, 2).await? {
        Db::Postgres(pool) => {
            PgOutbox::new(tables.clone())
                .migrate(&pool, options)
                .await?;
            if args.cdc || args.drop_cdc {
                let names = cdc::CdcNames::resolve(
                    &pool,
                    &tables,
                    args.slot.as_deref(),
                    args.publication.as_deref(),
                )
                .await?;
                if args.drop_cdc {
                    cdc::drop(&pool, &tables, &names).await?;
                    super::print(&format!(
                        "dropped CDC slot {} and publication {}\n",
                        names.slot.as_str(),
                        names.publication.as_str()
                    ));
                } else {
                    let setup = cdc::setup(&pool, &tables, &names).await?;
                    super::print(&format!(
                        "CDC: publication {} {}, slot {} {}{}\n",
                        names.publication.as_str(),
                        if setup.created_publication {
                            "created"
                        } else {
                            "exists"
                        },
                        names.slot.as_str(),
                        if setup.created_slot {
                            "created"
                        } else {
                            "exists"
                        },
                        match setup.catch_up_max_id {
                            Some(id) => format!(
                                "; pending rows up to id {id} are published from the table first"
                            ),
                            None => String::new(),
                        }
                    ));
                }
            }
            format!("{}.{}", tables.schema(), tables.events())
        }
        Db::MySql(pool) => {
            if args.cdc || args.drop_cdc {
                return Err("--cdc: change data capture needs PostgreSQL".into());
            }
            outbox::mysql::MySqlOutbox::new(tables.clone())
                .migrate(&pool, options)
                .await?;
            tables.render_mysql("{events}")
        }
        Db::Sqlite(pool) => {
            if args.cdc || args.drop_cdc {
                return Err("--cdc: change data capture needs PostgreSQL".into());
            }
            outbox::sqlite::SqliteOutbox::new(tables.clone())
                .migrate(&pool, options)
                .await?;
            tables.render_sqlite("{events}")
        }
    };
    super::print(&format!("outbox {table} is up to date\n"));
    Ok(ExitCode::SUCCESS)
}

/// `migrate --print`: the SQL script of what `migrate` would apply.
async fn print(args: Args) -> CommandResult {
    let tables = args.db.tables()?;
    let url = require_url(args.db.database_url.as_deref())?;
    let options = MigrateOptions {
        partitions: args.partitions,
        time_partition_days: args.time_partition_days,
    };
    let script = match kind(url)? {
        Kind::Postgres => {
            let outbox = PgOutbox::new(tables);
            if args.offline {
                outbox.migration_script(None, options).await?
            } else {
                let pool = super::connect(url, 1).await?;
                outbox.migration_script(Some(&pool), options).await?
            }
        }
        Kind::MySql => {
            let outbox = outbox::mysql::MySqlOutbox::new(tables);
            if args.offline {
                outbox.migration_script(None, options).await?
            } else {
                let Db::MySql(pool) = connect_any(url, 1).await? else {
                    unreachable!("a mysql:// URL opens MySQL")
                };
                outbox.migration_script(Some(&pool), options).await?
            }
        }
        Kind::Sqlite => {
            let outbox = outbox::sqlite::SqliteOutbox::new(tables);
            match (args.offline, sqlite_read_only(url).await?) {
                (false, Some(pool)) => outbox.migration_script(Some(&pool), options).await?,
                _ => outbox.migration_script(None, options).await?,
            }
        }
    };
    super::print(&script);
    Ok(ExitCode::SUCCESS)
}

/// The SQLite database `url` names, opened read-only; `None` when its file does not exist
/// (a new outbox: every migration is due, and printing creates no file).
async fn sqlite_read_only(url: &str) -> Result<Option<sqlx::SqlitePool>, String> {
    use std::str::FromStr;
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
        .map_err(|e| format!("invalid SQLite URL: {e}"))?
        .read_only(true)
        .create_if_missing(false);
    if !options.get_filename().exists() {
        return Ok(None);
    }
    sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .map(Some)
        .map_err(|e| format!("cannot open the SQLite database: {e}"))
}
