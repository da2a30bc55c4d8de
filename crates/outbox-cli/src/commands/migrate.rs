//! `outbox migrate`.

use std::process::ExitCode;

use outbox::postgres::{MigrateOptions, PgOutbox};

use super::{connect_any, require_url, CommandResult, DatabaseArgs, Db};

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
}

/// Applies pending migrations.
pub async fn run(args: Args) -> CommandResult {
    let tables = args.db.tables()?;
    match connect_any(require_url(args.db.database_url.as_deref())?, 2).await? {
        Db::Postgres(pool) => {
            PgOutbox::new(tables.clone())
                .migrate(
                    &pool,
                    MigrateOptions {
                        partitions: args.partitions,
                        time_partition_days: args.time_partition_days,
                    },
                )
                .await?
        }
        Db::Sqlite(pool) => {
            if args.partitions.is_some_and(|p| p != 1) {
                return Err(
                    "--partitions: a SQLite outbox has one partition (one relay at a \
                            time); omit the flag"
                        .into(),
                );
            }
            if args.time_partition_days.is_some() {
                return Err("--time-partition-days: time partitioning needs PostgreSQL".into());
            }
            outbox::sqlite::SqliteOutbox::new(tables.clone())
                .migrate(&pool)
                .await?
        }
    }
    super::print(&format!(
        "outbox {}.{} is up to date\n",
        tables.schema(),
        tables.events()
    ));
    Ok(ExitCode::SUCCESS)
}
