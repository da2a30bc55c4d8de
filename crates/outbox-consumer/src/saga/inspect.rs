//! Reading saga instances and their history, and purging finished ones (PostgreSQL): the
//! queries behind `outbox sagas list | show` and `outbox purge`, next to the tables they read.
//! The SQL is in `sql/inspect.sql`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox::{sql::named, Tables};
use sqlx::{types::Json, FromRow, PgPool, Row};
use uuid::Uuid;

const SQL: &str = include_str!("sql/inspect.sql");

/// One saga instance.
#[derive(Clone, Debug, FromRow, serde::Serialize)]
#[non_exhaustive]
pub struct SagaInstance {
    /// Saga type.
    pub saga_type: String,
    /// Correlation id.
    pub correlation_id: String,
    /// Current state.
    pub state: String,
    /// Version (one per step taken).
    pub version: i64,
    /// Whether it reached a final state.
    pub finished: bool,
    /// When its timeout fires, if it waits for one.
    pub deadline: Option<DateTime<Utc>>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// Unexpected or orphaned events recorded for it.
    pub problems: i64,
}

/// One step recorded in an instance's history.
#[derive(Clone, Debug, FromRow, serde::Serialize)]
#[non_exhaustive]
pub struct SagaStep {
    /// When it was taken.
    pub at: DateTime<Utc>,
    /// `event` or `timeout`.
    pub trigger: String,
    /// The event that triggered it, if one did.
    pub event_id: Option<Uuid>,
    /// The state before.
    pub from_state: Option<String>,
    /// The state after.
    pub to_state: Option<String>,
    /// What happened (`moved`, `stayed`, `unexpected`, `orphan`, …).
    pub outcome: String,
    /// Events emitted into the outbox by the step.
    pub emitted: Vec<Uuid>,
    /// Why, for an unexpected or orphaned event.
    pub detail: Option<String>,
}

/// Instances per type and state.
#[derive(Clone, Debug, FromRow, serde::Serialize)]
#[non_exhaustive]
pub struct SagaCount {
    /// Saga type.
    pub saga_type: String,
    /// State.
    pub state: String,
    /// Instances in it.
    pub instances: i64,
    /// Of which past their deadline.
    pub overdue: i64,
}

/// Which instances [`list`] returns (all, the 50 most recently changed, by default).
#[derive(Clone, Debug)]
pub struct InstanceFilter {
    /// Only this saga type.
    pub saga_type: Option<String>,
    /// Only instances in this state.
    pub state: Option<String>,
    /// Only instances not finished.
    pub open: bool,
    /// Only instances whose deadline has passed.
    pub overdue: bool,
    /// Only instances with unexpected or orphaned events recorded.
    pub problems: bool,
    /// At most this many (1 to 10,000).
    pub limit: i64,
}

impl Default for InstanceFilter {
    fn default() -> Self {
        Self {
            saga_type: None,
            state: None,
            open: false,
            overdue: false,
            problems: false,
            limit: 50,
        }
    }
}

/// Instances matching `filter`, most recently changed first.
pub async fn list(
    pool: &PgPool,
    tables: &Tables,
    filter: &InstanceFilter,
) -> Result<Vec<SagaInstance>, sqlx::Error> {
    sqlx::query_as(&tables.render(named(SQL, "list")))
        .bind(&filter.saga_type)
        .bind(&filter.state)
        .bind(filter.open)
        .bind(filter.overdue)
        .bind(filter.problems)
        .bind(filter.limit.clamp(1, 10_000))
        .fetch_all(pool)
        .await
}

/// Instances per type and state (of one type, when given).
pub async fn counts(
    pool: &PgPool,
    tables: &Tables,
    saga_type: Option<&str>,
) -> Result<Vec<SagaCount>, sqlx::Error> {
    sqlx::query_as(&tables.render(named(SQL, "counts")))
        .bind(saga_type)
        .fetch_all(pool)
        .await
}

/// One instance and its data, if it exists.
pub async fn find(
    pool: &PgPool,
    tables: &Tables,
    saga_type: &str,
    correlation_id: &str,
) -> Result<Option<(SagaInstance, serde_json::Value)>, sqlx::Error> {
    let row = sqlx::query(&tables.render(named(SQL, "find")))
        .bind(saga_type)
        .bind(correlation_id)
        .fetch_optional(pool)
        .await?;
    row.map(|row| {
        let Json(data): Json<serde_json::Value> = row.try_get("data")?;
        Ok((SagaInstance::from_row(&row)?, data))
    })
    .transpose()
}

/// Every step recorded for a correlation id of a saga type, in order (also when no instance
/// exists: orphaned events are recorded all the same).
pub async fn steps(
    pool: &PgPool,
    tables: &Tables,
    saga_type: &str,
    correlation_id: &str,
) -> Result<Vec<SagaStep>, sqlx::Error> {
    sqlx::query_as(&tables.render(named(SQL, "steps")))
        .bind(saga_type)
        .bind(correlation_id)
        .fetch_all(pool)
        .await
}

/// Deletes finished instances not changed for `retention`, with their steps, and steps
/// recorded for no instance (orphaned, uncorrelated) older than it, `batch` at a time. Open
/// instances are never deleted. Returns (instances, steps) deleted.
pub async fn purge_finished(
    pool: &PgPool,
    tables: &Tables,
    retention: Duration,
    batch: i64,
) -> Result<(u64, u64), sqlx::Error> {
    let finished = tables.render(named(SQL, "purge_finished"));
    let strays = tables.render(named(SQL, "purge_strays"));
    let (secs, batch) = (retention.as_secs_f64(), batch.max(1));
    let (mut instances, mut steps) = (0u64, 0u64);
    loop {
        let (i, s): (i64, i64) = sqlx::query_as(&finished)
            .bind(secs)
            .bind(batch)
            .fetch_one(pool)
            .await?;
        instances += i as u64;
        steps += s as u64;
        if i < batch {
            break;
        }
    }
    loop {
        let n = sqlx::query(&strays)
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
