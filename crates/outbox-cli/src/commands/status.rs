//! `outbox status`.

use std::process::ExitCode;

use super::{CommandResult, DatabaseArgs, Db};

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
    let outbox = super::open_outbox(&args.db).await?;
    let tables = outbox.tables;
    let slots = match &outbox.db {
        Db::Postgres(pool) => outbox::postgres::cdc::slots(pool, &tables).await?,
        Db::MySql(_) | Db::Sqlite(_) => Vec::new(),
    };
    let backlog = outbox.store.backlog().await?;
    let partitions = outbox.store.partition_status().await?;
    let oldest = backlog.oldest_age.map(|a| a.as_secs_f64());
    if args.json {
        let doc = serde_json::json!({
            "schema": tables.schema().as_str(),
            "table": tables.events().as_str(),
            "pending": backlog.pending,
            "oldest_pending_age_seconds": oldest,
            "dead": backlog.dead,
            "partitions": partitions,
            "cdc_slots": slots,
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
    {
        use crate::table::{render, Align::*};
        let rows = partitions.iter().map(|p| {
            vec![
                p.partition.to_string(),
                crate::escape::control(p.owner.as_deref().unwrap_or("-")).into_owned(),
                p.epoch.to_string(),
                if p.live { "live" } else { "free" }.to_owned(),
                p.pending.to_string(),
                p.oldest_age_seconds
                    .map_or("-".to_owned(), |s| format!("{s:.1}s")),
            ]
        });
        let header = [
            ("partition", Right),
            ("owner", Left),
            ("epoch", Right),
            ("lease", Right),
            ("pending", Right),
            ("oldest", Right),
        ];
        write!(out, "{}", render(&header, rows))?;
    }
    for s in &slots {
        writeln!(
            out,
            "cdc slot {} (publication {}): {}, {} bytes unconfirmed, {} bytes of WAL retained{}",
            s.slot,
            s.publication,
            match (s.exists, s.active_pid, s.wal_status.as_deref()) {
                (false, _, _) => "LOST: run `outbox migrate --cdc` to recreate it".to_owned(),
                (true, _, Some("lost")) => {
                    "LOST (WAL removed): run `outbox migrate --cdc` to recreate it".to_owned()
                }
                (true, Some(pid), _) => format!("streamed by pid {pid}"),
                (true, None, _) => "not streamed (no CDC relay connected)".to_owned(),
            },
            s.lag_bytes.unwrap_or(0),
            s.retained_bytes.unwrap_or(0),
            s.catch_up_max_id.map_or(String::new(), |id| format!(
                "; catch-up pending up to id {id}"
            )),
        )?;
    }
    super::print(&out);
    Ok(ExitCode::SUCCESS)
}
