//! `outbox status`.

use std::process::ExitCode;

use outbox_relay::store::{PgStore, SqliteStore, Store};

use super::{connect_any, require_url, CommandResult, DatabaseArgs, Db};

/// Options of `outbox status`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Print JSON for scripts.
    #[arg(long)]
    json: bool,
}

/// Prints backlog, lag, dead letters and partition owners.
pub async fn run(args: Args) -> CommandResult {
    let tables = args.db.tables()?;
    let (backlog, partitions) =
        match connect_any(require_url(args.db.database_url.as_deref())?, 2).await? {
            Db::Postgres(pool) => {
                let store = PgStore::open(pool, &tables).await?;
                (store.backlog().await?, store.partition_status().await?)
            }
            Db::Sqlite(pool) => {
                let store = SqliteStore::open(pool, &tables).await?;
                (Store::backlog(&store).await?, Vec::new())
            }
        };
    let oldest = backlog.oldest_age.map(|a| a.as_secs_f64());
    if args.json {
        let doc = serde_json::json!({
            "schema": tables.schema().as_str(),
            "table": tables.events().as_str(),
            "pending": backlog.pending,
            "oldest_pending_age_seconds": oldest,
            "dead": backlog.dead,
            "partitions": partitions,
        });
        super::print(&format!("{}\n", serde_json::to_string_pretty(&doc)?));
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = String::new();
    use std::fmt::Write;
    writeln!(
        out,
        "outbox {}.{}: {} pending (oldest {}), {} dead",
        tables.schema().as_str(),
        tables.events().as_str(),
        backlog.pending,
        oldest.map_or("-".to_owned(), |s| format!("{s:.1}s")),
        backlog.dead
    )?;
    writeln!(
        out,
        "{:>9}  {:<32} {:>6} {:>6} {:>9} {:>10}",
        "partition", "owner", "epoch", "lease", "pending", "oldest"
    )?;
    for p in partitions {
        writeln!(
            out,
            "{:>9}  {:<32} {:>6} {:>6} {:>9} {:>10}",
            p.partition,
            p.owner.as_deref().unwrap_or("-"),
            p.epoch,
            if p.live { "live" } else { "free" },
            p.pending,
            p.oldest_age_seconds
                .map_or("-".to_owned(), |s| format!("{s:.1}s")),
        )?;
    }
    super::print(&out);
    Ok(ExitCode::SUCCESS)
}
