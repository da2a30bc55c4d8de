//! `outbox dead-letters list | show | replay | skip | audit`.

use std::{process::ExitCode, time::Duration};

use chrono::{DateTime, Utc};
use outbox_relayer::admin::{Admin, DeadLetter, DeadLetterFilter};

use super::{CommandResult, DatabaseArgs};
use crate::escape;

/// Options of `outbox dead-letters`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    /// List dead letters (oldest first).
    List {
        #[command(flatten)]
        db: DatabaseArgs,
        #[command(flatten)]
        filter: Filter,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one dead letter with its headers and payload.
    Show {
        #[command(flatten)]
        db: DatabaseArgs,
        /// Row id (from `list`).
        id: i64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make dead letters pending again (attempts reset); their aggregates resume. Audited.
    Replay {
        #[command(flatten)]
        db: DatabaseArgs,
        #[command(flatten)]
        filter: Filter,
        /// Replay every dead letter when no filter is given.
        #[arg(long)]
        all: bool,
        /// Show what would be replayed, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// About this many events per second, an aggregate's dead letters together (default:
        /// all at once).
        #[arg(long)]
        rate: Option<u32>,
        /// Why (recorded in the audit table).
        #[arg(long, default_value = "replay")]
        reason: String,
        /// Who (recorded in the audit table).
        #[arg(long, env = "USER", default_value = "unknown")]
        actor: String,
    },
    /// Abandon dead letters: they stay dead, and stop parking their aggregates' later events.
    /// The one exception to per-aggregate order; audited, and it needs a reason.
    Skip {
        #[command(flatten)]
        db: DatabaseArgs,
        /// Row ids to skip.
        #[arg(long = "id", required = true)]
        ids: Vec<i64>,
        /// Why (required; recorded in the audit table).
        #[arg(long)]
        reason: String,
        /// Who (recorded in the audit table).
        #[arg(long, env = "USER", default_value = "unknown")]
        actor: String,
        /// Show what would be skipped, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// The latest operator actions.
    Audit {
        #[command(flatten)]
        db: DatabaseArgs,
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
}

/// Which dead letters.
#[derive(clap::Args, Debug, Clone)]
struct Filter {
    /// Row ids (repeatable).
    #[arg(long = "id")]
    ids: Vec<i64>,
    /// Event type.
    #[arg(long)]
    event_type: Option<String>,
    /// Aggregate type.
    #[arg(long)]
    aggregate_type: Option<String>,
    /// Aggregate id.
    #[arg(long)]
    aggregate_id: Option<String>,
    /// Occurred at or after (RFC 3339, e.g. 2026-11-30T00:00:00Z).
    #[arg(long)]
    since: Option<DateTime<Utc>>,
    /// Occurred before (RFC 3339).
    #[arg(long)]
    until: Option<DateTime<Utc>>,
    /// Last error contains this text (case-insensitive).
    #[arg(long)]
    error: Option<String>,
    /// At most this many.
    #[arg(long, default_value_t = 100)]
    limit: i64,
}

impl Filter {
    fn is_empty(&self) -> bool {
        self.ids.is_empty()
            && self.event_type.is_none()
            && self.aggregate_type.is_none()
            && self.aggregate_id.is_none()
            && self.since.is_none()
            && self.until.is_none()
            && self.error.is_none()
    }

    fn to_filter(&self) -> Result<DeadLetterFilter, String> {
        let filter = DeadLetterFilter {
            event_type: self.event_type.clone(),
            aggregate_type: self.aggregate_type.clone(),
            aggregate_id: self.aggregate_id.clone(),
            since: self.since,
            until: self.until,
            error_contains: self.error.clone(),
            ids: (!self.ids.is_empty()).then(|| self.ids.clone()),
            limit: Some(self.limit),
        };
        filter.validate()?;
        Ok(filter)
    }
}

async fn admin(db: &DatabaseArgs) -> Result<Admin, Box<dyn std::error::Error>> {
    Ok(super::open_outbox(db).await?.admin)
}

/// Runs the action.
pub async fn run(args: Args) -> CommandResult {
    match args.action {
        Action::List { db, filter, json } => {
            let letters = admin(&db).await?.dead_letters(&filter.to_filter()?).await?;
            if json {
                super::print(&format!("{}\n", serde_json::to_string_pretty(&letters)?));
            } else {
                super::print(&table(&letters));
            }
        }
        Action::Show { db, id, json } => {
            let admin = admin(&db).await?;
            let filter = DeadLetterFilter {
                ids: Some(vec![id]),
                ..Default::default()
            };
            let Some(letter) = admin.dead_letters(&filter).await?.into_iter().next() else {
                return Err(format!("no dead letter with id {id}").into());
            };
            let payload = admin.payload(id).await?.unwrap_or_default();
            let body = match std::str::from_utf8(&payload) {
                Ok(text) => text.to_owned(),
                Err(_) => format!("({} bytes, not UTF-8)", payload.len()),
            };
            if json {
                let mut doc = serde_json::to_value(&letter)?;
                doc["payload"] = serde_json::Value::String(body);
                super::print(&format!("{}\n", serde_json::to_string_pretty(&doc)?));
            } else {
                super::print(&format!(
                    "{}\nheaders: {}\npayload: {}\n",
                    table(std::slice::from_ref(&letter)),
                    escape::control(&letter.headers.to_string()),
                    escape::control(&body)
                ));
            }
        }
        Action::Replay {
            db,
            filter,
            all,
            dry_run,
            rate,
            reason,
            actor,
        } => {
            if filter.is_empty() && !all {
                return Err("replay needs --id, a filter, or --all".into());
            }
            let admin = admin(&db).await?;
            let letters = admin.dead_letters(&filter.to_filter()?).await?;
            if dry_run || letters.is_empty() {
                super::print(&format!(
                    "{}{} dead letters would be replayed\n",
                    table(&letters),
                    letters.len()
                ));
                return Ok(ExitCode::SUCCESS);
            }
            let ids: Vec<i64> = letters.iter().map(|l| l.id).collect();
            let chunk = rate.map_or(ids.len(), |r| r.max(1) as usize);
            let mut replayed = 0;
            let mut not_replayed: Vec<i64> = Vec::new();
            let keyed: Vec<(i64, &str, &str)> = letters
                .iter()
                .map(|l| (l.id, l.aggregate_type.as_str(), l.aggregate_id.as_str()))
                .collect();
            for (i, part) in by_aggregate(&keyed, chunk).iter().enumerate() {
                if i > 0 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                let done = admin.replay_report(part, &actor, &reason).await?;
                replayed += done.replayed;
                not_replayed.extend(done.not_replayed);
            }
            super::print(&format!("replayed {replayed} dead letters\n"));
            if !not_replayed.is_empty() {
                let kept: Vec<DeadLetter> = letters
                    .into_iter()
                    .filter(|l| not_replayed.contains(&l.id))
                    .collect();
                super::print(&format!(
                    "{}{} dead letters not replayed: each comes before the dead letter that \
                     parks its aggregate; replay them together with it\n",
                    table(&kept),
                    kept.len()
                ));
            }
        }
        Action::Skip {
            db,
            ids,
            reason,
            actor,
            dry_run,
        } => {
            if reason.trim().is_empty() {
                return Err("--reason must say why the events are abandoned".into());
            }
            let admin = admin(&db).await?;
            let filter = DeadLetterFilter {
                ids: Some(ids.clone()),
                limit: Some(ids.len() as i64),
                ..Default::default()
            };
            let letters = admin.dead_letters(&filter).await?;
            let found: Vec<i64> = letters.iter().map(|l| l.id).collect();
            let missing: Vec<&i64> = ids.iter().filter(|id| !found.contains(id)).collect();
            if !missing.is_empty() {
                return Err(format!("not dead letters: {missing:?}").into());
            }
            if dry_run {
                super::print(&format!(
                    "{}{} dead letters would be skipped\n",
                    table(&letters),
                    letters.len()
                ));
                return Ok(ExitCode::SUCCESS);
            }
            let released = admin.skip(&ids, &actor, &reason).await?;
            super::print(&format!(
                "skipped {} dead letters; {released} parked aggregates released\n",
                ids.len()
            ));
        }
        Action::Audit { db, limit } => {
            let entries = admin(&db).await?.audit(limit).await?;
            let mut out = String::new();
            for e in entries {
                out.push_str(&format!(
                    "{}  {}  {:<6}  by {:<12} {:?}  {}\n",
                    e.id,
                    e.at.format("%Y-%m-%d %H:%M:%S"),
                    escape::control(&e.action),
                    escape::control(&e.actor),
                    e.event_ids,
                    escape::control(&e.reason)
                ));
            }
            super::print(&out);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The dead letters as a table; writers' data in it has its control characters escaped.
fn table(letters: &[DeadLetter]) -> String {
    use crate::table::{render, Align::*};
    let rows = letters.iter().map(|l| {
        let aggregate = format!("{}/{}", l.aggregate_type, l.aggregate_id);
        let error: String = l.last_error.chars().take(80).collect();
        vec![
            l.id.to_string(),
            escape::control(&l.event_type).into_owned(),
            escape::control(&aggregate).into_owned(),
            l.attempts.to_string(),
            if l.parked { "yes" } else { "no" }.to_owned(),
            escape::control(&error).into_owned(),
        ]
    });
    render(
        &[
            ("id", Right),
            ("event type", Left),
            ("aggregate", Left),
            ("attempts", Right),
            ("parked", Right),
            ("last error", Left),
        ],
        rows,
    )
}

/// The ids of `letters` (id, aggregate type, aggregate id) in chunks of about `size`, each
/// aggregate's in one chunk (a larger one alone): a replay leaves the dead letters before the
/// one that parks their aggregate dead unless that one is replayed with them.
fn by_aggregate(letters: &[(i64, &str, &str)], size: usize) -> Vec<Vec<i64>> {
    let mut groups: Vec<Vec<i64>> = Vec::new();
    let mut index: std::collections::HashMap<(&str, &str), usize> = Default::default();
    for &(id, kind, aggregate) in letters {
        let at = *index.entry((kind, aggregate)).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[at].push(id);
    }
    let mut chunks: Vec<Vec<i64>> = Vec::new();
    for group in groups {
        match chunks.last_mut() {
            Some(last) if last.len() + group.len() <= size.max(1) => last.extend(group),
            _ => chunks.push(group),
        }
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::by_aggregate;

    #[test]
    fn replay_chunks_keep_each_aggregate_whole() {
        let letters = [
            (1, "order", "a"),
            (2, "order", "b"),
            (3, "order", "a"),
            (4, "order", "c"),
            (5, "order", "c"),
            (6, "order", "c"),
        ];
        assert_eq!(
            by_aggregate(&letters, 2),
            vec![vec![1, 3], vec![2], vec![4, 5, 6]]
        );
        assert_eq!(by_aggregate(&letters, 100), vec![vec![1, 3, 2, 4, 5, 6]]);
        assert_eq!(by_aggregate(&letters, 0).len(), 3);
    }
}
