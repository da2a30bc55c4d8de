//! `outbox sagas list | show`: saga instances and their history, for operators.

use std::{fmt::Write, process::ExitCode};

use chrono::{DateTime, Utc};
use sqlx::{types::Json, PgPool};

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

#[derive(sqlx::FromRow, serde::Serialize)]
struct Instance {
    saga_type: String,
    correlation_id: String,
    state: String,
    version: i64,
    finished: bool,
    deadline: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    problems: i64,
}

#[derive(sqlx::FromRow, serde::Serialize)]
struct StepRow {
    at: DateTime<Utc>,
    trigger: String,
    event_id: Option<uuid::Uuid>,
    from_state: Option<String>,
    to_state: Option<String>,
    outcome: String,
    emitted: Vec<uuid::Uuid>,
    detail: Option<String>,
}

const PROBLEMS: &str = "(SELECT count(*) FROM {schema}.saga_steps p \
     WHERE p.saga_type = s.saga_type AND p.correlation_id = s.correlation_id \
       AND p.outcome IN ('unexpected', 'orphan'))";

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
            let sql = tables.render(&format!(
                "SELECT * FROM (SELECT saga_type, correlation_id, state, version, finished, \
                        deadline, created_at, updated_at, {PROBLEMS} AS problems \
                     FROM {{schema}}.sagas s \
                     WHERE ($1::text IS NULL OR saga_type = $1) \
                       AND ($2::text IS NULL OR state = $2) \
                       AND (NOT $3 OR NOT finished) \
                       AND (NOT $4 OR deadline <= now())) i \
                 WHERE NOT $5 OR problems > 0 \
                 ORDER BY updated_at DESC LIMIT $6"
            ));
            let instances: Vec<Instance> = sqlx::query_as(&sql)
                .bind(&saga_type)
                .bind(&state)
                .bind(open)
                .bind(overdue)
                .bind(problems)
                .bind(limit.clamp(1, 10_000))
                .fetch_all(&pool)
                .await
                .map_err(|e| missing_tables(e, &tables))?;
            let counts = counts(&pool, &tables, saga_type.as_deref()).await?;
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
                writeln!(
                    out,
                    "\n{:<20} {:<24} {:<20} {:>7} {:<12} {:>8}  updated",
                    "type", "correlation id", "state", "version", "deadline", "problems"
                )?;
            }
            let now = Utc::now();
            for i in &instances {
                writeln!(
                    out,
                    "{:<20} {:<24} {:<20} {:>7} {:<12} {:>8}  {}",
                    i.saga_type,
                    i.correlation_id,
                    i.state,
                    i.version,
                    deadline_text(i.deadline, now),
                    i.problems,
                    i.updated_at.format("%Y-%m-%d %H:%M:%S")
                )?;
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
            let found: Option<(Instance, Json<serde_json::Value>)> = {
                let sql = tables.render(&format!(
                    "SELECT saga_type, correlation_id, state, version, finished, deadline, \
                            created_at, updated_at, {PROBLEMS} AS problems, data \
                     FROM {{schema}}.sagas s WHERE saga_type = $1 AND correlation_id = $2"
                ));
                let row: Option<sqlx::postgres::PgRow> = sqlx::query(&sql)
                    .bind(&saga_type)
                    .bind(&correlation_id)
                    .fetch_optional(&pool)
                    .await
                    .map_err(|e| missing_tables(e, &tables))?;
                match row {
                    Some(row) => {
                        use sqlx::{FromRow, Row};
                        Some((Instance::from_row(&row)?, row.try_get("data")?))
                    }
                    None => None,
                }
            };
            let steps: Vec<StepRow> = sqlx::query_as(&tables.render(
                "SELECT at, trigger, event_id, from_state, to_state, outcome, emitted, detail \
                 FROM {schema}.saga_steps WHERE saga_type = $1 AND correlation_id = $2 \
                 ORDER BY id",
            ))
            .bind(&saga_type)
            .bind(&correlation_id)
            .fetch_all(&pool)
            .await?;
            let Some((instance, Json(data))) = found else {
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

#[derive(sqlx::FromRow, serde::Serialize)]
struct Count {
    saga_type: String,
    state: String,
    instances: i64,
    overdue: i64,
}

async fn counts(
    pool: &PgPool,
    tables: &outbox::Tables,
    saga_type: Option<&str>,
) -> Result<Vec<Count>, sqlx::Error> {
    sqlx::query_as(&tables.render(
        "SELECT saga_type, state, count(*) AS instances, \
                count(*) FILTER (WHERE deadline <= now()) AS overdue \
         FROM {schema}.sagas WHERE $1::text IS NULL OR saga_type = $1 \
         GROUP BY saga_type, state ORDER BY saga_type, state",
    ))
    .bind(saga_type)
    .fetch_all(pool)
    .await
}

fn print_steps_only(
    saga_type: &str,
    correlation_id: &str,
    steps: &[StepRow],
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

fn write_steps(out: &mut String, steps: &[StepRow]) -> std::fmt::Result {
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
/// recorded for no instance (orphan, uncorrelated) older than it, `batch` at a time. Open
/// instances are never deleted. Returns (instances, steps) deleted.
pub async fn purge_finished(
    pool: &PgPool,
    tables: &outbox::Tables,
    retention: std::time::Duration,
    batch: i64,
) -> Result<(u64, u64), Box<dyn std::error::Error>> {
    let finished = tables.render(
        "WITH gone AS (
             DELETE FROM {schema}.sagas WHERE (saga_type, correlation_id) IN (
                 SELECT saga_type, correlation_id FROM {schema}.sagas
                 WHERE finished AND updated_at < now() - make_interval(secs => $1)
                 LIMIT $2 FOR UPDATE SKIP LOCKED)
             RETURNING saga_type, correlation_id),
         steps AS (
             DELETE FROM {schema}.saga_steps s USING gone g
             WHERE s.saga_type = g.saga_type AND s.correlation_id = g.correlation_id
             RETURNING 1)
         SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM steps)",
    );
    let stray = tables.render(
        "DELETE FROM {schema}.saga_steps WHERE id IN (
             SELECT id FROM {schema}.saga_steps s
             WHERE at < now() - make_interval(secs => $1)
               AND NOT EXISTS (SELECT 1 FROM {schema}.sagas i
                               WHERE i.saga_type = s.saga_type
                                 AND i.correlation_id = s.correlation_id)
             LIMIT $2)",
    );
    let secs = retention.as_secs_f64();
    let (mut instances, mut steps) = (0u64, 0u64);
    loop {
        let (i, s): (i64, i64) = sqlx::query_as(&finished)
            .bind(secs)
            .bind(batch)
            .fetch_one(pool)
            .await
            .map_err(|e| missing_tables(e, tables))?;
        instances += i as u64;
        steps += s as u64;
        if i < batch {
            break;
        }
    }
    loop {
        let n = sqlx::query(&stray)
            .bind(secs)
            .bind(batch)
            .execute(pool)
            .await?
            .rows_affected();
        steps += n;
        if (n as i64) < batch {
            break;
        }
    }
    Ok((instances, steps))
}
