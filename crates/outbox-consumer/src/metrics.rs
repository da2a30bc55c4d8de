//! What a consumer counts, on the relay's Prometheus conventions (`outbox_` prefix, counters
//! ending in `_total`, one label: the consumer's name). Every [`Processor`](crate::Processor)
//! counts into one [`ConsumerMetrics`]; share one between processors and register it in the
//! application's registry to export them.
//!
//! | metric | type | meaning |
//! | --- | --- | --- |
//! | `outbox_consumer_handled_total{consumer}` | counter | events applied (handler committed) |
//! | `outbox_consumer_duplicates_total{consumer}` | counter | deliveries the inbox had seen: skipped |
//! | `outbox_consumer_failures_total{consumer}` | counter | failed attempts of a message (handler error or panic) |
//! | `outbox_consumer_panics_total{consumer}` | counter | of those, handler or upcaster panics |
//! | `outbox_consumer_infrastructure_failures_total{consumer}` | counter | attempts that met a database outage (waited out, no attempt spent) |
//! | `outbox_consumer_out_of_order_total{consumer}` | counter | deliveries held by the version gate: an earlier version of the aggregate not applied yet |
//! | `outbox_consumer_holds_total{consumer}` | counter | events held in the consumer's database, for any reason (an earlier event of the aggregate, a first-seen aggregate settling, a failed attempt, a redelivery) |
//! | `outbox_consumer_dead_lettered_total{consumer}` | counter | messages sent to the consumer's dead letters |
//! | `outbox_consumer_copies_skipped_total{consumer}` | counter | fan-out copies skipped ([`Processor::skip_fan_out_copies`](crate::Processor::skip_fan_out_copies)) |
//! | `outbox_consumer_inbox_purged_total{consumer}` | counter | inbox rows deleted by the runner's retention |
//! | `outbox_consumer_handler_seconds{consumer}` | histogram | one attempt, inbox check to commit |
//! | `outbox_consumer_held{consumer}` | gauge | events held now (the sweeper reads it from the database every `sweep_interval`) |
//! | `outbox_consumer_held_waiting{consumer}` | gauge | of those, waiting for an earlier event of their aggregate (a gap) rather than for a retry |
//! | `outbox_consumer_held_dead{consumer}` | gauge | of those, given up (dead) and waiting for their dead letter to be stored: not 0 means the dead-letter destination is failing |
//! | `outbox_consumer_held_oldest_seconds{consumer}` | gauge | how long the oldest held event has been held, by the database's clock (0 when none) |
//! | `outbox_consumer_in_hand{consumer}` | gauge | messages in the runner's memory, running or queued behind their aggregate |

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::store::Gauges;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConsumerLabel {
    consumer: String,
}

type Counters = Family<ConsumerLabel, Counter>;
type Gauges64 = Family<ConsumerLabel, Gauge>;
type Seconds = Family<ConsumerLabel, Gauge<f64, AtomicU64>>;
type Latencies = Family<ConsumerLabel, Histogram, fn() -> Histogram>;

/// The consumer-side counters, per consumer name. Cheap to clone (clones share the values).
#[derive(Clone, Debug)]
pub struct ConsumerMetrics {
    handled: Counters,
    duplicates: Counters,
    failures: Counters,
    panics: Counters,
    infrastructure_failures: Counters,
    out_of_order: Counters,
    held_total: Counters,
    dead_lettered: Counters,
    copies_skipped: Counters,
    inbox_purged: Counters,
    handler_seconds: Latencies,
    held: Gauges64,
    held_waiting: Gauges64,
    held_dead: Gauges64,
    held_oldest_seconds: Seconds,
    in_hand: Gauges64,
}

impl Default for ConsumerMetrics {
    fn default() -> Self {
        Self {
            handled: Counters::default(),
            duplicates: Counters::default(),
            failures: Counters::default(),
            panics: Counters::default(),
            infrastructure_failures: Counters::default(),
            out_of_order: Counters::default(),
            held_total: Counters::default(),
            dead_lettered: Counters::default(),
            copies_skipped: Counters::default(),
            inbox_purged: Counters::default(),
            held: Gauges64::default(),
            held_waiting: Gauges64::default(),
            held_dead: Gauges64::default(),
            held_oldest_seconds: Seconds::default(),
            in_hand: Gauges64::default(),
            handler_seconds: Latencies::new_with_constructor(|| {
                Histogram::new([
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0,
                ])
            }),
        }
    }
}

/// One kind of count, for reading back ([`ConsumerMetrics::count`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Count {
    /// Events applied.
    Handled,
    /// Deliveries skipped as duplicates.
    Duplicates,
    /// Failed attempts of a message.
    Failures,
    /// Handler or upcaster panics.
    Panics,
    /// Attempts that met a database outage.
    InfrastructureFailures,
    /// Deliveries held by the version gate, waiting for an earlier version.
    OutOfOrder,
    /// Events held in the consumer's database, for any reason.
    Held,
    /// Inbox rows deleted by the runner's retention.
    InboxPurged,
    /// Messages dead-lettered.
    DeadLettered,
    /// Fan-out copies skipped.
    CopiesSkipped,
}

impl ConsumerMetrics {
    /// Fresh counters, all at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds every metric to `registry` (an application's, or the one it serves at `/metrics`).
    pub fn register(&self, registry: &mut Registry) {
        let r = registry;
        r.register(
            "outbox_consumer_handled",
            "Events applied: the handler's transaction committed",
            self.handled.clone(),
        );
        r.register(
            "outbox_consumer_duplicates",
            "Deliveries of events the inbox had already seen, skipped",
            self.duplicates.clone(),
        );
        r.register(
            "outbox_consumer_failures",
            "Failed attempts of a message (handler error or panic)",
            self.failures.clone(),
        );
        r.register(
            "outbox_consumer_panics",
            "Handler or upcaster panics, each counted as a failure of its message",
            self.panics.clone(),
        );
        r.register(
            "outbox_consumer_infrastructure_failures",
            "Attempts that met a database outage, retried without spending an attempt",
            self.infrastructure_failures.clone(),
        );
        r.register(
            "outbox_consumer_out_of_order",
            "Deliveries held by the version gate until an earlier version is applied",
            self.out_of_order.clone(),
        );
        r.register(
            "outbox_consumer_holds",
            "Events held in the consumer's database: an earlier event of the aggregate not \
             applied yet, a first-seen aggregate settling, a failed attempt, a redelivery",
            self.held_total.clone(),
        );
        r.register(
            "outbox_consumer_inbox_purged",
            "Inbox rows deleted by the runner's retention",
            self.inbox_purged.clone(),
        );
        r.register(
            "outbox_consumer_held",
            "Events held now, read from the database every sweep",
            self.held.clone(),
        );
        r.register(
            "outbox_consumer_held_waiting",
            "Held events waiting for an earlier event of their aggregate (a gap)",
            self.held_waiting.clone(),
        );
        r.register(
            "outbox_consumer_held_dead",
            "Held events given up, waiting for their dead letter to be stored",
            self.held_dead.clone(),
        );
        r.register(
            "outbox_consumer_held_oldest_seconds",
            "Age of the oldest held event, by the database's clock; 0 when none is held",
            self.held_oldest_seconds.clone(),
        );
        r.register(
            "outbox_consumer_in_hand",
            "Messages in the runner's memory, running or queued behind their aggregate",
            self.in_hand.clone(),
        );
        r.register(
            "outbox_consumer_dead_lettered",
            "Messages sent to the consumer's dead letters",
            self.dead_lettered.clone(),
        );
        r.register(
            "outbox_consumer_copies_skipped",
            "Fan-out copies skipped: the consumer applies the event from its own destination",
            self.copies_skipped.clone(),
        );
        r.register(
            "outbox_consumer_handler_seconds",
            "One attempt of a message, inbox check to commit",
            self.handler_seconds.clone(),
        );
    }

    /// The current value of one count for `consumer`.
    pub fn count(&self, consumer: &str, count: Count) -> u64 {
        self.family(count).get_or_create(&label(consumer)).get()
    }

    /// `consumer`'s counters, looked up once (a processor counts every message).
    pub(crate) fn of(&self, consumer: &str) -> Counts {
        let label = label(consumer);
        let counter = |count| self.family(count).get_or_create(&label).clone();
        Counts {
            handled: counter(Count::Handled),
            duplicates: counter(Count::Duplicates),
            failures: counter(Count::Failures),
            panics: counter(Count::Panics),
            infrastructure_failures: counter(Count::InfrastructureFailures),
            out_of_order: counter(Count::OutOfOrder),
            held_total: counter(Count::Held),
            dead_lettered: counter(Count::DeadLettered),
            copies_skipped: counter(Count::CopiesSkipped),
            inbox_purged: counter(Count::InboxPurged),
            handler_seconds: self.handler_seconds.get_or_create(&label).clone(),
            held: self.held.get_or_create(&label).clone(),
            held_waiting: self.held_waiting.get_or_create(&label).clone(),
            held_dead: self.held_dead.get_or_create(&label).clone(),
            held_oldest_seconds: self.held_oldest_seconds.get_or_create(&label).clone(),
            in_hand: self.in_hand.get_or_create(&label).clone(),
        }
    }

    fn family(&self, count: Count) -> &Counters {
        match count {
            Count::Handled => &self.handled,
            Count::Duplicates => &self.duplicates,
            Count::Failures => &self.failures,
            Count::Panics => &self.panics,
            Count::InfrastructureFailures => &self.infrastructure_failures,
            Count::OutOfOrder => &self.out_of_order,
            Count::Held => &self.held_total,
            Count::DeadLettered => &self.dead_lettered,
            Count::CopiesSkipped => &self.copies_skipped,
            Count::InboxPurged => &self.inbox_purged,
        }
    }

    /// `consumer`'s held gauges: (events held, of those waiting for an earlier event, age
    /// of the oldest in seconds).
    pub fn held(&self, consumer: &str) -> (i64, i64, f64) {
        let label = label(consumer);
        (
            self.held.get_or_create(&label).get(),
            self.held_waiting.get_or_create(&label).get(),
            self.held_oldest_seconds.get_or_create(&label).get(),
        )
    }

    /// `consumer`'s held events given up, their dead letter not stored yet.
    pub fn held_dead(&self, consumer: &str) -> i64 {
        self.held_dead.get_or_create(&label(consumer)).get()
    }

    /// Messages in `consumer`'s runner's memory now.
    pub fn in_hand(&self, consumer: &str) -> i64 {
        self.in_hand.get_or_create(&label(consumer)).get()
    }
}

/// One consumer's counters (clones of those in [`ConsumerMetrics`], sharing their values).
#[derive(Clone, Debug)]
pub(crate) struct Counts {
    handled: Counter,
    duplicates: Counter,
    failures: Counter,
    panics: Counter,
    infrastructure_failures: Counter,
    out_of_order: Counter,
    held_total: Counter,
    dead_lettered: Counter,
    copies_skipped: Counter,
    inbox_purged: Counter,
    handler_seconds: Histogram,
    held: Gauge,
    held_waiting: Gauge,
    held_dead: Gauge,
    held_oldest_seconds: Gauge<f64, AtomicU64>,
    in_hand: Gauge,
}

impl Counts {
    pub(crate) fn add(&self, count: Count) {
        let counter = match count {
            Count::Handled => &self.handled,
            Count::Duplicates => &self.duplicates,
            Count::Failures => &self.failures,
            Count::Panics => &self.panics,
            Count::InfrastructureFailures => &self.infrastructure_failures,
            Count::OutOfOrder => &self.out_of_order,
            Count::Held => &self.held_total,
            Count::DeadLettered => &self.dead_lettered,
            Count::CopiesSkipped => &self.copies_skipped,
            Count::InboxPurged => &self.inbox_purged,
        };
        counter.inc();
    }

    pub(crate) fn purged(&self, rows: u64) {
        self.inbox_purged.inc_by(rows);
    }

    pub(crate) fn set_held(&self, gauges: &Gauges) {
        self.held.set(gauges.held);
        self.held_waiting.set(gauges.waiting);
        self.held_dead.set(gauges.dead);
        self.held_oldest_seconds.set(gauges.oldest_seconds);
    }

    pub(crate) fn set_in_hand(&self, messages: usize) {
        self.in_hand
            .set(i64::try_from(messages).unwrap_or(i64::MAX));
    }

    pub(crate) fn observe_handler(&self, seconds: f64) {
        self.handler_seconds.observe(seconds);
    }
}

fn label(consumer: &str) -> ConsumerLabel {
    ConsumerLabel {
        consumer: consumer.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_consumer_and_exports_them() {
        let metrics = ConsumerMetrics::new();
        let billing = metrics.of("billing");
        billing.add(Count::Handled);
        billing.add(Count::Handled);
        metrics.of("shipping").add(Count::DeadLettered);
        assert_eq!(metrics.count("billing", Count::Handled), 2);
        assert_eq!(metrics.count("shipping", Count::Handled), 0);
        assert_eq!(metrics.count("shipping", Count::DeadLettered), 1);
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("outbox_consumer_handled_total{consumer=\"billing\"} 2"),
            "{text}"
        );
    }
}
