//! The scenario's counts, from the database once the relay has stopped, and checked for
//! agreement between them.

use std::{
    fmt,
    time::{Duration, Instant},
};

use crate::shop::{Storage, CONSUMERS};

/// Distinct (consumer, event) applications so far.
pub(crate) async fn applied_pairs(storage: &Storage) -> Result<i64, sqlx::Error> {
    storage.count(&storage.statements().applied_pairs).await
}

/// Waits until no event is pending, that is until the relay has marked published every event
/// it delivered, for at most `timeout`; returns whether that happened.
pub(crate) async fn all_marked(storage: &Storage, timeout: Duration) -> Result<bool, sqlx::Error> {
    let deadline = Instant::now() + timeout;
    loop {
        if storage.count(&storage.statements().pending).await? == 0 {
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
    /// What the consumers saw, when they are the scenario's own webhook endpoint.
    pub deliveries: Option<Deliveries>,
}

/// What the consumers behind the webhook endpoint saw.
#[derive(Debug, Clone, Default)]
pub struct Deliveries {
    /// HTTP deliveries received.
    pub deliveries: u64,
    /// Acknowledgements lost on purpose.
    pub dropped_acks: u64,
    /// Deliveries the inbox recognised and skipped (per consumer).
    pub duplicates: u64,
    /// Median commit-to-consumer lag of first deliveries.
    pub lag_p50: Duration,
    /// Largest commit-to-consumer lag of a first delivery.
    pub lag_max: Duration,
}

impl Summary {
    pub(crate) async fn collect(
        storage: &Storage,
        total: i64,
        crashed: bool,
        elapsed: Duration,
        deliveries: Option<Deliveries>,
    ) -> Result<Self, sqlx::Error> {
        let sql = storage.statements();
        let events = storage.count(&sql.events).await?;
        let consumers = CONSUMERS.len() as i64;
        Ok(Self {
            orders: storage.count(&sql.orders).await?,
            events,
            published: storage.count(&sql.published).await?,
            // An event is lost when a consumer never applied it.
            lost: total.max(events) * consumers - applied_pairs(storage).await?,
            applied_twice: storage.count(&sql.applied_twice).await?,
            reserved: storage.count(&sql.reserved).await?,
            ordered: storage.count(&sql.ordered).await?,
            notifications: storage.count(&sql.notifications).await?,
            crashed,
            elapsed,
            deliveries,
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
        if let Some(d) = &self.deliveries {
            writeln!(f, "  deliveries to consumers        {:>7}", d.deliveries)?;
            writeln!(
                f,
                "  acknowledgements lost on purpose {:>5}",
                d.dropped_acks
            )?;
            writeln!(
                f,
                "  duplicates discarded by inbox  {:>7}  (per consumer: redeliveries after lost \
                 acks and the crash)",
                d.duplicates
            )?;
        }
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
        if let Some(d) = &self.deliveries {
            writeln!(
                f,
                "  lag, commit to consumer        p50 {:.0} ms, max {:.0} ms",
                d.lag_p50.as_secs_f64() * 1e3,
                d.lag_max.as_secs_f64() * 1e3
            )?;
        }
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
            events: 300,
            published: 300,
            lost: 0,
            applied_twice: 0,
            reserved: 600,
            ordered: 600,
            notifications: 300,
            crashed: true,
            elapsed: Duration::from_secs(5),
            deliveries: Some(Deliveries {
                deliveries: 328,
                dropped_acks: 21,
                duplicates: 55,
                lag_p50: Duration::from_millis(2136),
                lag_max: Duration::from_millis(2787),
            }),
        }
    }

    #[test]
    fn a_summary_whose_figures_agree_says_ok() {
        let summary = agreeing();
        assert!(summary.guarantees_hold());
        let text = summary.to_string();
        assert!(text.ends_with("  0 lost, 0 applied twice: OK\n"), "{text}");
        assert!(
            text.contains("  duplicates discarded by inbox       55  (per consumer"),
            "{text}"
        );
        assert!(
            text.contains("  relay crashes injected               1\n"),
            "{text}"
        );
    }

    #[test]
    fn a_summary_without_webhook_deliveries_leaves_their_lines_out() {
        let summary = Summary {
            deliveries: None,
            ..agreeing()
        };
        let text = summary.to_string();
        assert!(!text.contains("deliveries to consumers"), "{text}");
        assert!(!text.contains("lag, commit"), "{text}");
        assert!(text.ends_with(": OK\n"), "{text}");
    }

    #[test]
    fn a_summary_with_fewer_events_published_than_written_does_not_say_ok() {
        let summary = Summary {
            published: 296,
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
            events: 299,
            published: 299,
            ..agreeing()
        };
        assert!(!summary.guarantees_hold());
        assert!(summary
            .to_string()
            .contains("events written 299 for 300 orders"));
    }

    #[test]
    fn a_summary_with_an_order_applied_twice_says_broken() {
        let summary = Summary {
            applied_twice: 1,
            ..agreeing()
        };
        assert!(!summary.guarantees_hold());
        assert!(summary.to_string().ends_with("1 applied twice: BROKEN\n"));
    }
}
