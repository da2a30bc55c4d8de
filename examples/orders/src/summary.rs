//! The scenario's counts, from the database once the relay has stopped, and checked for
//! agreement between them.

use std::{
    fmt,
    time::{Duration, Instant},
};

use outbox::Tables;
use sqlx::PgPool;

/// Distinct (consumer, event) applications so far.
pub(crate) async fn applied_pairs(pool: &PgPool, tables: &Tables) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(&tables.render(
        "SELECT count(*) FROM (SELECT DISTINCT consumer, event_id FROM {schema}.applied_log) a",
    ))
    .fetch_one(pool)
    .await
}

/// Waits until no event is pending, that is until the relay has marked published every event
/// it delivered, for at most `timeout`; returns whether that happened.
pub(crate) async fn all_marked(
    pool: &PgPool,
    tables: &Tables,
    timeout: Duration,
) -> Result<bool, sqlx::Error> {
    let sql = tables.render("SELECT count(*) FROM {schema}.{events} WHERE status = 'pending'");
    let deadline = Instant::now() + timeout;
    loop {
        let pending: i64 = sqlx::query_scalar(&sql).fetch_one(pool).await?;
        if pending == 0 {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What happened, counted.
#[derive(Debug)]
pub struct Summary {
    /// Orders placed.
    pub orders: i64,
    /// Events in the outbox.
    pub events: i64,
    /// Events marked published.
    pub published: i64,
    /// Orders one of the two consumers never applied.
    pub lost: i64,
    /// (consumer, event) pairs applied more than once.
    pub applied_twice: i64,
    /// Units reserved by the inventory consumer.
    pub reserved: i64,
    /// Units ordered.
    pub ordered: i64,
    /// Notifications sent.
    pub notifications: i64,
    /// Whether the relay was killed midway.
    pub crashed: bool,
    /// Wall time.
    pub elapsed: Duration,
}

impl Summary {
    pub(crate) async fn collect(
        pool: &PgPool,
        tables: &Tables,
        total: i64,
        crashed: bool,
        elapsed: Duration,
    ) -> Result<Self, sqlx::Error> {
        let one = |sql: &str| {
            let sql = tables.render(sql);
            async move { sqlx::query_scalar::<_, i64>(&sql).fetch_one(pool).await }
        };
        let events = one("SELECT count(*) FROM {schema}.{events}").await?;
        Ok(Self {
            orders: one("SELECT count(*) FROM {schema}.orders").await?,
            events,
            published: one("SELECT count(*) FROM {schema}.{events} WHERE status = 'published'")
                .await?,
            lost: total.max(events) * 2 - applied_pairs(pool, tables).await?,
            applied_twice: one("SELECT count(*) FROM (SELECT 1 FROM {schema}.applied_log \
                 GROUP BY consumer, event_id HAVING count(*) > 1) d")
            .await?,
            reserved: one("SELECT sum(reserved)::bigint FROM {schema}.stock").await?,
            ordered: one("SELECT coalesce(sum(qty), 0)::bigint FROM {schema}.orders").await?,
            notifications: one("SELECT count(*) FROM {schema}.notifications").await?,
            crashed,
            elapsed,
        })
    }

    /// Nothing lost, nothing applied twice, and every count agrees with the others.
    pub fn guarantees_hold(&self) -> bool {
        self.lost == 0 && self.applied_twice == 0 && self.disagreements().is_empty()
    }

    /// The counts that disagree, each said in words; empty when one event was written per
    /// order and published, and each order reserved its stock and sent its notification once.
    pub fn disagreements(&self) -> Vec<String> {
        let mut found = Vec::new();
        if self.events != self.orders {
            found.push(format!(
                "events written {} for {} orders",
                self.events, self.orders
            ));
        }
        if self.published != self.events {
            found.push(format!(
                "events published {} of {} written",
                self.published, self.events
            ));
        }
        if self.reserved != self.ordered {
            found.push(format!(
                "stock reserved {} for {} ordered",
                self.reserved, self.ordered
            ));
        }
        if self.notifications != self.orders {
            found.push(format!(
                "notifications sent {} for {} orders",
                self.notifications, self.orders
            ));
        }
        found
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let disagreements = self.disagreements();
        let verdict = if self.guarantees_hold() {
            "OK".to_owned()
        } else if disagreements.is_empty() {
            "BROKEN".to_owned()
        } else {
            format!("BROKEN ({})", disagreements.join("; "))
        };
        writeln!(f, "summary ({:.1}s)", self.elapsed.as_secs_f64())?;
        writeln!(f, "  orders created                 {:>7}", self.orders)?;
        writeln!(f, "  events written (same tx)       {:>7}", self.events)?;
        writeln!(f, "  events published               {:>7}", self.published)?;
        writeln!(
            f,
            "  relay crashes injected         {:>7}",
            u8::from(self.crashed)
        )?;
        writeln!(
            f,
            "  stock reserved                 {:>7}  (ordered {}: exactly once per order)",
            self.reserved, self.ordered
        )?;
        writeln!(
            f,
            "  notifications sent             {:>7}",
            self.notifications
        )?;
        writeln!(
            f,
            "  {} lost, {} applied twice: {verdict}",
            self.lost, self.applied_twice
        )
    }
}
