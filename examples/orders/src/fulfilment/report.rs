//! What a run ended with, counted from the services' own tables.

use std::{fmt, time::Duration};

use outbox::Tables;
use sqlx::PgPool;

use super::ticket::{Mode, BACKORDER_SKU, DECLINED_CARD};

/// The counts of one run, and whether the guarantees held.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Orchestrated or choreographed.
    pub mode: Option<Mode>,
    /// Orders placed.
    pub orders: i64,
    /// Orders completed (charged, shipped, stock taken).
    pub completed: i64,
    /// Orders cancelled.
    pub cancelled: i64,
    /// Orders neither completed nor cancelled at the end (must be 0).
    pub stuck: i64,
    /// Cancelled after a declined payment, with the inventory released (the compensation).
    pub compensated: i64,
    /// Orders of the back-ordered item: the inventory never answers, the deadline cancels them.
    pub backorders: i64,
    /// Timeouts fired (saga deadlines, or the order service's sweeper). Every cancelled order
    /// is either compensated after a declined payment or cancelled by one timeout.
    pub timeouts: i64,
    /// Orders that should have completed but were cancelled by a timeout (crashes slowed them).
    pub normal_cancelled: i64,
    /// Stock still reserved for an order that is not completed (must be 0).
    pub left_reserved: i64,
    /// Completed orders missing their charge, shipment or reservation (must be 0).
    pub completed_incomplete: i64,
    /// Cancelled orders whose card was charged (must be 0).
    pub charged_but_cancelled: i64,
    /// Declined or back-ordered orders that completed anyway (must be 0).
    pub wrongly_completed: i64,
    /// (service, event) pairs applied more than once, saga steps included (must be 0).
    pub applied_twice: i64,
    /// Stock taken from the shelves that no completed order accounts for, in units (must be 0).
    pub stock_drift: i64,
    /// Saga instances not in a final state, or disagreeing with their order (must be 0).
    pub saga_mismatches: i64,
    /// Saga steps recorded as ignored, unexpected or uncorrelated (late replies; reported).
    pub unexpected_steps: i64,
    /// Relays killed abruptly.
    pub relay_kills: u32,
    /// Consumers killed abruptly (in-flight transactions lost, messages redelivered).
    pub consumer_kills: u32,
    /// Steps that failed after doing their writes, before commit (rolled back, retried).
    pub failed_steps: u64,
    /// Saga timeout steps that failed (put off by the scheduler, retried).
    pub timeout_step_failures: u64,
    /// Times the database was restarted.
    pub database_restarts: u32,
    /// Events the relay published.
    pub published: i64,
    /// Wall time.
    pub elapsed: Duration,
}

impl Report {
    /// Whether every guarantee held.
    pub fn guarantees_hold(&self) -> bool {
        self.stuck == 0
            && self.left_reserved == 0
            && self.completed_incomplete == 0
            && self.charged_but_cancelled == 0
            && self.wrongly_completed == 0
            && self.applied_twice == 0
            && self.stock_drift == 0
            && self.saga_mismatches == 0
            && self.completed + self.cancelled == self.orders
            && self.cancelled == self.compensated + self.timeouts
    }

    pub(crate) async fn collect(
        pool: &PgPool,
        tables: &Tables,
        mode: Mode,
        timeouts_fired: Option<i64>,
    ) -> Result<Self, sqlx::Error> {
        let count = |sql: &str| {
            let sql = tables.render(sql);
            async move {
                sqlx::query_scalar::<_, i64>(&sql)
                    .bind(DECLINED_CARD)
                    .bind(BACKORDER_SKU)
                    .fetch_one(pool)
                    .await
            }
        };
        // $1 = the declined card, $2 = the back-ordered item, in every query.
        const NORMAL: &str = "o.card <> $1 AND o.sku <> $2";
        let orchestrated = mode == Mode::Orchestrated;
        let timeouts = match timeouts_fired {
            Some(n) => n,
            None => {
                count(
                    "SELECT count(*) FROM {schema}.saga_steps \
                     WHERE outcome = 'timed_out' AND $1 <> $2",
                )
                .await?
            }
        };
        Ok(Self {
            mode: Some(mode),
            orders: count("SELECT count(*) FROM {schema}.orders WHERE $1 <> $2").await?,
            completed: count(
                "SELECT count(*) FROM {schema}.orders WHERE status = 'completed' AND $1 <> $2",
            )
            .await?,
            cancelled: count(
                "SELECT count(*) FROM {schema}.orders WHERE status = 'cancelled' AND $1 <> $2",
            )
            .await?,
            stuck: count(
                "SELECT count(*) FROM {schema}.orders \
                 WHERE status NOT IN ('completed', 'cancelled') AND $1 <> $2",
            )
            .await?,
            compensated: count(
                "SELECT count(*) FROM {schema}.orders o \
                 JOIN {schema}.payments p ON p.order_id = o.id AND p.status = 'declined' \
                 JOIN {schema}.reservations r ON r.order_id = o.id AND r.status = 'released' \
                 WHERE o.status = 'cancelled' AND o.card = $1 AND $2 <> ''",
            )
            .await?,
            backorders: count("SELECT count(*) FROM {schema}.orders WHERE sku = $2 AND $1 <> ''")
                .await?,
            timeouts,
            normal_cancelled: count(&format!(
                "SELECT count(*) FROM {{schema}}.orders o WHERE status = 'cancelled' AND {NORMAL}"
            ))
            .await?,
            left_reserved: count(
                "SELECT count(*) FROM {schema}.reservations r JOIN {schema}.orders o \
                 ON o.id = r.order_id WHERE r.status = 'reserved' \
                 AND o.status <> 'completed' AND $1 <> $2",
            )
            .await?,
            completed_incomplete: count(
                "SELECT count(*) FROM {schema}.orders o WHERE o.status = 'completed' AND NOT (
                     EXISTS (SELECT 1 FROM {schema}.payments p
                             WHERE p.order_id = o.id AND p.status = 'charged')
                     AND EXISTS (SELECT 1 FROM {schema}.shipments s WHERE s.order_id = o.id)
                     AND EXISTS (SELECT 1 FROM {schema}.reservations r
                                 WHERE r.order_id = o.id AND r.status = 'reserved'))
                 AND $1 <> $2",
            )
            .await?,
            charged_but_cancelled: count(
                "SELECT count(*) FROM {schema}.orders o JOIN {schema}.payments p \
                 ON p.order_id = o.id AND p.status = 'charged' \
                 WHERE o.status = 'cancelled' AND $1 <> $2",
            )
            .await?,
            wrongly_completed: count(
                "SELECT count(*) FROM {schema}.orders o \
                 WHERE o.status = 'completed' AND (o.card = $1 OR o.sku = $2)",
            )
            .await?,
            applied_twice: count(
                "SELECT (SELECT count(*) FROM (SELECT 1 FROM {schema}.applied_log \
                         GROUP BY consumer, event_id HAVING count(*) > 1) d) \
                      + (SELECT count(*) FROM (SELECT 1 FROM {schema}.saga_steps \
                         WHERE event_id IS NOT NULL GROUP BY event_id HAVING count(*) > 1) s) \
                 WHERE $1 <> $2",
            )
            .await?
            .max(0),
            stock_drift: count(
                "SELECT coalesce(sum(abs(taken - held)), 0)::bigint FROM (
                     SELECT s.sku, i.initial - s.available AS taken,
                            coalesce((SELECT sum(r.qty) FROM {schema}.reservations r
                                      WHERE r.sku = s.sku AND r.status = 'reserved'), 0) AS held
                     FROM {schema}.stock s JOIN {schema}.initial_stock i ON i.sku = s.sku) d
                 WHERE $1 <> $2",
            )
            .await?,
            saga_mismatches: if orchestrated {
                count(
                    "SELECT count(*) FROM {schema}.orders o LEFT JOIN {schema}.sagas s \
                     ON s.saga_type = 'order' AND s.correlation_id = o.id::text \
                     WHERE s.finished IS DISTINCT FROM true \
                        OR (s.state = 'Completed') <> (o.status = 'completed') \
                        OR (s.state = 'Cancelled') <> (o.status = 'cancelled') \
                        OR $1 = $2",
                )
                .await?
            } else {
                0
            },
            unexpected_steps: count(
                "SELECT count(*) FROM {schema}.saga_steps \
                 WHERE outcome IN ('ignored', 'unexpected', 'uncorrelated') AND $1 <> $2",
            )
            .await?,
            published: count(
                "SELECT count(*) FROM {schema}.{events} WHERE status = 'published' AND $1 <> $2",
            )
            .await?,
            ..Default::default()
        })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.mode {
            Some(Mode::Orchestrated) => "orchestrated saga",
            Some(Mode::Choreographed) => "choreography",
            None => "?",
        };
        writeln!(
            f,
            "order fulfilment ({mode}), {:.1}s:",
            self.elapsed.as_secs_f64()
        )?;
        writeln!(
            f,
            "  orders {}: completed {}, cancelled {} (payment declined and compensated {}, \
             back-ordered {}, slowed past the deadline {}), stuck {}",
            self.orders,
            self.completed,
            self.cancelled,
            self.compensated,
            self.backorders,
            self.normal_cancelled,
            self.stuck
        )?;
        writeln!(
            f,
            "  crashes injected: relay killed {}, consumers killed {}, steps failed before commit {}, \
             timeout steps failed {}, database restarted {}",
            self.relay_kills,
            self.consumer_kills,
            self.failed_steps,
            self.timeout_step_failures,
            self.database_restarts
        )?;
        writeln!(
            f,
            "  timeouts fired {}, events published {}, late saga replies recorded {}",
            self.timeouts, self.published, self.unexpected_steps
        )?;
        writeln!(
            f,
            "  checks: stock left reserved {}, applied twice {}, stock drift {}, completed but \
             incomplete {}, charged but cancelled {}, wrongly completed {}, saga/order mismatches {}",
            self.left_reserved,
            self.applied_twice,
            self.stock_drift,
            self.completed_incomplete,
            self.charged_but_cancelled,
            self.wrongly_completed,
            self.saga_mismatches
        )?;
        writeln!(
            f,
            "  guarantees: {}",
            if self.guarantees_hold() {
                "hold"
            } else {
                "VIOLATED"
            }
        )
    }
}
