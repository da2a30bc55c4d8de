//! The demo's summary, counted from the database and the consumers' counters once the relay
//! has stopped, and checked for agreement between its figures.

use std::{
    fmt,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use sqlx::SqlitePool;

use super::{receiver::Counters, shop};

/// Events applied by the inventory consumer so far.
pub async fn applied_events(pool: &SqlitePool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(DISTINCT event_id) FROM applied_log WHERE consumer = 'inventory'",
    )
    .fetch_one(pool)
    .await
}

/// Waits until no event is pending, that is until the relay has marked published every event
/// it delivered, for at most `timeout`; returns whether that happened.
pub async fn all_marked(pool: &SqlitePool, timeout: Duration) -> Result<bool, sqlx::Error> {
    let deadline = Instant::now() + timeout;
    loop {
        let pending: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE status = 'pending'")
                .fetch_one(pool)
                .await?;
        if pending == 0 {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What happened, from counting.
#[derive(Debug)]
pub struct Summary {
    orders: i64,
    events_written: i64,
    events_published: i64,
    deliveries: u64,
    dropped_acks: u64,
    duplicates_discarded: u64,
    lost: i64,
    applied_twice: i64,
    reserved: i64,
    ordered: i64,
    notifications: i64,
    lag_p50: Duration,
    lag_max: Duration,
    elapsed: Duration,
}

impl Summary {
    /// Counts everything.
    pub async fn collect(
        pool: &SqlitePool,
        counters: &Counters,
        total: i64,
        elapsed: Duration,
    ) -> Result<Self, sqlx::Error> {
        let one = |sql: &'static str| async move {
            sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await
        };
        let mut lags = counters.latencies.lock().expect("not poisoned").clone();
        lags.sort();
        let consumers = shop::CONSUMERS.len() as i64;
        // An event is lost when a consumer never applied it.
        let applied_pairs =
            one("SELECT count(*) FROM (SELECT DISTINCT consumer, event_id FROM applied_log)")
                .await?;
        let events_written = one("SELECT count(*) FROM outbox_events").await?;
        Ok(Self {
            orders: one("SELECT count(*) FROM orders").await?,
            events_written,
            events_published: one("SELECT count(*) FROM outbox_events WHERE status = 'published'")
                .await?,
            deliveries: counters.deliveries.load(Ordering::Relaxed),
            dropped_acks: counters.dropped_acks.load(Ordering::Relaxed),
            duplicates_discarded: counters.duplicates.load(Ordering::Relaxed),
            lost: (total.max(events_written)) * consumers - applied_pairs,
            applied_twice: one(
                "SELECT count(*) FROM (SELECT 1 FROM applied_log GROUP BY consumer, event_id \
                 HAVING count(*) > 1)",
            )
            .await?,
            reserved: one("SELECT sum(reserved) FROM stock").await?,
            ordered: one("SELECT coalesce(sum(qty), 0) FROM orders").await?,
            notifications: one("SELECT count(*) FROM notifications").await?,
            lag_p50: lags.get(lags.len() / 2).copied().unwrap_or_default(),
            lag_max: lags.last().copied().unwrap_or_default(),
            elapsed,
        })
    }

    /// No event lost, none applied twice, and every figure agrees with the others.
    pub fn guarantees_hold(&self) -> bool {
        self.lost == 0 && self.applied_twice == 0 && self.disagreements().is_empty()
    }

    /// The figures that disagree, each said in words; empty when one event was written per
    /// order and published, and each order reserved its stock and sent its notification once.
    fn disagreements(&self) -> Vec<String> {
        let mut found = Vec::new();
        if self.events_written != self.orders {
            found.push(format!(
                "events written {} for {} orders",
                self.events_written, self.orders
            ));
        }
        if self.events_published != self.events_written {
            found.push(format!(
                "events published {} of {} written",
                self.events_published, self.events_written
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
        writeln!(f)?;
        writeln!(f, "summary ({:.1}s)", self.elapsed.as_secs_f64())?;
        writeln!(f, "  orders created                 {:>7}", self.orders)?;
        writeln!(
            f,
            "  events written (same tx)       {:>7}",
            self.events_written
        )?;
        writeln!(
            f,
            "  events published               {:>7}",
            self.events_published
        )?;
        writeln!(f, "  deliveries to consumers        {:>7}", self.deliveries)?;
        writeln!(
            f,
            "  acknowledgements lost on purpose {:>5}",
            self.dropped_acks
        )?;
        writeln!(
            f,
            "  duplicates discarded by inbox  {:>7}  (per consumer: redeliveries after lost acks \
             and the crash)",
            self.duplicates_discarded
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
            "  lag, commit to consumer        p50 {:.0} ms, max {:.0} ms",
            self.lag_p50.as_secs_f64() * 1e3,
            self.lag_max.as_secs_f64() * 1e3
        )?;
        writeln!(
            f,
            "  {} lost, {} applied twice: {verdict}",
            self.lost, self.applied_twice
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agreeing() -> Summary {
        Summary {
            orders: 300,
            events_written: 300,
            events_published: 300,
            deliveries: 328,
            dropped_acks: 21,
            duplicates_discarded: 55,
            lost: 0,
            applied_twice: 0,
            reserved: 600,
            ordered: 600,
            notifications: 300,
            lag_p50: Duration::from_millis(2136),
            lag_max: Duration::from_millis(2787),
            elapsed: Duration::from_secs(5),
        }
    }

    #[test]
    fn a_summary_whose_figures_agree_says_ok() {
        let summary = agreeing();
        assert!(summary.guarantees_hold());
        assert!(summary
            .to_string()
            .ends_with("  0 lost, 0 applied twice: OK\n"));
    }

    #[test]
    fn a_summary_with_fewer_events_published_than_written_does_not_say_ok() {
        let summary = Summary {
            events_published: 296,
            ..agreeing()
        };
        assert!(!summary.guarantees_hold());
        let text = summary.to_string();
        assert!(!text.contains(": OK"), "{text}");
        assert!(
            text.contains("events published 296 of 300 written"),
            "the verdict names the figure that disagrees: {text}"
        );
    }

    #[test]
    fn a_summary_with_events_missing_for_orders_does_not_say_ok() {
        let summary = Summary {
            events_written: 299,
            events_published: 299,
            ..agreeing()
        };
        assert!(!summary.guarantees_hold());
        assert!(summary
            .to_string()
            .contains("events written 299 for 300 orders"));
    }
}
