//! [`CdcDb`] on PostgreSQL: the statements of `sql/cdc.sql` on the relay's pool, and the
//! replication stream of `pgwire-replication`.

use futures::future::BoxFuture;
use outbox::{sql::named, Tables};
use pgwire_replication::{Lsn, ReplicationClient, ReplicationEvent};
use sqlx::{PgPool, Row};

use super::store::render_fenced;
use crate::{
    complete::refused_for_its_data,
    source::cdc::{
        relay_write_prefix, AggregateKey, CdcDb, HoldRow, ReplicationTarget, SlotState, SpillHold,
        SpillRow, Spilled, StreamError, StreamPosition, WalStream,
    },
    store::{ClaimedRow, Fence},
};

/// The CDC statements (named, rendered per outbox).
const SQL: &str = include_str!("sql/cdc.sql");

/// The CDC statements, rendered for one outbox.
struct Sql {
    fence_count: String,
    spill: String,
    hold: String,
    pending_of: String,
    catch_up: String,
    catch_up_max_id: String,
    catch_up_done: String,
    holds: String,
    unpark: String,
    slot: String,
    terminate: String,
    heartbeat: String,
    relay_write: String,
    invisible: String,
}

impl Sql {
    fn new(tables: &Tables) -> Self {
        let r = |name: &str| render_fenced(tables, named(SQL, name));
        Self {
            fence_count: r("fence_count"),
            spill: r("spill"),
            hold: r("hold"),
            pending_of: r("pending_of"),
            catch_up: r("catch_up"),
            catch_up_max_id: r("catch_up_max_id"),
            catch_up_done: r("catch_up_done"),
            holds: r("holds"),
            unpark: r("unpark"),
            slot: r("slot"),
            terminate: r("terminate"),
            heartbeat: r("heartbeat"),
            relay_write: r("relay_write"),
            invisible: r("invisible"),
        }
    }
}

/// The CDC source's PostgreSQL: the relay's pool, and where replication connections go.
pub struct PgCdc {
    pool: PgPool,
    tables: Tables,
    sql: Sql,
    target: ReplicationTarget,
    relay_write_prefix: String,
}

impl PgCdc {
    /// The CDC database of the outbox `tables` on `pool`, replicating from `target`.
    pub fn new(pool: PgPool, tables: &Tables, target: ReplicationTarget) -> Self {
        Self {
            pool,
            tables: tables.clone(),
            sql: Sql::new(tables),
            target,
            relay_write_prefix: relay_write_prefix(tables),
        }
    }

    async fn spill_once(
        &self,
        relay_id: &str,
        fences: &[Fence],
        rows: &[SpillRow<'_>],
        holds: &[SpillHold<'_>],
    ) -> Result<Spilled, sqlx::Error> {
        let (parts, epochs): (Vec<i32>, Vec<i64>) = fences.iter().copied().unzip();
        let text = |f: &dyn Fn(&SpillRow<'_>) -> String| rows.iter().map(f).collect::<Vec<_>>();
        let mut tx = self.pool.begin().await?;
        let held: i64 = sqlx::query_scalar(&self.sql.fence_count)
            .bind(true)
            .bind(&parts)
            .bind(&epochs)
            .bind(relay_id)
            .fetch_one(&mut *tx)
            .await?;
        if held != parts.len() as i64 {
            return Ok(Spilled::LeaseLost);
        }
        sqlx::query(&self.sql.relay_write)
            .bind(&self.relay_write_prefix)
            .execute(&mut *tx)
            .await?;
        let written: Vec<(Option<i64>, bool)> = sqlx::query_as(&self.sql.spill)
            .bind(rows.iter().map(|x| x.row.event_id).collect::<Vec<_>>())
            .bind(text(&|x| x.row.aggregate_type.clone()))
            .bind(text(&|x| x.row.aggregate_id.clone()))
            .bind(
                rows.iter()
                    .map(|x| x.row.aggregate_version)
                    .collect::<Vec<_>>(),
            )
            .bind(text(&|x| x.row.event_type.clone()))
            .bind(
                rows.iter()
                    .map(|x| x.row.schema_version)
                    .collect::<Vec<_>>(),
            )
            .bind(
                rows.iter()
                    .map(|x| x.row.destination.clone())
                    .collect::<Vec<_>>(),
            )
            .bind(
                rows.iter()
                    .map(|x| x.row.payload.as_deref().unwrap_or_default())
                    .collect::<Vec<_>>(),
            )
            .bind(text(&|x| x.row.content_type.clone()))
            .bind(text(&|x| x.row.headers.clone()))
            .bind(rows.iter().map(|x| x.row.occurred_at).collect::<Vec<_>>())
            .bind(text(&|x| x.status.to_owned()))
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
        // No id: the insert was skipped for a conflict on another unique key than the event
        // id (a duplicate aggregate version): refused, like a constraint error.
        let fresh: Vec<bool> = written.iter().map(|w| w.1).collect();
        let Some(ids) = written
            .into_iter()
            .map(|w| w.0)
            .collect::<Option<Vec<i64>>>()
        else {
            return Ok(Spilled::Refused(
                "an event of the same aggregate already has this aggregate_version".into(),
            ));
        };
        for hold in holds {
            let Some(head) = hold.head_id(&ids, &fresh) else {
                continue;
            };
            let held: bool = self
                .hold_query(
                    relay_id,
                    fences,
                    hold.key,
                    head,
                    hold.wait_seconds,
                    hold.since,
                )
                .bind(hold.replace)
                .fetch_one(&mut *tx)
                .await?;
            if !held {
                return Ok(Spilled::LeaseLost);
            }
        }
        tx.commit().await?;
        Ok(Spilled::Written { ids, fresh })
    }
}

impl PgCdc {
    /// The `hold` statement with every parameter bound but the last (`replace`).
    fn hold_query<'q>(
        &'q self,
        relay_id: &'q str,
        fences: &[Fence],
        key: AggregateKey<'q>,
        head_id: i64,
        wait_seconds: Option<f64>,
        since: StreamPosition,
    ) -> sqlx::query::QueryScalar<'q, sqlx::Postgres, bool, sqlx::postgres::PgArguments> {
        let (parts, epochs) = arrays(fences);
        sqlx::query_scalar(&self.sql.hold)
            .bind(key.0)
            .bind(parts)
            .bind(epochs)
            .bind(relay_id)
            .bind(key.1)
            .bind(head_id)
            .bind(wait_seconds)
            .bind(since.commit_lsn as i64)
            .bind(since.change_lsn as i64)
    }
}

fn arrays(fences: &[Fence]) -> (Vec<i32>, Vec<i64>) {
    fences.iter().copied().unzip()
}

fn payload_limit(max_payload: usize) -> i32 {
    i32::try_from(max_payload).unwrap_or(i32::MAX)
}

impl CdcDb for PgCdc {
    fn spill<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        rows: &'a [SpillRow<'a>],
        holds: &'a [SpillHold<'a>],
    ) -> BoxFuture<'a, Result<Spilled, sqlx::Error>> {
        Box::pin(async move {
            match self.spill_once(relay_id, fences, rows, holds).await {
                Err(error) if refused_for_its_data(&error) => {
                    Ok(Spilled::Refused(error.to_string()))
                }
                other => other,
            }
        })
    }

    fn hold<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        key: AggregateKey<'a>,
        head_id: i64,
        wait_seconds: Option<f64>,
        since: StreamPosition,
        replace: bool,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(async move {
            self.hold_query(relay_id, fences, key, head_id, wait_seconds, since)
                .bind(replace)
                .fetch_one(&self.pool)
                .await
        })
    }

    fn pending_of<'a>(
        &'a self,
        key: AggregateKey<'a>,
        limit: i64,
        max_payload: usize,
    ) -> BoxFuture<'a, Result<Vec<ClaimedRow>, sqlx::Error>> {
        Box::pin(async move {
            sqlx::query_as(&self.sql.pending_of)
                .bind(key.0)
                .bind(key.1)
                .bind(limit)
                .bind(payload_limit(max_payload))
                .fetch_all(&self.pool)
                .await
        })
    }

    fn catch_up<'a>(
        &'a self,
        max_id: i64,
        limit: i64,
        max_payload: usize,
    ) -> BoxFuture<'a, Result<Vec<ClaimedRow>, sqlx::Error>> {
        Box::pin(async move {
            sqlx::query_as(&self.sql.catch_up)
                .bind(max_id)
                .bind(limit)
                .bind(payload_limit(max_payload))
                .fetch_all(&self.pool)
                .await
        })
    }

    fn catch_up_max_id<'a>(
        &'a self,
        slot: &'a str,
    ) -> BoxFuture<'a, Result<Option<i64>, sqlx::Error>> {
        Box::pin(async move {
            let id: Option<Option<i64>> = sqlx::query_scalar(&self.sql.catch_up_max_id)
                .bind(slot)
                .fetch_optional(&self.pool)
                .await?;
            Ok(id.flatten())
        })
    }

    fn catch_up_done<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        slot: &'a str,
        max_id: i64,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        let (parts, epochs) = arrays(fences);
        Box::pin(async move {
            sqlx::query_scalar(&self.sql.catch_up_done)
                .bind(slot)
                .bind(parts)
                .bind(epochs)
                .bind(relay_id)
                .bind(max_id)
                .fetch_one(&self.pool)
                .await
        })
    }

    fn holds(&self) -> BoxFuture<'_, Result<Vec<HoldRow>, sqlx::Error>> {
        Box::pin(async move {
            let rows = sqlx::query(&self.sql.holds).fetch_all(&self.pool).await?;
            Ok(rows
                .iter()
                .map(|r| {
                    let commit: Option<i64> = r.get(3);
                    let change: Option<i64> = r.get(4);
                    HoldRow {
                        aggregate_type: r.get(0),
                        aggregate_id: r.get(1),
                        wait_seconds: r.get(2),
                        since: commit.zip(change).map(|(c, l)| StreamPosition {
                            commit_lsn: c as u64,
                            change_lsn: l as u64,
                        }),
                    }
                })
                .collect())
        })
    }

    fn unpark<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        key: AggregateKey<'a>,
    ) -> BoxFuture<'a, Result<(bool, bool), sqlx::Error>> {
        let (parts, epochs) = arrays(fences);
        Box::pin(async move {
            sqlx::query_as(&self.sql.unpark)
                .bind(key.0)
                .bind(parts)
                .bind(epochs)
                .bind(relay_id)
                .bind(key.1)
                .fetch_one(&self.pool)
                .await
        })
    }

    fn slot<'a>(&'a self, slot: &'a str) -> BoxFuture<'a, Result<Option<SlotState>, sqlx::Error>> {
        Box::pin(async move {
            let row = sqlx::query(&self.sql.slot)
                .bind(slot)
                .fetch_optional(&self.pool)
                .await?;
            Ok(row.map(|r| SlotState {
                lag_bytes: r.get("lag_bytes"),
                retained_bytes: r.get("retained_bytes"),
                elsewhere: r
                    .get::<Option<String>, _>("elsewhere")
                    .map(|other| (other, r.get("here"))),
                now: r.get("now"),
            }))
        })
    }

    fn recorded_slots(&self) -> BoxFuture<'_, Result<Vec<(String, String)>, sqlx::Error>> {
        Box::pin(async move {
            outbox::postgres::cdc::recorded(&self.pool, &self.tables)
                .await
                .map_err(|e| match e {
                    outbox::Error::Database(e) => e,
                    other => sqlx::Error::Protocol(other.to_string()),
                })
        })
    }

    fn terminate<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        slot: &'a str,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        let (parts, epochs) = arrays(fences);
        Box::pin(async move {
            sqlx::query_scalar(&self.sql.terminate)
                .bind(slot)
                .bind(parts)
                .bind(epochs)
                .bind(relay_id)
                .fetch_one(&self.pool)
                .await
        })
    }

    fn heartbeat<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            sqlx::query(&self.sql.heartbeat)
                .bind(prefix)
                .execute(&self.pool)
                .await
                .map(drop)
        })
    }

    fn invisible<'a>(&'a self, xids: &'a [i64]) -> BoxFuture<'a, Result<i64, sqlx::Error>> {
        Box::pin(async move {
            sqlx::query_scalar(&self.sql.invisible)
                .bind(xids)
                .fetch_one(&self.pool)
                .await
        })
    }

    fn replicate<'a>(
        &'a self,
        slot: &'a str,
        publication: &'a str,
        application: &'a str,
    ) -> BoxFuture<'a, Result<Box<dyn WalStream>, StreamError>> {
        Box::pin(async move {
            let config = self.target.config(slot, publication, application);
            let client = ReplicationClient::connect(config).await?;
            Ok(Box::new(PgStream(client)) as Box<dyn WalStream>)
        })
    }
}

/// A `pgwire-replication` client as a [`WalStream`].
struct PgStream(ReplicationClient);

impl WalStream for PgStream {
    fn recv(&mut self) -> BoxFuture<'_, Result<Option<ReplicationEvent>, StreamError>> {
        Box::pin(async move { self.0.recv().await.map_err(Into::into) })
    }

    fn update_applied_lsn(&self, lsn: Lsn) {
        self.0.update_applied_lsn(lsn);
    }

    fn reported_lsn(&self) -> Lsn {
        self.0.metrics().last_applied_lsn()
    }

    fn shutdown(mut self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let _ = self.0.shutdown().await;
        })
    }

    fn abort(mut self: Box<Self>) {
        self.0.abort();
    }
}
