//! `outbox consumer-versions list | held | seed | skip`: where a consumer's aggregates stand in
//! its version gate, what it holds and why, and the two audited ways to move an aggregate on
//! (see `outbox_consumer::versions`).

use std::{fmt::Write, process::ExitCode};

use outbox_consumer::versions::{Change, ConsumerVersions, Filter, Seed};

use super::{connect, print, require_url, CommandResult, DatabaseArgs};

/// Options of `outbox consumer-versions`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    /// The consumer's aggregates: last version applied, first version, events held and why
    /// (those holding events first).
    List {
        #[command(flatten)]
        target: Target,
        /// Only aggregates holding events.
        #[arg(long)]
        held: bool,
        /// At most this many aggregates.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The consumer's held events, oldest first: why each is held, its attempts and error.
    Held {
        #[command(flatten)]
        target: Target,
        /// At most this many events.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Set where aggregates start: one aggregate at a version (versions up to it are done),
    /// or, with --from-held, every aggregate that holds events and has applied none at its
    /// lowest held version (a consumer deployed after its aggregates' first events). Never
    /// moves an aggregate back. Audited.
    Seed {
        #[command(flatten)]
        target: Target,
        /// Versions up to this one are done: the gate expects the next.
        #[arg(long, conflicts_with = "from_held")]
        version: Option<i64>,
        /// Start each held aggregate (of --aggregate-type, if given) at its lowest held version.
        #[arg(long)]
        from_held: bool,
        /// At most this many aggregates (with --from-held).
        #[arg(long, default_value_t = 1000)]
        limit: i64,
        #[command(flatten)]
        audit: Audit,
    },
    /// Skip a gap that will never fill (a version skipped on the relay's side, a dead letter
    /// given up): versions up to --to (default: the one before the lowest held event) are
    /// declared done, and the held events apply from there. Audited.
    Skip {
        #[command(flatten)]
        target: Target,
        /// Versions up to this one are declared done.
        #[arg(long)]
        to: Option<i64>,
        #[command(flatten)]
        audit: Audit,
    },
}

/// The consumer, its database, and the aggregates a command looks at.
#[derive(clap::Args, Debug)]
struct Target {
    #[command(flatten)]
    db: DatabaseArgs,
    /// The consumer's name (its inbox key).
    #[arg(long)]
    consumer: String,
    /// Only this aggregate type.
    #[arg(long)]
    aggregate_type: Option<String>,
    /// Only this aggregate id.
    #[arg(long)]
    aggregate_id: Option<String>,
}

/// Who changes what, and why.
#[derive(clap::Args, Debug)]
struct Audit {
    /// Show what would change, change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Why (recorded in the audit table).
    #[arg(long)]
    reason: String,
    /// Who (recorded in the audit table).
    #[arg(long, env = "USER", default_value = "unknown")]
    actor: String,
}

impl Target {
    async fn open(&self) -> Result<ConsumerVersions, Box<dyn std::error::Error>> {
        let tables = self.db.tables()?;
        let pool = connect(require_url(self.db.database_url.as_deref())?, 2).await?;
        Ok(ConsumerVersions::new(pool, &tables, &self.consumer))
    }

    fn filter(&self, held_only: bool, limit: i64) -> Filter {
        Filter {
            aggregate_type: self.aggregate_type.clone(),
            aggregate_id: self.aggregate_id.clone(),
            held_only,
            limit,
        }
    }
}

/// Runs `outbox consumer-versions …`.
pub async fn run(args: Args) -> CommandResult {
    match args.action {
        Action::List {
            target,
            held,
            limit,
            json,
        } => {
            let rows = target
                .open()
                .await?
                .list(&target.filter(held, limit))
                .await?;
            if json {
                print(&format!("{}\n", serde_json::to_string_pretty(&rows)?));
                return Ok(ExitCode::SUCCESS);
            }
            if rows.is_empty() {
                print(&format!("consumer {}: no aggregates\n", target.consumer));
                return Ok(ExitCode::SUCCESS);
            }
            let mut out = String::new();
            for r in &rows {
                write!(
                    out,
                    "{} {:?}: version {}, first {}{}",
                    r.aggregate_type,
                    r.aggregate_id,
                    opt(r.version),
                    opt(r.first_version),
                    if r.seeded { " (seeded)" } else { "" }
                )?;
                if r.held > 0 {
                    write!(
                        out,
                        "; {} held, oldest {:.0}s",
                        r.held,
                        r.oldest_held_seconds.unwrap_or_default()
                    )?;
                    if let Some(reason) = &r.reason {
                        write!(out, ": {reason}")?;
                    }
                }
                writeln!(out)?;
            }
            print(&out);
            Ok(ExitCode::SUCCESS)
        }
        Action::Held {
            target,
            limit,
            json,
        } => {
            let rows = target
                .open()
                .await?
                .held(&target.filter(false, limit))
                .await?;
            if json {
                print(&format!("{}\n", serde_json::to_string_pretty(&rows)?));
                return Ok(ExitCode::SUCCESS);
            }
            if rows.is_empty() {
                print(&format!("consumer {}: nothing held\n", target.consumer));
                return Ok(ExitCode::SUCCESS);
            }
            let mut out = String::new();
            for h in &rows {
                let aggregate = match (&h.aggregate_type, &h.aggregate_id) {
                    (Some(kind), Some(id)) => format!("{kind} {id:?} v{}", opt(h.version)),
                    _ => "(no aggregate)".into(),
                };
                let next = if h.dead {
                    "given up, dead letter not stored yet".into()
                } else {
                    format!(
                        "next {}",
                        h.next_attempt_at
                            .map_or("when its turn comes".into(), |t| t.to_rfc3339())
                    )
                };
                writeln!(
                    out,
                    "{} {} {aggregate}: held {:.0}s, {} attempt(s), {next}: {}",
                    h.event_id, h.event_type, h.held_seconds, h.attempts, h.reason
                )?;
            }
            print(&out);
            Ok(ExitCode::SUCCESS)
        }
        Action::Seed {
            target,
            version,
            from_held,
            limit,
            audit,
        } => {
            let seed = match (version, from_held) {
                (Some(version), false) => Seed::Version(version),
                (None, true) => Seed::LowestHeld,
                _ => return Err("seed needs --version (one aggregate) or --from-held".into()),
            };
            let changes = target
                .open()
                .await?
                .seed(
                    &target.filter(false, limit),
                    &seed,
                    audit.dry_run,
                    &audit.actor,
                    &audit.reason,
                )
                .await?;
            report(&changes, audit.dry_run, "seeded");
            Ok(ExitCode::SUCCESS)
        }
        Action::Skip { target, to, audit } => {
            let (Some(kind), Some(id)) = (&target.aggregate_type, &target.aggregate_id) else {
                return Err("skip needs --aggregate-type and --aggregate-id".into());
            };
            let change = target
                .open()
                .await?
                .skip(kind, id, to, audit.dry_run, &audit.actor, &audit.reason)
                .await?;
            report(&[change], audit.dry_run, "skipped to");
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn opt(v: Option<i64>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

fn report(changes: &[Change], dry_run: bool, verb: &str) {
    let mut out = String::new();
    for c in changes {
        let _ = writeln!(
            out,
            "{}{} {:?}: {verb} version {} (was {})",
            if dry_run { "would be " } else { "" },
            c.aggregate_type,
            c.aggregate_id,
            c.to,
            opt(c.from)
        );
    }
    if changes.is_empty() {
        out.push_str("no aggregate to change\n");
    } else if !dry_run {
        let _ = writeln!(out, "{} aggregate(s) changed; audited", changes.len());
    }
    print(&out);
}
