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
//! An unwritable event never heads its aggregate's hold: it cannot be replayed as that
//! aggregate's event, and a hold on a row of another key is one no skip finds. The hold goes to
//! the aggregate's next event written with it, or is not written (the aggregate goes on; its
//! dead letter records what was lost to the table's refusal).

use super::{
    context::End,
    db::{SpillHold, SpillRow, Spilled},
    source::Session,
};

/// The aggregate type of the dead letters written for events the table refused.
pub(crate) const UNWRITABLE: &str = "outbox.unwritable";

impl Session {
    /// Writes streamed events into the table with `holds` in the same transaction; returns
    /// their ids, in order (a refused event's is that of its unwritable dead letter), each with
    /// whether it is new (false: the event was in the table before).
    pub(super) async fn write_rows(
        &self,
        rows: &[SpillRow<'_>],
        holds: &[SpillHold<'_>],
    ) -> Result<Vec<(i64, bool)>, End> {
        let refusal = match self.write_once(rows, holds).await? {
            Ok(ids) => return Ok(ids),
            Err(refusal) => refusal,
        };
        if rows.len() > 1 {
            tracing::warn!(rows = rows.len(), error = %refusal,
                "the table refused a write of streamed events; writing them one at a time");
        }
        let mut ids = Vec::with_capacity(rows.len());
        let mut refused = Vec::with_capacity(rows.len());
        for row in rows {
            let refusal = if rows.len() == 1 {
                refusal.clone()
            } else {
                match self.write_once(std::slice::from_ref(row), &[]).await? {
                    Ok(written) => {
                        ids.extend(written);
                        refused.push(false);
                        continue;
                    }
                    Err(refusal) => refusal,
                }
            };
            ids.push(self.write_unwritable(row, &refusal).await?);
            refused.push(true);
        }
        // Rows written one at a time: their holds after them (a rare path).
        let (db, relay_id, fences) = (&self.ctx.db, &self.ctx.relay_id, &self.fences);
        let (written, fresh): (Vec<i64>, Vec<bool>) = ids.iter().copied().unzip();
        for h in holds {
            // The aggregate's first event at or after the head that the table took.
            let Some(head) = (h.head..rows.len()).find(|&i| {
                !refused[i]
                    && (i == h.head
                        || (rows[i].row.aggregate_type == h.key.0
                            && rows[i].row.aggregate_id == h.key.1))
            }) else {
                continue;
            };
            // Moved past an unwritable head: a park was that event's, and does not pass on
            // to an event that has not failed (due at once instead).
            let h = &if head == h.head {
                *h
            } else {
                SpillHold {
                    head,
                    wait_seconds: Some(h.wait_seconds.unwrap_or(0.0)),
                    ..*h
                }
            };
            let Some(id) = h.head_id(&written, &fresh) else {
                continue;
            };
            let held = self
                .retry_db(|| {
                    db.hold(
                        relay_id,
                        fences,
                        h.key,
                        id,
                        h.wait_seconds,
                        h.since,
                        h.replace,
                    )
                })
                .await?;
            if !held {
                return Err(End::LeaseLost);
            }
        }
        Ok(ids)
    }

    /// Writes `row` as a dead letter of its own key, with `refusal` and what it was.
    async fn write_unwritable(
        &self,
        row: &SpillRow<'_>,
        refusal: &str,
    ) -> Result<(i64, bool), End> {
        let original = row.row;
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
        let mut event = row.row.clone();
        event.aggregate_type = UNWRITABLE.into();
        event.aggregate_id = original.event_id.to_string();
        event.aggregate_version = None;
        event.event_type = "Unwritable".into();
        event.schema_version = 1;
        event.destination = None;
        event.content_type = "application/octet-stream".into();
        event.headers = "{}".into();
        event.occurred_at = None;
        let substitute = SpillRow {
            row: &event,
            status: "dead",
            attempts: row.attempts,
            permanent_failures: row.permanent_failures.saturating_add(1),
            error: Some(reason),
            backoff: None,
        };
        match self
            .write_once(std::slice::from_ref(&substitute), &[])
            .await?
        {
            Ok(written) => Ok(written[0]),
            Err(error) => Err(End::failed(
                "writing an unwritable event's dead letter",
                error,
            )),
        }
    }

    /// One write, retried while the leases last; `Err` inside when the database refuses it for
    /// its data (a retry cannot help), with the database's message.
    async fn write_once(
        &self,
        rows: &[SpillRow<'_>],
        holds: &[SpillHold<'_>],
    ) -> Result<Result<Vec<(i64, bool)>, String>, End> {
        let (db, relay_id, fences) = (&self.ctx.db, &self.ctx.relay_id, &self.fences);
        match self
            .retry_db(|| db.spill(relay_id, fences, rows, holds))
            .await?
        {
            Spilled::LeaseLost => Err(End::LeaseLost),
            Spilled::Written { ids, fresh } => Ok(Ok(ids.into_iter().zip(fresh).collect())),
            Spilled::Refused(refusal) => Ok(Err(refusal)),
        }
    }
}
