//! Every metric the relay exports, in one place. Labels are low-cardinality: `destination` is
//! capped at [`MAX_DESTINATION_LABELS`] distinct values (the rest count as `other`).
//!
//! | metric | type | meaning |
//! | --- | --- | --- |
//! | `outbox_oldest_pending_age_seconds` | gauge | how long the oldest unpublished event has waited since it was written, by the database clock (G7) |
//! | `outbox_pending_events` | gauge | events waiting to be published |
//! | `outbox_dead_events` | gauge | dead-lettered events |
//! | `outbox_published_total{destination}` | counter | events acknowledged by the broker |
//! | `outbox_failed_total{destination,class}` | counter | failed attempts, `transient`/`permanent` |
//! | `outbox_dead_lettered_total{destination}` | counter | events this relay dead-lettered |
//! | `outbox_delivery_latency_seconds` | histogram | from `occurred_at` to the broker's ack |
//! | `outbox_batch_size` | histogram | rows per claimed batch |
//! | `outbox_partitions_owned` | gauge | partitions this relay holds |
//! | `outbox_fenced_out_total` | counter | outcomes not written because the lease was lost |
//! | `outbox_trace_spans_dropped_total` | counter | publish spans dropped because the trace export queue was full |
//! | `outbox_trace_spans_unexported_total` | counter | publish spans in batches the OTLP collector did not take |
//! | `outbox_database_errors_total` | counter | failed relay statements (retried) |
//! | `outbox_purged_total` | counter | published rows deleted by the relay's purge |
//! | `outbox_ready` | gauge | 1 when `/readyz` answers 200, else 0 (read at each scrape) |
//! | `outbox_unready{reason}` | gauge | 1 for the reason `/readyz` fails (`database`, `loop`, `claim`, `stalled`), else 0 |
//! | `outbox_inflight_bytes` | gauge | bytes of claimed events held in memory (`max_inflight_bytes`) |
//! | `outbox_cdc_streaming` | gauge | 1 while this relay streams the slot (CDC), else 0 |
//! | `outbox_cdc_slot_lag_bytes` | gauge | WAL written since the slot's confirmed position |
//! | `outbox_cdc_slot_retained_wal_bytes` | gauge | WAL the slot keeps on disk |
//! | `outbox_cdc_slot_lag_seconds` | gauge | age of the oldest commit streamed and not confirmed, by the database clock |
//! | `outbox_cdc_retained_wal_alarm` | gauge | 1 when retained WAL passed 80% of `cdc.max_retained_wal_bytes` |
//! | `outbox_cdc_spilled_total` | counter | streamed events handed to the table path (failed, or behind a held aggregate) |

use std::{
    collections::HashSet,
    sync::{
        atomic::{AtomicI64, AtomicU64},
        Mutex,
    },
};

use prometheus_client::{
    encoding::{text::encode, EncodeLabelSet},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// Distinct destination label values kept before further ones are reported as `other`.
pub const MAX_DESTINATION_LABELS: usize = 200;

/// Characters of a writer's text kept in a label value; longer values end in `…`.
pub const MAX_LABEL_CHARS: usize = 120;

/// `text`, written by any writer, as a label value the text exposition can carry: shortened to
/// [`MAX_LABEL_CHARS`] characters, with `\`, `"` and line feeds escaped as the exposition format
/// requires (the Prometheus client writes label values as given), so that no destination can
/// close its label, forge another (`inj",relay_id="x`) or break the exposition for every scrape.
pub fn label_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_LABEL_CHARS) + 8);
    for (i, c) in text.chars().enumerate() {
        if i == MAX_LABEL_CHARS {
            out.push('…');
            break;
        }
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// `destination` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DestinationLabel {
    /// Topic, subject or routing key (capped cardinality).
    pub destination: String,
}

/// `destination` and failure `class` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// Topic, subject or routing key (capped cardinality).
    pub destination: String,
    /// `transient` or `permanent`.
    pub class: String,
}

/// Every `reason` of `outbox_unready` (why `/readyz` fails; see [`crate::http`]).
pub const UNREADY_REASONS: [&str; 6] = ["database", "broker", "loop", "claim", "stalled", "lease"];

/// `reason` label of `outbox_unready`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// One of [`UNREADY_REASONS`].
    pub reason: String,
}

/// The relay's metrics.
pub struct Metrics {
    registry: Registry,
    /// Age of the oldest pending event, seconds.
    pub oldest_pending_age: Gauge<f64, AtomicU64>,
    /// Pending events.
    pub pending: Gauge<i64, AtomicI64>,
    /// Dead events.
    pub dead: Gauge<i64, AtomicI64>,
    /// Published events by destination.
    pub published: Family<DestinationLabel, Counter>,
    /// Failed attempts by destination and class.
    pub failed: Family<FailureLabels, Counter>,
    /// Dead-lettered events by destination.
    pub dead_lettered: Family<DestinationLabel, Counter>,
    /// Fan-out copies the broker refused for good after their event was delivered, by the
    /// copy's destination.
    pub fanout_copies_dropped: Family<DestinationLabel, Counter>,
    /// Publish spans dropped because the OpenTelemetry export queue was full.
    pub trace_spans_dropped: Counter,
    /// Publish spans in batches the OpenTelemetry collector did not take.
    pub trace_spans_unexported: Counter,
    /// Commit-to-ack latency.
    pub latency: Histogram,
    /// Claimed batch sizes.
    pub batch_size: Histogram,
    /// Partitions owned.
    pub partitions_owned: Gauge<i64, AtomicI64>,
    /// Outcomes dropped because the lease was lost.
    pub fenced_out: Counter,
    /// Failed relay statements.
    pub database_errors: Counter,
    /// Rows deleted by the relay's purge.
    pub purged: Counter,
    /// Whether this relay streams the slot.
    pub cdc_streaming: Gauge<i64, AtomicI64>,
    /// WAL since the slot's confirmed position, bytes.
    pub cdc_slot_lag_bytes: Gauge<i64, AtomicI64>,
    /// WAL retained by the slot, bytes.
    pub cdc_retained_wal_bytes: Gauge<i64, AtomicI64>,
    /// Age of the oldest streamed, unconfirmed commit, seconds.
    pub cdc_slot_lag_seconds: Gauge<f64, AtomicU64>,
    /// Retained WAL over 80% of the configured maximum.
    pub cdc_retained_wal_alarm: Gauge<i64, AtomicI64>,
    /// Streamed events handed to the table path.
    pub cdc_spilled: Counter,
    /// 1 when ready, else 0.
    pub ready: Gauge<i64, AtomicI64>,
    /// 1 for the reason the relay is not ready.
    pub unready: Family<ReasonLabel, Gauge<i64, AtomicI64>>,
    /// Bytes of claimed events in memory.
    pub inflight_bytes: Gauge<i64, AtomicI64>,
    seen_destinations: Mutex<HashSet<String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric in a fresh registry.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let oldest_pending_age = Gauge::<f64, AtomicU64>::default();
        let pending = Gauge::default();
        let dead = Gauge::default();
        let published = Family::default();
        let failed = Family::default();
        let dead_lettered = Family::default();
        let fanout_copies_dropped = Family::default();
        let trace_spans_dropped = Counter::default();
        let trace_spans_unexported = Counter::default();
        let latency = Histogram::new([
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            60.0, 300.0,
        ]);
        let batch_size =
            Histogram::new([1.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0]);
        let partitions_owned = Gauge::default();
        let fenced_out = Counter::default();
        let database_errors = Counter::default();
        let purged = Counter::default();
        let cdc_streaming = Gauge::default();
        let cdc_slot_lag_bytes = Gauge::default();
        let cdc_retained_wal_bytes = Gauge::default();
        let cdc_slot_lag_seconds = Gauge::<f64, AtomicU64>::default();
        let cdc_retained_wal_alarm = Gauge::default();
        let cdc_spilled = Counter::default();
        let ready = Gauge::default();
        let unready = Family::<ReasonLabel, Gauge<i64, AtomicI64>>::default();
        for reason in UNREADY_REASONS {
            let _ = unready.get_or_create(&ReasonLabel {
                reason: reason.into(),
            });
        }
        let inflight_bytes = Gauge::default();
        let r = &mut registry;
        r.register(
            "outbox_ready",
            "1 when /readyz answers 200, else 0",
            ready.clone(),
        );
        r.register(
            "outbox_unready",
            "1 for the reason /readyz fails, else 0",
            unready.clone(),
        );
        r.register(
            "outbox_inflight_bytes",
            "Bytes of claimed events held in memory",
            inflight_bytes.clone(),
        );
        r.register(
            "outbox_cdc_streaming",
            "1 while this relay streams the replication slot",
            cdc_streaming.clone(),
        );
        r.register(
            "outbox_cdc_slot_lag_bytes",
            "WAL written since the slot's confirmed position",
            cdc_slot_lag_bytes.clone(),
        );
        r.register(
            "outbox_cdc_slot_retained_wal_bytes",
            "WAL the replication slot keeps on disk",
            cdc_retained_wal_bytes.clone(),
        );
        r.register(
            "outbox_cdc_slot_lag_seconds",
            "Age of the oldest commit streamed and not yet confirmed",
            cdc_slot_lag_seconds.clone(),
        );
        r.register(
            "outbox_cdc_retained_wal_alarm",
            "1 when the slot retains more than 80% of cdc.max_retained_wal_bytes",
            cdc_retained_wal_alarm.clone(),
        );
        r.register(
            "outbox_cdc_spilled",
            "Streamed events handed to the table path",
            cdc_spilled.clone(),
        );
        r.register(
            "outbox_oldest_pending_age_seconds",
            "Age of the oldest unpublished event",
            oldest_pending_age.clone(),
        );
        r.register(
            "outbox_pending_events",
            "Events waiting to be published",
            pending.clone(),
        );
        r.register("outbox_dead_events", "Dead-lettered events", dead.clone());
        r.register(
            "outbox_published",
            "Events acknowledged by the broker",
            published.clone(),
        );
        r.register("outbox_failed", "Failed publish attempts", failed.clone());
        r.register(
            "outbox_dead_lettered",
            "Events dead-lettered by this relay",
            dead_lettered.clone(),
        );
        r.register(
            "outbox_fanout_copies_dropped",
            "Fan-out copies refused for good by the broker after their event was delivered",
            fanout_copies_dropped.clone(),
        );
        r.register(
            "outbox_trace_spans_dropped",
            "Publish spans dropped because the OpenTelemetry export queue was full",
            trace_spans_dropped.clone(),
        );
        r.register(
            "outbox_trace_spans_unexported",
            "Publish spans in batches the OpenTelemetry collector did not take",
            trace_spans_unexported.clone(),
        );
        r.register(
            "outbox_delivery_latency_seconds",
            "Time from occurred_at to the broker's acknowledgement",
            latency.clone(),
        );
        r.register(
            "outbox_batch_size",
            "Rows per claimed batch",
            batch_size.clone(),
        );
        r.register(
            "outbox_partitions_owned",
            "Partitions leased by this relay",
            partitions_owned.clone(),
        );
        r.register(
            "outbox_fenced_out",
            "Outcomes not written because the partition lease was lost",
            fenced_out.clone(),
        );
        r.register(
            "outbox_database_errors",
            "Relay statements that failed and were retried",
            database_errors.clone(),
        );
        r.register(
            "outbox_purged",
            "Published rows deleted by the relay's purge",
            purged.clone(),
        );
        Self {
            registry,
            oldest_pending_age,
            pending,
            dead,
            published,
            failed,
            dead_lettered,
            fanout_copies_dropped,
            trace_spans_dropped,
            trace_spans_unexported,
            latency,
            batch_size,
            partitions_owned,
            fenced_out,
            database_errors,
            purged,
            cdc_streaming,
            cdc_slot_lag_bytes,
            cdc_retained_wal_bytes,
            cdc_slot_lag_seconds,
            cdc_retained_wal_alarm,
            cdc_spilled,
            ready,
            unready,
            inflight_bytes,
            seen_destinations: Mutex::new(HashSet::new()),
        }
    }

    /// Sets `outbox_ready` and `outbox_unready` from a readiness check: `None` when ready,
    /// else the reason it failed.
    pub fn set_readiness(&self, not_ready: Option<&str>) {
        self.ready.set(i64::from(not_ready.is_none()));
        for reason in UNREADY_REASONS {
            let on = not_ready == Some(reason);
            self.unready
                .get_or_create(&ReasonLabel {
                    reason: reason.into(),
                })
                .set(i64::from(on));
        }
    }

    /// The label value for `destination`: escaped for the text exposition and shortened
    /// ([`label_value`]), capping cardinality at [`MAX_DESTINATION_LABELS`] distinct values
    /// (further ones are `other`).
    pub fn destination_label(&self, destination: &str) -> String {
        let label = label_value(destination);
        let mut seen = self.seen_destinations.lock().expect("not poisoned");
        if seen.contains(&label) {
            return label;
        }
        if seen.len() < MAX_DESTINATION_LABELS {
            seen.insert(label.clone());
            return label;
        }
        "other".to_owned()
    }

    /// The sum of every sample of `series` (e.g. `outbox_published_total` over destinations).
    pub fn sum(&self, series: &str) -> f64 {
        self.encode()
            .lines()
            .filter(|l| {
                l.strip_prefix(series)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .fold(0.0, |total, v| total + v)
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_the_documented_names() {
        let m = Metrics::new();
        m.published
            .get_or_create(&DestinationLabel {
                destination: "a.b".into(),
            })
            .inc();
        let text = m.encode();
        for name in [
            "outbox_oldest_pending_age_seconds",
            "outbox_pending_events",
            "outbox_dead_events",
            "outbox_published_total{destination=\"a.b\"} 1",
            "outbox_delivery_latency_seconds_bucket",
            "outbox_partitions_owned",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }

    #[test]
    fn caps_destination_cardinality() {
        let m = Metrics::new();
        for i in 0..MAX_DESTINATION_LABELS {
            assert_eq!(m.destination_label(&format!("d{i}")), format!("d{i}"));
        }
        assert_eq!(m.destination_label("one-too-many"), "other");
        assert_eq!(m.destination_label("d0"), "d0");
    }

    /// Parses every sample line of an exposition the way a scraper does: name, then a label
    /// set of `name="value"` pairs with `\\`, `\"` and `\n` escapes, then the value.
    fn parse_labels(line: &str) -> Vec<(String, String)> {
        let open = line.find('{').expect("a label set");
        let mut rest = line[open + 1..].chars().peekable();
        let mut labels = Vec::new();
        loop {
            let name: String = rest.by_ref().take_while(|c| *c != '=').collect();
            assert_eq!(rest.next(), Some('"'), "a quoted value in {line}");
            let mut value = String::new();
            loop {
                match rest.next().expect("a closed value") {
                    '\\' => match rest.next().expect("an escape") {
                        'n' => value.push('\n'),
                        c @ ('\\' | '"') => value.push(c),
                        c => panic!("invalid escape \\{c} in {line}"),
                    },
                    '"' => break,
                    '\n' => panic!("a raw line feed in {line}"),
                    c => value.push(c),
                }
            }
            labels.push((name, value));
            match rest.next() {
                Some(',') => continue,
                Some('}') => return labels,
                other => panic!("{other:?} after a label value in {line}"),
            }
        }
    }

    #[test]
    fn a_destination_cannot_forge_a_label_or_break_the_exposition() {
        let m = Metrics::new();
        let hostile = [
            "inj\",relay_id=\"forged",
            "\"",
            "back\\slash",
            "line\nfeed outbox_ready 0",
            "end\\",
        ];
        for destination in hostile {
            m.published
                .get_or_create(&DestinationLabel {
                    destination: m.destination_label(destination),
                })
                .inc();
        }
        let text = m.encode();
        let mut read = Vec::new();
        for line in text
            .lines()
            .filter(|l| l.starts_with("outbox_published_total{"))
        {
            let labels = parse_labels(line);
            assert_eq!(labels.len(), 1, "one label only in {line}");
            assert_eq!(labels[0].0, "destination");
            read.push(labels[0].1.clone());
        }
        read.sort();
        let mut expected: Vec<String> = hostile.iter().map(|d| d.to_string()).collect();
        expected.sort();
        assert_eq!(
            read, expected,
            "each destination reads back whole from\n{text}"
        );
        assert!(!text.lines().any(|l| l.starts_with("feed")), "{text}");
    }

    #[test]
    fn a_huge_destination_is_shortened_in_its_label() {
        let m = Metrics::new();
        let label = m.destination_label(&"x".repeat(50_000_000));
        assert_eq!(label.chars().count(), MAX_LABEL_CHARS + 1);
        assert!(label.ends_with('…'));
    }
}
