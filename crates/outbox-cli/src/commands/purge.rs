//! `outbox purge`: delete published events older than a retention, in small batches.

use std::{process::ExitCode, time::Duration};

use indicatif::{ProgressBar, ProgressStyle};

use super::{CommandResult, DatabaseArgs, Db};

/// Options of `outbox purge`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Delete published events older than this (e.g. "7d", "36h"). Pending and dead events are
    /// never deleted.
    #[arg(long, value_parser = humantime::parse_duration)]
    older_than: Duration,
    /// Rows per statement (short transactions, no long locks).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=100_000))]
    batch: i64,
    /// Move the rows into `{table}_archive` instead of deleting them.
    #[arg(long)]
    archive: bool,
    /// Also delete inbox rows older than this; it must exceed any redelivery window.
    #[arg(long, value_parser = humantime::parse_duration)]
    inbox_older_than: Option<Duration>,
    /// Also delete finished saga instances (and their steps) not changed for this long, and
    /// recorded orphan or uncorrelated saga events older than it.
    #[arg(long, value_parser = humantime::parse_duration)]
    sagas_older_than: Option<Duration>,
    /// Count what would be deleted, delete nothing.
    #[arg(long)]
    dry_run: bool,
}

/// Purges and reports the count.
pub async fn run(args: Args) -> CommandResult {
    let outbox = super::open_outbox(&args.db).await?;
    let saga_pool = match (&outbox.db, args.sagas_older_than) {
        (Db::Postgres(pool), Some(_)) => Some(pool.clone()),
        (Db::MySql(_) | Db::Sqlite(_), Some(_)) => {
            return Err(
                "--sagas-older-than: sagas are stored on PostgreSQL only; a MySQL or \
                        SQLite outbox has none to purge"
                    .into(),
            )
        }
        (_, None) => None,
    };
    let (admin, tables) = (outbox.admin, outbox.tables);
    let age = humantime::format_duration(args.older_than);
    let partitions = admin
        .drop_expired_partitions(args.older_than, args.archive, args.dry_run)
        .await?;
    let would = if args.dry_run { "would be " } else { "" };
    for (name, rows) in &partitions.dropped {
        super::print(&format!(
            "partition {name} ({rows} published events) {would}dropped\n"
        ));
    }
    for name in &partitions.kept {
        super::print(&format!(
            "partition {name} kept: it still holds pending or dead events\n"
        ));
    }
    for name in &partitions.busy {
        super::print(&format!(
            "partition {name} left for a later run: another process was dropping partitions, \
             or a transaction was using the events table (the drop never waits for a lock)\n"
        ));
    }
    let due = admin.purgeable(args.older_than).await?;
    if args.dry_run {
        super::print(&format!(
            "dry run: {due} published events older than {age} would be deleted\n"
        ));
        return Ok(ExitCode::SUCCESS);
    }
    let bar = ProgressBar::new(due.max(0) as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} published events deleted")
            .expect("valid template"),
    );
    let purged = admin
        .purge(args.older_than, args.batch, args.archive, |total| {
            bar.set_position(total)
        })
        .await?;
    bar.finish_and_clear();
    let verb = if args.archive { "archived" } else { "purged" };
    super::print(&format!(
        "{verb} {purged} published events older than {age}\n"
    ));
    if let Some(retention) = args.inbox_older_than {
        let removed = admin.purge_inbox(retention, args.batch).await?;
        super::print(&format!(
            "purged {removed} inbox rows older than {}\n",
            humantime::format_duration(retention)
        ));
    }
    if let (Some(retention), Some(pool)) = (args.sagas_older_than, saga_pool) {
        let (instances, steps) =
            super::sagas::purge_finished(&pool, &tables, retention, args.batch).await?;
        super::print(&format!(
            "purged {instances} finished sagas and {steps} saga steps older than {}\n",
            humantime::format_duration(retention)
        ));
    }
    Ok(ExitCode::SUCCESS)
}
