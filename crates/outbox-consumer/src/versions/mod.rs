//! Operator tools for a consumer's version gate and held events (`outbox consumer-versions`):
//! read where each aggregate stands and what is held and why, **seed** where aggregates start
//! (a consumer deployed after its aggregates' first events), and **skip** a gap that will never
//! fill (a version skipped on the relay's side, a dead letter given up). Seeds and skips are
//! recorded in the outbox's `audit` table, and lock the aggregate's state row as the runners
//! do, so they take effect between two of a runner's transactions; the runners' sweeps then
//! apply the held events whose turn has come.

use serde::Serialize;
use sqlx::{PgPool, Row};

/// One aggregate of a consumer, as `list` shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AggregateVersion {
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// The last version applied (or declared done), if any.
    pub version: Option<i64>,
    /// The first version the consumer applies (versions below it were never its to apply).
    pub first_version: Option<i64>,
    /// Whether an operator set where it stands.
    pub seeded: bool,
    /// Events of it held.
    pub held: i32,
    /// How long its oldest held event has been held, in seconds.
    pub oldest_held_seconds: Option<f64>,
    /// Why its next held event is held.
    pub reason: Option<String>,
}

/// One held event of a consumer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HeldEvent {
    /// Its row id.
    pub id: i64,
    /// Its inbox key.
    pub message_id: String,
    /// Its event id.
    pub event_id: uuid::Uuid,
    /// Its event type.
    pub event_type: String,
    /// Its aggregate type, if it has one.
    pub aggregate_type: Option<String>,
    /// Its aggregate id, if it has one.
    pub aggregate_id: Option<String>,
    /// Its aggregate version, if it has one.
    pub version: Option<i64>,
    /// Where it was consumed from.
    pub destination: String,
    /// How long it has been held, in seconds.
    pub held_seconds: f64,
    /// When a runner tries it next (`None`: when an earlier event of its aggregate is applied).
    pub next_attempt_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Failed attempts.
    pub attempts: i32,
    /// Tries started (one more than attempts and commits: a try that never finished).
    pub tries: i32,
    /// Its last error, if it failed.
    pub last_error: Option<String>,
    /// Why it is held.
    pub reason: String,
    /// Given up: its dead letter is still to be stored (the runner keeps trying; not 0 for
    /// long means the dead-letter destination is failing).
    pub dead: bool,
}

/// Which aggregates a command looks at.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only this aggregate type.
    pub aggregate_type: Option<String>,
    /// Only this aggregate id.
    pub aggregate_id: Option<String>,
    /// Only aggregates holding events (`list`).
    pub held_only: bool,
    /// At most this many rows.
    pub limit: i64,
}

/// An aggregate's version changed by an operator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Change {
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// The last version applied before (`None`: none).
    pub from: Option<i64>,
    /// The version now declared the last done: the gate expects the next one.
    pub to: i64,
}

/// Errors of the operator tools.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request cannot be done; the message says why and what to do instead.
    #[error("{0}")]
    Refused(String),
    /// The database failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// A consumer's version tools, on the outbox schema of `tables`.
pub struct ConsumerVersions {
    pool: PgPool,
    consumer: String,
    list: String,
    held: String,
    lock: String,
    lowest: String,
    starts: String,
    ensure: String,
    set_version: String,
    release: String,
    audit: String,
}

/// Where a seed starts an aggregate.
#[derive(Clone, Debug)]
pub enum Seed {
    /// Versions up to this one are done: the gate expects the next.
    Version(i64),
    /// At its lowest held version (for aggregates that hold events and have applied none: a
    /// consumer that started late, whose aggregates' first versions are not delivered any
    /// more).
    LowestHeld,
}

impl ConsumerVersions {
    /// The tools for consumer `consumer`.
    pub fn new(pool: PgPool, tables: &outbox::Tables, consumer: impl Into<String>) -> Self {
        let r = |sql: &str| tables.render(sql);
        Self {
            pool,
            consumer: consumer.into(),
            list: r(include_str!("sql/list.sql")),
            held: r(include_str!("sql/held.sql")),
            lock: r(include_str!("sql/lock.sql")),
            lowest: r(include_str!("sql/lowest.sql")),
            starts: r(include_str!("sql/starts.sql")),
            ensure: r(include_str!("sql/ensure.sql")),
            set_version: r(include_str!("sql/set_version.sql")),
            release: r(include_str!("sql/release.sql")),
            audit: r(include_str!("sql/audit.sql")),
        }
    }

    /// The consumer's aggregates (those holding events first).
    pub async fn list(&self, filter: &Filter) -> Result<Vec<AggregateVersion>, Error> {
        let rows = sqlx::query(&self.list)
            .bind(&self.consumer)
            .bind(filter.aggregate_type.as_deref())
            .bind(filter.aggregate_id.as_deref())
            .bind(filter.held_only)
            .bind(filter.limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(AggregateVersion {
                    aggregate_type: row.try_get("aggregate_type")?,
                    aggregate_id: row.try_get("aggregate_id")?,
                    version: row.try_get("version")?,
                    first_version: row.try_get("first_version")?,
                    seeded: row.try_get("seeded")?,
                    held: row.try_get("held")?,
                    oldest_held_seconds: row.try_get("oldest_held_seconds")?,
                    reason: row.try_get("reason")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Error::from)
    }

    /// The consumer's held events (the oldest first).
    pub async fn held(&self, filter: &Filter) -> Result<Vec<HeldEvent>, Error> {
        let rows = sqlx::query(&self.held)
            .bind(&self.consumer)
            .bind(filter.aggregate_type.as_deref())
            .bind(filter.aggregate_id.as_deref())
            .bind(filter.limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(HeldEvent {
                    id: row.try_get("id")?,
                    message_id: row.try_get("message_id")?,
                    event_id: row.try_get("event_id")?,
                    event_type: row.try_get("event_type")?,
                    aggregate_type: row.try_get("aggregate_type")?,
                    aggregate_id: row.try_get("aggregate_id")?,
                    version: row.try_get("version")?,
                    destination: row.try_get("destination")?,
                    held_seconds: row.try_get("held_seconds")?,
                    next_attempt_at: row.try_get("next_attempt_at")?,
                    attempts: row.try_get("attempts")?,
                    tries: row.try_get("tries")?,
                    last_error: row.try_get("last_error")?,
                    reason: row.try_get("reason")?,
                    dead: row.try_get("dead")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Error::from)
    }

    /// Sets where aggregates start: one aggregate (`filter.aggregate_type` and
    /// `aggregate_id`) at a version, or every aggregate of `filter` that holds events and
    /// has applied none at its lowest held version. Never moves an aggregate back (versions
    /// applied stay applied). With `dry_run`, returns the changes without making them;
    /// otherwise makes them and records them in the audit table (action `consumer_seed`).
    pub async fn seed(
        &self,
        filter: &Filter,
        seed: &Seed,
        dry_run: bool,
        actor: &str,
        reason: &str,
    ) -> Result<Vec<Change>, Error> {
        let targets: Vec<(String, String, Option<i64>)> = match seed {
            Seed::Version(version) => {
                let (Some(kind), Some(id)) = (&filter.aggregate_type, &filter.aggregate_id) else {
                    return Err(Error::Refused(
                        "seeding a version needs --aggregate-type and --aggregate-id (or seed \
                         --from-held, which starts each held aggregate at its lowest version)"
                            .into(),
                    ));
                };
                vec![(kind.clone(), id.clone(), Some(*version))]
            }
            Seed::LowestHeld => {
                let rows = sqlx::query(&self.starts)
                    .bind(&self.consumer)
                    .bind(filter.aggregate_type.as_deref())
                    .bind(filter.limit)
                    .bind(filter.aggregate_id.as_deref())
                    .fetch_all(&self.pool)
                    .await?;
                rows.iter()
                    // Where each starts is read again under its lock (below).
                    .map(|row| {
                        Ok((
                            row.try_get("aggregate_type")?,
                            row.try_get("aggregate_id")?,
                            None,
                        ))
                    })
                    .collect::<Result<_, sqlx::Error>>()?
            }
        };
        let from_held = matches!(seed, Seed::LowestHeld);
        self.change(
            targets,
            dry_run,
            "consumer_seed",
            actor,
            reason,
            |current, to| match current {
                // Started meanwhile: nothing to seed.
                Some(_) if from_held => Ok(false),
                Some(done) if done >= to => Err(format!(
                    "its versions up to {done} are done already: a seed never moves an \
                     aggregate back"
                )),
                _ => Ok(true),
            },
        )
        .await
    }

    /// Skips a gap of one aggregate that will never fill: versions up to `to` (default: the
    /// one before its lowest held event) are declared done, so its held events apply from
    /// there. Audited (action `consumer_skip`, with the versions skipped); with `dry_run`,
    /// only returns the change.
    pub async fn skip(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        to: Option<i64>,
        dry_run: bool,
        actor: &str,
        reason: &str,
    ) -> Result<Change, Error> {
        let targets = vec![(aggregate_type.to_owned(), aggregate_id.to_owned(), to)];
        let mut changes = self
            .change(
                targets,
                dry_run,
                "consumer_skip",
                actor,
                reason,
                |current, to| match current {
                    Some(done) if done >= to => Err(format!(
                        "its versions up to {done} are done already: nothing to skip up to {to}"
                    )),
                    _ => Ok(true),
                },
            )
            .await?;
        Ok(changes.remove(0))
    }

    /// Sets each target's version under its state row's lock, in one transaction, then
    /// audits. A target without a version (`None`) takes the one before its lowest held
    /// event, read under the lock. `allowed` says whether a target changes (`Ok(false)`:
    /// left as it is) or refuses the whole change.
    async fn change(
        &self,
        targets: Vec<(String, String, Option<i64>)>,
        dry_run: bool,
        action: &str,
        actor: &str,
        reason: &str,
        allowed: impl Fn(Option<i64>, i64) -> Result<bool, String>,
    ) -> Result<Vec<Change>, Error> {
        let mut tx = self.pool.begin().await?;
        let mut changes = Vec::new();
        for (kind, id, to) in targets {
            sqlx::query(&self.ensure)
                .bind(&self.consumer)
                .bind(&kind)
                .bind(&id)
                .execute(&mut *tx)
                .await?;
            let row = sqlx::query(&self.lock)
                .bind(&self.consumer)
                .bind(&kind)
                .bind(&id)
                .fetch_optional(&mut *tx)
                .await?;
            let current: Option<i64> = row
                .as_ref()
                .map(|r| r.try_get("version"))
                .transpose()?
                .flatten();
            let lowest: Option<i64> = sqlx::query_scalar(&self.lowest)
                .bind(&self.consumer)
                .bind(&kind)
                .bind(&id)
                .fetch_one(&mut *tx)
                .await?;
            if to.is_none() && lowest == Some(i64::MIN) {
                return Err(Error::Refused(format!(
                    "{kind} {id:?}: its lowest held version is {}: no version before it to \
                     start from",
                    i64::MIN
                )));
            }
            let Some(to) = to.or(lowest.map(|v| v - 1)) else {
                if current.is_some() {
                    // Started meanwhile, nothing held any more (a seed from what is held).
                    continue;
                }
                return Err(Error::Refused(format!(
                    "{kind} {id:?}: nothing held to start from; name the version (--to / --version)"
                )));
            };
            if to >= i64::MAX - 1 {
                return Err(Error::Refused(format!(
                    "{kind} {id:?}: version {to} leaves no version after it"
                )));
            }
            let change = allowed(current, to)
                .map_err(|why| Error::Refused(format!("{kind} {id:?}: {why}")))?;
            if !change {
                continue;
            }
            if !dry_run {
                sqlx::query(&self.set_version)
                    .bind(&self.consumer)
                    .bind(&kind)
                    .bind(&id)
                    .bind(to)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(&self.release)
                    .bind(&self.consumer)
                    .bind(&kind)
                    .bind(&id)
                    .execute(&mut *tx)
                    .await?;
            }
            changes.push(Change {
                aggregate_type: kind,
                aggregate_id: id,
                from: current,
                to,
            });
        }
        if dry_run || changes.is_empty() {
            tx.rollback().await?;
            return Ok(changes);
        }
        let details = serde_json::json!({
            "consumer": self.consumer,
            "count": changes.len(),
            "aggregates": changes,
        });
        sqlx::query(&self.audit)
            .bind(actor)
            .bind(action)
            .bind(reason)
            .bind(sqlx::types::Json(details))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(changes)
    }
}
