//! One saga step inside the caller's transaction: load and lock the instance, react, save,
//! enqueue what the step emits, record the step. Shared by the event handler and the timeout
//! scheduler, so both run exactly the same machinery.

use std::sync::Arc;

use outbox::{postgres::PgOutbox, Event, Outbox, Tables};
use sqlx::{types::Json, PgConnection, Row};
use uuid::Uuid;

use super::definition::{Change, Saga, Start, Step, Trigger};
use crate::HandlerError;

/// How a step ended, as stored in `saga_steps.outcome`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The event created the instance.
    Started,
    /// The instance moved to another state (or re-entered its own).
    Transitioned,
    /// The deadline passed and the instance moved on.
    TimedOut,
    /// The state stayed; the step may have changed the data or emitted events.
    Stayed,
    /// The saga ignored the event ([`Step::ignore`](super::Step::ignore)): state and data
    /// unchanged.
    Ignored,
    /// The saga did not expect the timeout in this state: nothing changed, deadline cleared.
    /// (An unexpected *event* is rolled back and retried instead, so it is never recorded.)
    Unexpected,
    /// The event carries no correlation id.
    Uncorrelated,
}

impl Outcome {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Started => "started",
            Outcome::Transitioned => "transitioned",
            Outcome::TimedOut => "timed_out",
            Outcome::Stayed => "stayed",
            Outcome::Ignored => "ignored",
            Outcome::Unexpected => "unexpected",
            Outcome::Uncorrelated => "uncorrelated",
        }
    }
}

/// An instance as loaded, locked, for one step.
pub(crate) struct Loaded<S: Saga> {
    pub(crate) state: S::State,
    pub(crate) data: S::Data,
    /// `None` for an instance this step creates.
    pub(crate) version: Option<i64>,
}

pub(crate) struct Runtime<S: Saga> {
    pub(crate) saga: Arc<S>,
    outbox: PgOutbox,
    lock: String,
    lock_due: String,
    insert: String,
    update: String,
    record: String,
    pub(crate) due: String,
    pub(crate) defer: String,
}

impl<S: Saga> Runtime<S> {
    pub(crate) fn new(saga: Arc<S>, tables: &Tables) -> Self {
        let select = "SELECT state, data, version FROM {schema}.sagas \
                      WHERE saga_type = $1 AND correlation_id = $2";
        Self {
            saga,
            outbox: PgOutbox::new(tables.clone()),
            lock: tables.render(&format!("{select} FOR UPDATE")),
            lock_due: tables.render(&format!(
                "{select} AND deadline <= now() AND NOT finished FOR UPDATE SKIP LOCKED"
            )),
            insert: tables.render(
                "INSERT INTO {schema}.sagas \
                     (saga_type, correlation_id, state, data, deadline, finished) \
                 VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5), $6) \
                 ON CONFLICT (saga_type, correlation_id) DO NOTHING",
            ),
            update: tables.render(
                "UPDATE {schema}.sagas SET state = $3, data = $4, version = version + 1, \
                     deadline = CASE WHEN $7 THEN now() + make_interval(secs => $5) \
                                     ELSE deadline END, \
                     finished = $6, updated_at = now() \
                 WHERE saga_type = $1 AND correlation_id = $2 AND version = $8",
            ),
            record: tables.render(
                "INSERT INTO {schema}.saga_steps (saga_type, correlation_id, event_id, trigger, \
                     from_state, to_state, outcome, emitted, detail) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            ),
            due: tables.render(
                "SELECT correlation_id FROM {schema}.sagas \
                 WHERE saga_type = $1 AND deadline <= now() AND NOT finished \
                 ORDER BY deadline LIMIT $2",
            ),
            defer: tables.render(include_str!("sql/defer_timeout.sql")),
        }
    }

    /// Loads and locks the instance (waiting for a concurrent step to finish).
    pub(crate) async fn load(
        &self,
        conn: &mut PgConnection,
        correlation_id: &str,
    ) -> Result<Option<Loaded<S>>, HandlerError> {
        self.fetch(&self.lock, conn, correlation_id).await
    }

    /// Loads and locks the instance only if its deadline has passed and no one else holds it.
    pub(crate) async fn load_due(
        &self,
        conn: &mut PgConnection,
        correlation_id: &str,
    ) -> Result<Option<Loaded<S>>, HandlerError> {
        self.fetch(&self.lock_due, conn, correlation_id).await
    }

    async fn fetch(
        &self,
        sql: &str,
        conn: &mut PgConnection,
        correlation_id: &str,
    ) -> Result<Option<Loaded<S>>, HandlerError> {
        let row = sqlx::query(sql)
            .bind(self.saga.name())
            .bind(correlation_id)
            .fetch_optional(&mut *conn)
            .await?;
        row.map(|row| self.decode(correlation_id, &row)).transpose()
    }

    fn decode(
        &self,
        correlation_id: &str,
        row: &sqlx::postgres::PgRow,
    ) -> Result<Loaded<S>, HandlerError> {
        let state: String = row.try_get("state")?;
        let Json(data): Json<serde_json::Value> = row.try_get("data")?;
        let what = |e: serde_json::Error, part: &str| {
            HandlerError::new(format!(
                "saga {} {correlation_id:?}: stored {part} does not decode: {e}",
                self.saga.name()
            ))
        };
        Ok(Loaded {
            state: serde_json::from_value(serde_json::Value::String(state))
                .map_err(|e| what(e, "state"))?,
            data: serde_json::from_value(data).map_err(|e| what(e, "data"))?,
            version: Some(row.try_get("version")?),
        })
    }

    /// Runs [`Saga::react`] on a loaded instance and writes the result.
    pub(crate) async fn step(
        &self,
        conn: &mut PgConnection,
        correlation_id: &str,
        mut instance: Loaded<S>,
        trigger: &Trigger<'_>,
    ) -> Result<Outcome, HandlerError> {
        // What the data was before `react`: an ignored or unexpected step keeps it (a step
        // that was not meant to happen changes nothing but its record).
        let original = self.data_value(&instance.data)?;
        let step = self
            .saga
            .react(&instance.state, &mut instance.data, trigger)?;
        self.write(conn, correlation_id, instance, original, trigger, step)
            .await
    }

    /// Creates the instance `start` describes, for the event that starts it.
    pub(crate) async fn start(
        &self,
        conn: &mut PgConnection,
        correlation_id: &str,
        start: Start<S::State, S::Data>,
        trigger: &Trigger<'_>,
    ) -> Result<Outcome, HandlerError> {
        let instance = Loaded {
            state: start.state.clone(),
            data: start.data,
            version: None,
        };
        let step = Step {
            change: Change::To(start.state),
            emit: start.emit,
        };
        self.write(
            conn,
            correlation_id,
            instance,
            serde_json::Value::Null,
            trigger,
            step,
        )
        .await
    }

    fn data_value(&self, data: &S::Data) -> Result<serde_json::Value, HandlerError> {
        serde_json::to_value(data).map_err(|e| {
            HandlerError::new(format!(
                "saga {}: data does not serialise: {e}",
                self.saga.name()
            ))
        })
    }

    /// Writes a step's result: the instance (created when it has no version), what it emits,
    /// and its record. An unexpected event fails here, before anything is written.
    async fn write(
        &self,
        conn: &mut PgConnection,
        correlation_id: &str,
        instance: Loaded<S>,
        original: serde_json::Value,
        trigger: &Trigger<'_>,
        step: Step<S::State>,
    ) -> Result<Outcome, HandlerError> {
        let saga = &*self.saga;
        let from = state_name(&instance.state)?;
        let is_timeout = matches!(trigger, Trigger::Timeout);
        let (next, outcome, detail) = match step.change {
            Change::To(next) => {
                let outcome = match (instance.version, is_timeout) {
                    (None, _) => Outcome::Started,
                    (Some(_), true) => Outcome::TimedOut,
                    (Some(_), false) => Outcome::Transitioned,
                };
                (next, outcome, None)
            }
            Change::Stay => (instance.state.clone(), Outcome::Stayed, None),
            Change::Ignore(reason) => (instance.state.clone(), Outcome::Ignored, Some(reason)),
            Change::Unexpected(reason) if is_timeout => {
                (instance.state.clone(), Outcome::Unexpected, Some(reason))
            }
            Change::Unexpected(reason) => {
                tracing::warn!(saga = saga.name(), correlation_id, state = %from,
                    trigger = trigger.name(), %reason,
                    "saga event not expected in this state; rolled back and retried");
                return Err(HandlerError::new(format!(
                    "saga {} {correlation_id:?} in {from}: {} not expected: {reason}",
                    saga.name(),
                    trigger.name()
                )));
            }
        };
        let unchanged = matches!(outcome, Outcome::Ignored | Outcome::Unexpected);
        let to = state_name(&next)?;
        let finished = saga.is_final(&next);
        // A deadline starts when a state is entered; a timeout that leaves the state where it is
        // re-arms it (or clears it, when unexpected or ignored), so it never fires in a loop.
        let entered = !matches!(outcome, Outcome::Stayed) && !unchanged || is_timeout;
        let deadline = if finished || unchanged {
            None
        } else {
            saga.timeout(&next).map(|d| d.as_secs_f64())
        };
        let data = if unchanged {
            original
        } else {
            self.data_value(&instance.data)?
        };
        let written = match instance.version {
            None => {
                sqlx::query(&self.insert)
                    .bind(saga.name())
                    .bind(correlation_id)
                    .bind(&to)
                    .bind(Json(&data))
                    .bind(deadline)
                    .bind(finished)
                    .execute(&mut *conn)
                    .await?
            }
            Some(version) => {
                sqlx::query(&self.update)
                    .bind(saga.name())
                    .bind(correlation_id)
                    .bind(&to)
                    .bind(Json(&data))
                    .bind(deadline)
                    .bind(finished)
                    .bind(entered)
                    .bind(version)
                    .execute(&mut *conn)
                    .await?
            }
        };
        if written.rows_affected() != 1 {
            // Another step created or changed the instance first: roll back and retry.
            return Err(HandlerError::new(format!(
                "saga {} {correlation_id:?} changed concurrently; the step is retried",
                saga.name()
            )));
        }
        let emitted = self.emit(conn, correlation_id, trigger, step.emit).await?;
        self.record(
            conn,
            correlation_id,
            trigger,
            Some(from.as_str()).filter(|_| instance.version.is_some()),
            Some(to.as_str()),
            outcome,
            &emitted,
            detail.as_deref(),
        )
        .await?;
        if unchanged {
            tracing::warn!(saga = saga.name(), correlation_id, state = %from,
                trigger = trigger.name(), outcome = outcome.as_str(), reason = detail.as_deref(),
                "saga step changed nothing");
        }
        Ok(outcome)
    }

    async fn emit(
        &self,
        conn: &mut PgConnection,
        correlation_id: &str,
        trigger: &Trigger<'_>,
        events: Vec<Event>,
    ) -> Result<Vec<Uuid>, HandlerError> {
        let events: Vec<Event> = events
            .into_iter()
            .map(|mut event| {
                let mut add = |name: &str, value: &str| {
                    if !event.headers().contains_key(name) {
                        event = event.clone().header(name, value);
                    }
                };
                add("correlation-id", correlation_id);
                add("saga-type", self.saga.name());
                if let Some(cause) = trigger.event() {
                    add("causation-id", &cause.event_id.to_string());
                }
                event
            })
            .collect();
        Ok(self.outbox.enqueue_batch(conn, &events).await?)
    }

    /// Writes one row of the instance's history.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn record(
        &self,
        conn: &mut PgConnection,
        correlation_id: &str,
        trigger: &Trigger<'_>,
        from: Option<&str>,
        to: Option<&str>,
        outcome: Outcome,
        emitted: &[Uuid],
        detail: Option<&str>,
    ) -> Result<(), HandlerError> {
        sqlx::query(&self.record)
            .bind(self.saga.name())
            .bind(correlation_id)
            .bind(trigger.event().map(|e| e.event_id))
            .bind(trigger.name())
            .bind(from)
            .bind(to)
            .bind(outcome.as_str())
            .bind(emitted)
            .bind(detail)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

/// A state's stored name: its serde name, which must be a string (a unit enum variant).
fn state_name<T: serde::Serialize>(state: &T) -> Result<String, HandlerError> {
    match serde_json::to_value(state) {
        Ok(serde_json::Value::String(name)) if !name.is_empty() => Ok(name),
        Ok(other) => Err(HandlerError::new(format!(
            "a saga state must serialise to a non-empty string (a unit enum variant), got {other}"
        ))),
        Err(e) => Err(HandlerError::new(format!(
            "saga state does not serialise: {e}"
        ))),
    }
}
