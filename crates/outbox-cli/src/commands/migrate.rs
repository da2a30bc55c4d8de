//! `outbox migrate`.

use std::process::ExitCode;

use outbox::postgres::{MigrateOptions, PgOutbox};

use super::{connect, require_url, CommandResult, DatabaseArgs};

/// Options of `outbox migrate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Partition count of a new outbox (default 32); on an existing one it must match.
    #[arg(long)]
    partitions: Option<i32>,
}

/// Applies pending migrations.
pub async fn run(args: Args) -> CommandResult {
    let tables = args.db.tables()?;
    let pool = connect(require_url(args.db.database_url.as_deref())?, 2).await?;
    PgOutbox::new(tables.clone())
        .migrate(
            &pool,
            MigrateOptions {
                partitions: args.partitions,
            },
        )
        .await?;
    super::print(&format!(
        "outbox {}.{} is up to date\n",
        tables.schema(),
        tables.events()
    ));
    Ok(ExitCode::SUCCESS)
}
