//! Writing streamed events into the events table for the table path (zero-growth rows deleted
//! in their transaction, table-less events): fenced, in one transaction marked as the relay's
//! own (the stream passes over it).
//!
//! An event the table refuses for its data (a duplicate aggregate version among table-less
//! events, which nothing checks when they are written; a constraint or trigger of the user's)
//! would fail the same statement for ever and stall the stream. So when the database refuses
//! a write for its data (SQLSTATE classes 22, 23, 54), the rows are written one at a time, and
//! each one refused is written as an *unwritable* dead letter instead: under the key
//! `outbox.unwritable` / its event id, with its payload and its event id, and the reason and
//! what the event was in `last_error`. Nothing is lost, and everything else keeps flowing (G8).

use std::time::Duration;

use super::{
    context::{End, Streamed},
    messages::relay_write_prefix,
    source::Session,
};
use crate::complete::refused_for_its_data;

/// A streamed event to write into the table, with the relay state it gets there.
pub(super) struct SpillRow<'a> {
    pub(super) event: &'a Streamed,
    pub(super) status: &'static str,
    pub(super) attempts: i32,
    pub(super) permanent_failures: i32,
    pub(super) error: Option<String>,
    pub(super) backoff: Option<Duration>,
}

/// The aggregate type of the dead letters written for events the table refused.
pub(crate) const UNWRITABLE: &str = "outbox.unwritable";

impl Session {
    /// Writes streamed events into the table; returns their ids, in order (a refused event's
    /// is that of its unwritable dead letter).
    pub(super) async fn write_rows(&self, rows: &[SpillRow<'_>]) -> Result<Vec<i64>, End> {
        let refusal = match self.write_once(rows).await? {
            Ok(ids) => return Ok(ids),
            Err(refusal) => refusal,
        };
        if rows.len() > 1 {
            tracing::warn!(rows = rows.len(), error = %refusal,
                "the table refused a write of streamed events; writing them one at a time");
        }
        let mut ids = Vec::with_capacity(rows.len());
        for row in rows {
            let refusal = if rows.len() == 1 {
                refusal.clone()
            } else {
                match self.write_once(std::slice::from_ref(row)).await? {
                    Ok(written) => {
                        ids.extend(written);
                        continue;
                    }
                    Err(refusal) => refusal,
                }
            };
            ids.push(self.write_unwritable(row, &refusal).await?);
        }
        Ok(ids)
    }

    /// Writes `row` as a dead letter of its own key, with `refusal` and what it was.
    async fn write_unwritable(&self, row: &SpillRow<'_>, refusal: &str) -> Result<i64, End> {
        let original = &row.event.row;
        let reason = format!(
            "permanent: the events table refused this event ({refusal}); it was {:?} of \
             aggregate {:?}/{:?}, version {:?}, schema version {}{}",
            original.event_type,
            original.aggregate_type,
            original.aggregate_id,
            original.aggregate_version,
            original.schema_version,
            row.error
                .as_ref()
                .map(|e| format!("; it had failed with: {e}"))
                .unwrap_or_default(),
        );
        tracing::error!(event_id = %original.event_id, %reason, "unwritable event dead-lettered");
        self.ctx.completer.count_dead(UNWRITABLE);
        let mut event = row.event.clone();
        event.row.aggregate_type = UNWRITABLE.into();
        event.row.aggregate_id = original.event_id.to_string();
        event.row.aggregate_version = None;
        event.row.event_type = "Unwritable".into();
        event.row.schema_version = 1;
        event.row.destination = None;
        event.row.content_type = "application/octet-stream".into();
        event.row.headers = "{}".into();
        event.row.occurred_at = None;
        let substitute = SpillRow {
            event: &event,
            status: "dead",
            attempts: row.attempts,
            permanent_failures: row.permanent_failures.saturating_add(1),
            error: Some(reason),
            backoff: None,
        };
        match self.write_once(std::slice::from_ref(&substitute)).await? {
            Ok(ids) => Ok(ids[0]),
            Err(error) => Err(End::failed(
                "writing an unwritable event's dead letter",
                error,
            )),
        }
    }

    /// One write, retried while the leases last; `Err` inside when the database refuses it for
    /// its data (a retry cannot help), with the database's message.
    async fn write_once(&self, rows: &[SpillRow<'_>]) -> Result<Result<Vec<i64>, String>, End> {
        let (parts, epochs) = self.fence_arrays();
        let prefix = relay_write_prefix(&self.ctx.tables);
        let column = |f: &dyn Fn(&SpillRow<'_>) -> String| rows.iter().map(f).collect::<Vec<_>>();
        let attempt = || async {
            let mut tx = self.ctx.pool.begin().await?;
            let held: i64 = sqlx::query_scalar(&self.sql.fence_count)
                .bind(true)
                .bind(&parts)
                .bind(&epochs)
                .bind(&self.ctx.relay_id)
                .fetch_one(&mut *tx)
                .await?;
            if held != parts.len() as i64 {
                return Ok(None);
            }
            sqlx::query(&self.sql.relay_write)
                .bind(&prefix)
                .execute(&mut *tx)
                .await?;
            let ids: Vec<Option<i64>> = sqlx::query_scalar(&self.sql.spill)
                .bind(
                    rows.iter()
                        .map(|x| x.event.row.event_id)
                        .collect::<Vec<_>>(),
                )
                .bind(column(&|x| x.event.row.aggregate_type.clone()))
                .bind(column(&|x| x.event.row.aggregate_id.clone()))
                .bind(
                    rows.iter()
                        .map(|x| x.event.row.aggregate_version)
                        .collect::<Vec<_>>(),
                )
                .bind(column(&|x| x.event.row.event_type.clone()))
                .bind(
                    rows.iter()
                        .map(|x| x.event.row.schema_version)
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|x| x.event.row.destination.clone())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|x| x.event.row.payload.clone().unwrap_or_default())
                        .collect::<Vec<_>>(),
                )
                .bind(column(&|x| x.event.row.content_type.clone()))
                .bind(column(&|x| x.event.row.headers.clone()))
                .bind(
                    rows.iter()
                        .map(|x| x.event.row.occurred_at)
                        .collect::<Vec<_>>(),
                )
                .bind(column(&|x| x.status.to_owned()))
                .bind(rows.iter().map(|x| x.attempts).collect::<Vec<_>>())
                .bind(rows.iter().map(|x| x.error.clone()).collect::<Vec<_>>())
                .bind(
                    rows.iter()
                        .map(|x| x.backoff.map(|d| d.as_secs_f64()))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|x| x.permanent_failures)
                        .collect::<Vec<_>>(),
                )
                .fetch_all(&mut *tx)
                .await?;
            // No id: the insert was skipped for a conflict on another unique key than the
            // event id (a duplicate aggregate version): refused, like a constraint error.
            let Some(ids) = ids.into_iter().collect::<Option<Vec<i64>>>() else {
                return Ok(Some(Err(
                    "an event of the same aggregate already has this aggregate_version".into(),
                )));
            };
            tx.commit().await?;
            Ok(Some(Ok(ids)))
        };
        let written = self
            .retry_db(|| async {
                match attempt().await {
                    Err(error) if refused_for_its_data(&error) => Ok(Some(Err(error.to_string()))),
                    other => other,
                }
            })
            .await?;
        written.ok_or(End::LeaseLost)
    }
}
