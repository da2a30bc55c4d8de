//! `outbox sagas list | show`: saga instances and their history, for operators.

use std::{fmt::Write, process::ExitCode};

use chrono::{DateTime, Utc};
use outbox_consumer::saga::inspect::{self, InstanceFilter};
use sqlx::PgPool;

use super::{connect, print, require_url, CommandResult, DatabaseArgs};

/// Options of `outbox sagas`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    /// Instances, most recently changed first, with a count per type and state.
    List {
        #[command(flatten)]
        db: DatabaseArgs,
        /// Only this saga type.
        #[arg(long = "type")]
        saga_type: Option<String>,
        /// Only instances in this state.
        #[arg(long)]
        state: Option<String>,
        /// Only instances not finished.
        #[arg(long)]
        open: bool,
        /// Only instances whose deadline has passed (the timeout scheduler is behind or down).
        #[arg(long)]
        overdue: bool,
        /// Only instances with unexpected or orphaned events recorded.
        #[arg(long)]
        problems: bool,
        /// At most this many instances.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// One instance: state, data, deadline and every step it took.
    Show {
        #[command(flatten)]
        db: DatabaseArgs,
        /// Saga type.
        saga_type: String,
        /// Correlation id.
        correlation_id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `outbox sagas …`.
pub async fn run(args: Args) -> CommandResult {
    match args.action {
        Action::List {
            db,
            saga_type,
            state,
            open,
            overdue,
            problems,
            limit,
            json,
        } => {
            let tables = db.tables()?;
            let pool = connect(require_url(db.database_url.as_deref())?, 2).await?;
            let filter = InstanceFilter {
                saga_type: saga_type.clone(),
                state,
                open,
                overdue,
                problems,
                limit,
            };
            let instances = inspect::list(&pool, &tables, &filter)
                .await
                .map_err(|e| missing_tables(e, &tables))?;
            let counts = inspect::counts(&pool, &tables, saga_type.as_deref()).await?;
            if json {
                let doc = serde_json::json!({ "counts": counts, "instances": instances });
                print(&format!("{}\n", serde_json::to_string_pretty(&doc)?));
                return Ok(ExitCode::SUCCESS);
            }
            let mut out = String::new();
            for c in &counts {
                writeln!(
                    out,
                    "{} {}: {} instance(s), {} overdue",
                    c.saga_type, c.state, c.instances, c.overdue
                )?;
            }
            if counts.is_empty() {
                writeln!(out, "no saga instances")?;
            }
            if !instances.is_empty() {
                use crate::table::{render, Align::*};
                let now = Utc::now();
                let rows = instances.iter().map(|i| {
                    vec![
                        crate::escape::control(&i.saga_type).into_owned(),
                        crate::escape::control(&i.correlation_id).into_owned(),
                        crate::escape::control(&i.state).into_owned(),
                        i.version.to_string(),
                        deadline_text(i.deadline, now),
                        i.problems.to_string(),
                        i.updated_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                    ]
                });
                let header = [
                    ("type", Left),
                    ("correlation id", Left),
                    ("state", Left),
                    ("version", Right),
                    ("deadline", Left),
                    ("problems", Right),
                    ("updated", Left),
                ];
                write!(out, "\n{}", render(&header, rows))?;
            }
            print(&out);
            Ok(ExitCode::SUCCESS)
        }
        Action::Show {
            db,
            saga_type,
            correlation_id,
            json,
        } => {
            let tables = db.tables()?;
            let pool = connect(require_url(db.database_url.as_deref())?, 2).await?;
            let found = inspect::find(&pool, &tables, &saga_type, &correlation_id)
                .await
                .map_err(|e| missing_tables(e, &tables))?;
            let steps = inspect::steps(&pool, &tables, &saga_type, &correlation_id).await?;
            let Some((instance, data)) = found else {
                if steps.is_empty() {
                    return Err(format!("no saga {saga_type} {correlation_id:?}").into());
                }
                // Orphaned events were recorded for an instance that was never created.
                return print_steps_only(&saga_type, &correlation_id, &steps, json);
            };
            if json {
                let doc = serde_json::json!({ "instance": instance, "data": data, "steps": steps });
                print(&format!("{}\n", serde_json::to_string_pretty(&doc)?));
                return Ok(ExitCode::SUCCESS);
            }
            let mut out = String::new();
            writeln!(
                out,
                "saga {} {:?}: {}{} (version {}), deadline {}",
                instance.saga_type,
                instance.correlation_id,
                instance.state,
                if instance.finished { ", finished" } else { "" },
                instance.version,
                deadline_text(instance.deadline, Utc::now())
            )?;
            writeln!(
                out,
                "created {}, updated {}",
                instance.created_at.format("%Y-%m-%d %H:%M:%S%.3f"),
                instance.updated_at.format("%Y-%m-%d %H:%M:%S%.3f")
            )?;
            writeln!(out, "data: {data}")?;
            write_steps(&mut out, &steps)?;
            print(&out);
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn print_steps_only(
    saga_type: &str,
    correlation_id: &str,
    steps: &[inspect::SagaStep],
    json: bool,
) -> CommandResult {
    if json {
        let doc = serde_json::json!({ "instance": null, "steps": steps });
        print(&format!("{}\n", serde_json::to_string_pretty(&doc)?));
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = format!("saga {saga_type} {correlation_id:?}: no instance (events recorded)\n");
    write_steps(&mut out, steps)?;
    print(&out);
    Ok(ExitCode::SUCCESS)
}

fn write_steps(out: &mut String, steps: &[inspect::SagaStep]) -> std::fmt::Result {
    writeln!(out, "\n{} step(s):", steps.len())?;
    for s in steps {
        writeln!(
            out,
            "  {}  {:<22} {:<14} {} -> {}{}{}",
            s.at.format("%H:%M:%S%.3f"),
            s.trigger,
            s.outcome,
            s.from_state.as_deref().unwrap_or("(new)"),
            s.to_state.as_deref().unwrap_or("-"),
            if s.emitted.is_empty() {
                String::new()
            } else {
                format!(", emitted {}", s.emitted.len())
            },
            s.detail
                .as_deref()
                .map_or(String::new(), |d| format!("  ({d})"))
        )?;
    }
    Ok(())
}

fn deadline_text(deadline: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    match deadline {
        None => "-".into(),
        Some(d) if d <= now => format!("{}s ago", (now - d).num_seconds()),
        Some(d) => format!("in {}s", (d - now).num_seconds()),
    }
}

/// A schema without the saga tables: say which migration to run, not a raw SQL error.
fn missing_tables(e: sqlx::Error, tables: &outbox::Tables) -> Box<dyn std::error::Error> {
    match &e {
        sqlx::Error::Database(d) if d.code().as_deref() == Some("42P01") => format!(
            "no saga tables in schema {:?}: run `outbox migrate` (migration 7 creates them)",
            tables.schema().as_str()
        )
        .into(),
        _ => e.into(),
    }
}

/// Deletes finished instances not changed for `retention`, with their steps, and steps
/// recorded for no instance older than it (see `outbox_consumer::saga::inspect`). Returns
/// (instances, steps) deleted.
pub async fn purge_finished(
    pool: &PgPool,
    tables: &outbox::Tables,
    retention: std::time::Duration,
    batch: i64,
) -> Result<(u64, u64), Box<dyn std::error::Error>> {
    inspect::purge_finished(pool, tables, retention, batch)
        .await
        .map_err(|e| missing_tables(e, tables))
}
