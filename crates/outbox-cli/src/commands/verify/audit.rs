//! The audit itself, fed the broker's messages in the order the broker holds them and told,
//! for each, which outbox row it carries: pure, so unit tests drive it message by message.
//! Its memory grows with the number of aggregates, not of events: delivered rows are a bitmap
//! of row ids, aggregates are 64-bit hashes.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    hash::{DefaultHasher, Hash, Hasher},
};

use uuid::Uuid;

/// One message as the broker holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// The broker's unit of order: a Kafka partition; 0 for a NATS stream or a queue.
    pub lane: i32,
    /// Its `event-id` header, when it is a UUID.
    pub event_id: Option<Uuid>,
    /// Its `aggregate-type` and `aggregate-id` headers.
    pub aggregate: Option<(String, String)>,
    /// Its `aggregate-version` header.
    pub version: Option<i64>,
    /// A fan-out copy (`copy-of-schema-version`): the event again, in another version, for
    /// another destination; it does not stand for the event's own delivery.
    pub copy: bool,
}

/// The outbox row a message carries: its id (the order of its aggregate) and aggregate.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The row's id.
    pub id: i64,
    /// A hash of its aggregate type and id.
    pub aggregate: u64,
    /// Whether the row occurred in the audit's window (the broker is read from a little
    /// before it, for clocks that disagree).
    pub in_window: bool,
}

/// A hash of an aggregate key; two keys share one with a chance of about n²/2⁶⁵ (n keys),
/// which could only report an order violation that is not one, never hide one.
pub fn aggregate_hash(aggregate_type: &str, aggregate_id: &str) -> u64 {
    let mut h = DefaultHasher::new();
    (aggregate_type, aggregate_id).hash(&mut h);
    h.finish()
}

/// A set of row ids: one 64-bit word per 64 consecutive ids, so the ids of a drained outbox
/// (dense) cost about two bits each.
#[derive(Debug, Default)]
pub struct IdSet {
    words: BTreeMap<i64, u64>,
}

impl IdSet {
    /// Adds `id`; false when it was there already.
    pub fn insert(&mut self, id: i64) -> bool {
        let word = self.words.entry(id.div_euclid(64)).or_insert(0);
        let bit = 1u64 << id.rem_euclid(64);
        let new = *word & bit == 0;
        *word |= bit;
        new
    }

    /// Whether `id` is in the set.
    pub fn contains(&self, id: i64) -> bool {
        self.words
            .get(&id.div_euclid(64))
            .is_some_and(|w| w & (1u64 << id.rem_euclid(64)) != 0)
    }
}

/// The verdict.
#[derive(Debug, Default, serde::Serialize)]
pub struct Verdict {
    /// Outbox rows in the window.
    pub outbox_events: u64,
    /// Of those, published (marked in the table).
    pub published: u64,
    /// Of those, marked after the audit began reading the broker: not judged (their message
    /// may lie past the end the audit read to).
    pub published_during_audit: u64,
    /// Messages read from the broker.
    pub broker_messages: u64,
    /// Published rows (before the audit began) whose event the broker does not hold, in id
    /// order (the first ones; `missing_count` counts them all).
    pub missing: Vec<Uuid>,
    /// How many published rows the broker does not hold.
    pub missing_count: u64,
    /// Deliveries of an event beyond its first.
    pub duplicates: u64,
    /// Events that reached the broker after a later event of their aggregate (the first
    /// ones; `order_violation_count` counts them all).
    pub order_violations: Vec<Uuid>,
    /// How many order violations.
    pub order_violation_count: u64,
    /// Outbox messages with no row in the window: purged, outside the window, or written in
    /// CDC's zero-growth or table-less mode (no row to compare with).
    pub not_in_table: u64,
    /// Of those, messages that came back to a lower `aggregate-version` of their aggregate
    /// than one the broker holds before them: out of order, found without the table.
    pub version_regressions: u64,
    /// Of those, places where an aggregate's version skips numbers (7 then 9): lost events
    /// when the writers number versions without gaps.
    pub version_gaps: u64,
    /// Messages without an `event-id` UUID header: not the outbox's.
    pub not_an_outbox_message: u64,
    /// Fan-out copies read (judged apart: a copy does not stand for its event).
    pub fan_out_copies: u64,
    /// Messages whose row occurred outside the window (read because the broker is read from
    /// a little before it): not judged.
    pub outside_window: u64,
    /// Aggregates whose messages were found in more than one partition (Kafka): order is
    /// judged within each partition only.
    pub aggregates_in_several_partitions: u64,
}

/// How many ids a list of the verdict names (the counts count them all).
pub const LISTED: usize = 1000;

/// The audit's state while the broker is read.
#[derive(Debug, Default)]
pub struct Audit {
    verdict: Verdict,
    delivered: IdSet,
    /// Highest row id seen per (lane, aggregate).
    last_row: HashMap<(i32, u64), i64>,
    /// Event ids of messages not in the table, to count their duplicates.
    tableless: HashSet<Uuid>,
    /// Highest version seen per (lane, aggregate) among messages not in the table.
    last_version: HashMap<(i32, u64), i64>,
    /// The lane each aggregate was first seen in; `SPLIT` once seen in another.
    lane_of: HashMap<u64, i32>,
}

/// [`Audit::lane_of`]'s mark of an aggregate already counted in several lanes.
const SPLIT: i32 = i32::MIN;

impl Audit {
    /// Takes one message, in broker order, with the row it carries (`None`: no row in the
    /// window).
    pub fn message(&mut self, seen: &Seen, row: Option<&Row>) {
        let v = &mut self.verdict;
        v.broker_messages += 1;
        let Some(event_id) = seen.event_id else {
            v.not_an_outbox_message += 1;
            return;
        };
        if seen.copy {
            v.fan_out_copies += 1;
            return;
        }
        match row {
            Some(row) if !row.in_window => v.outside_window += 1,
            Some(row) => {
                let lane = self.lane_of.entry(row.aggregate).or_insert(seen.lane);
                if *lane != seen.lane && *lane != SPLIT {
                    *lane = SPLIT;
                    v.aggregates_in_several_partitions += 1;
                }
                if !self.delivered.insert(row.id) {
                    v.duplicates += 1;
                    return;
                }
                let last = self.last_row.entry((seen.lane, row.aggregate)).or_insert(0);
                if row.id < *last {
                    v.order_violation_count += 1;
                    if v.order_violations.len() < LISTED {
                        v.order_violations.push(event_id);
                    }
                }
                *last = (*last).max(row.id);
            }
            None => {
                v.not_in_table += 1;
                if !self.tableless.insert(event_id) {
                    v.duplicates += 1;
                    return;
                }
                let (Some((kind, id)), Some(version)) = (&seen.aggregate, seen.version) else {
                    return;
                };
                let key = (seen.lane, aggregate_hash(kind, id));
                match self.last_version.get(&key) {
                    Some(&last) if version < last => v.version_regressions += 1,
                    Some(&last) if version > last + 1 => v.version_gaps += 1,
                    _ => {}
                }
                let last = self.last_version.entry(key).or_insert(version);
                *last = (*last).max(version);
            }
        }
    }

    /// Takes one row of the window, in id order, after the broker was read: `published`
    /// before the audit began (judged), `published_later` after it (judged when its message
    /// was read, else not: it may lie past the end read).
    pub fn row(&mut self, id: i64, event_id: Uuid, published: bool, published_later: bool) {
        let v = &mut self.verdict;
        v.outbox_events += 1;
        if published_later && !self.delivered.contains(id) {
            v.published += 1;
            v.published_during_audit += 1;
        } else if published || published_later {
            v.published += 1;
            if !self.delivered.contains(id) {
                v.missing_count += 1;
                if v.missing.len() < LISTED {
                    v.missing.push(event_id);
                }
            }
        }
    }

    /// The verdict.
    pub fn finish(self) -> Verdict {
        self.verdict
    }
}

impl Verdict {
    /// Whether the broker holds every published event, in order (and, `strict`, once).
    pub fn clean(&self, strict: bool) -> bool {
        self.missing_count == 0
            && self.order_violation_count == 0
            && self.version_regressions == 0
            && (!strict || self.duplicates == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(lane: i32, n: u128, aggregate: &str, version: Option<i64>) -> Seen {
        Seen {
            lane,
            event_id: Some(Uuid::from_u128(n)),
            aggregate: Some(("order".into(), aggregate.into())),
            version,
            copy: false,
        }
    }

    fn row(id: i64, aggregate: &str) -> Row {
        Row {
            id,
            aggregate: aggregate_hash("order", aggregate),
            in_window: true,
        }
    }

    #[test]
    fn an_id_set_holds_sparse_and_negative_ids() {
        let mut set = IdSet::default();
        for id in [0, 63, 64, 1 << 40, -1] {
            assert!(set.insert(id), "{id}");
            assert!(!set.insert(id), "{id}");
            assert!(set.contains(id));
        }
        assert!(!set.contains(1) && !set.contains(65) && !set.contains(-2));
    }

    #[test]
    fn a_clean_stream_is_clean() {
        let mut audit = Audit::default();
        audit.message(&seen(0, 1, "a", None), Some(&row(1, "a")));
        audit.message(&seen(0, 2, "b", None), Some(&row(2, "b")));
        audit.message(&seen(0, 3, "a", None), Some(&row(3, "a")));
        for (id, n) in [(1, 1), (2, 2), (3, 3)] {
            audit.row(id, Uuid::from_u128(n), true, false);
        }
        let v = audit.finish();
        assert!(v.clean(true), "{v:?}");
        assert_eq!((v.outbox_events, v.published, v.broker_messages), (3, 3, 3));
    }

    #[test]
    fn finds_missing_duplicated_and_reordered_events() {
        let mut audit = Audit::default();
        audit.message(&seen(0, 3, "a", None), Some(&row(3, "a")));
        audit.message(&seen(0, 1, "a", None), Some(&row(1, "a")));
        audit.message(&seen(0, 3, "a", None), Some(&row(3, "a")));
        // Another aggregate's earlier event after a later one of "a" is not a violation.
        audit.message(&seen(0, 2, "b", None), Some(&row(2, "b")));
        for (id, n) in [(1, 1), (2, 2), (3, 3), (4, 4)] {
            audit.row(id, Uuid::from_u128(n), true, false);
        }
        let v = audit.finish();
        assert_eq!(v.order_violations, vec![Uuid::from_u128(1)]);
        assert_eq!(v.duplicates, 1);
        assert_eq!(v.missing, vec![Uuid::from_u128(4)]);
        assert!(!v.clean(false));
    }

    #[test]
    fn order_is_judged_per_kafka_partition_and_split_aggregates_are_counted() {
        let mut audit = Audit::default();
        audit.message(&seen(1, 2, "a", None), Some(&row(2, "a")));
        audit.message(&seen(0, 1, "a", None), Some(&row(1, "a")));
        audit.message(&seen(2, 3, "a", None), Some(&row(3, "a")));
        let v = audit.finish();
        assert_eq!(v.order_violation_count, 0);
        assert_eq!(v.aggregates_in_several_partitions, 1);
    }

    #[test]
    fn rows_published_during_the_audit_are_judged_only_when_their_message_was_read() {
        let mut audit = Audit::default();
        audit.message(&seen(0, 3, "a", None), Some(&row(3, "a")));
        audit.row(1, Uuid::from_u128(1), true, true);
        audit.row(2, Uuid::from_u128(2), false, false);
        audit.row(3, Uuid::from_u128(3), true, true);
        let v = audit.finish();
        assert_eq!(
            (v.published, v.published_during_audit, v.missing_count),
            (2, 1, 0)
        );
        assert!(v.clean(true));
    }

    #[test]
    fn a_fan_out_copy_does_not_stand_for_its_lost_event() {
        let mut audit = Audit::default();
        let mut copy = seen(0, 1, "a", None);
        copy.copy = true;
        audit.message(&copy, Some(&row(1, "a")));
        audit.row(1, Uuid::from_u128(1), true, false);
        let v = audit.finish();
        assert_eq!((v.fan_out_copies, v.duplicates), (1, 0));
        assert_eq!(v.missing, vec![Uuid::from_u128(1)]);
    }

    #[test]
    fn rows_outside_the_window_are_not_judged() {
        let mut audit = Audit::default();
        let mut early = row(1, "a");
        early.in_window = false;
        audit.message(&seen(0, 1, "a", None), Some(&early));
        audit.message(&seen(0, 1, "a", None), Some(&early));
        let v = audit.finish();
        assert_eq!((v.outside_window, v.duplicates, v.not_in_table), (2, 0, 0));
        assert!(v.clean(true));
    }

    #[test]
    fn messages_without_rows_are_checked_by_their_versions() {
        let mut audit = Audit::default();
        audit.message(&seen(0, 1, "a", Some(1)), None);
        audit.message(&seen(0, 2, "a", Some(2)), None);
        audit.message(&seen(0, 2, "a", Some(2)), None);
        audit.message(&seen(0, 4, "a", Some(4)), None);
        audit.message(&seen(0, 3, "a", Some(3)), None);
        audit.message(&seen(0, 9, "b", None), None);
        let v = audit.finish();
        assert_eq!(v.not_in_table, 6);
        assert_eq!(v.duplicates, 1);
        assert_eq!(v.version_gaps, 1, "2 then 4");
        assert_eq!(v.version_regressions, 1, "4 then 3");
        assert!(!v.clean(false));
    }

    #[test]
    fn foreign_messages_are_counted_apart() {
        let mut audit = Audit::default();
        audit.message(
            &Seen {
                lane: 0,
                event_id: None,
                aggregate: None,
                version: None,
                copy: false,
            },
            None,
        );
        let v = audit.finish();
        assert_eq!((v.not_an_outbox_message, v.broker_messages), (1, 1));
        assert!(v.clean(true));
    }
}
