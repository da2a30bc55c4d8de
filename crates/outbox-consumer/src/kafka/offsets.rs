//! Which offsets a Kafka consumer may commit. Messages of one partition finish out of order
//! (each aggregate has a lane of its own), but a committed offset says "everything before it
//! is done": it may only move up to the oldest message still in hand. A revoked partition's
//! messages become stale (their assignment generation is over) and no longer count.

use std::collections::{BTreeSet, HashMap};

/// A topic and partition.
pub(crate) type Partition = (String, i32);

/// A received message's place: its partition, offset and the assignment it arrived under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub partition: Partition,
    pub offset: i64,
    generation: u64,
}

/// One assigned partition.
#[derive(Debug, Default)]
struct Owned {
    generation: u64,
    /// Offsets received and not finished.
    in_hand: BTreeSet<i64>,
    /// One past the highest offset received.
    next: Option<i64>,
    /// The last offset committed (or sent for commit).
    committed: Option<i64>,
}

impl Owned {
    /// Everything before this offset is done.
    fn done_up_to(&self) -> Option<i64> {
        self.in_hand.first().copied().or(self.next)
    }
}

/// Offsets in hand and done, per assigned partition.
#[derive(Debug, Default)]
pub(crate) struct Offsets {
    owned: HashMap<Partition, Owned>,
    generations: u64,
}

impl Offsets {
    /// The partition is now ours (a new generation: nothing of an earlier assignment counts).
    pub(crate) fn assign(&mut self, partition: Partition) {
        self.generations += 1;
        self.owned.insert(
            partition,
            Owned {
                generation: self.generations,
                ..Owned::default()
            },
        );
    }

    /// The partition is no longer ours: returns the offset to commit for it, if it moved.
    pub(crate) fn revoke(&mut self, partition: &Partition) -> Option<i64> {
        let owned = self.owned.remove(partition)?;
        owned
            .done_up_to()
            .filter(|done| owned.committed < Some(*done))
    }

    /// A message arrived: its ticket, or `None` when its partition is not (or no longer)
    /// assigned.
    pub(crate) fn received(&mut self, partition: Partition, offset: i64) -> Option<Ticket> {
        let owned = self.owned.get_mut(&partition)?;
        if owned.next.is_some_and(|next| offset != next) {
            // Kafka skips the offsets of transaction markers and compacted records, and a
            // client may see a batch again; anything else is the broker's doing.
            tracing::debug!(
                ?partition,
                expected = owned.next,
                offset,
                "kafka: offsets not contiguous"
            );
        }
        owned.in_hand.insert(offset);
        owned.next = Some(owned.next.map_or(offset + 1, |next| next.max(offset + 1)));
        Some(Ticket {
            partition,
            offset,
            generation: owned.generation,
        })
    }

    /// Whether the ticket's assignment is still current (its message may run).
    pub(crate) fn is_current(&self, ticket: &Ticket) -> bool {
        self.owned
            .get(&ticket.partition)
            .is_some_and(|owned| owned.generation == ticket.generation)
    }

    /// The message is finished (applied, skipped as a duplicate or dead-lettered).
    pub(crate) fn done(&mut self, ticket: &Ticket) {
        if let Some(owned) = self.owned.get_mut(&ticket.partition) {
            if owned.generation == ticket.generation {
                owned.in_hand.remove(&ticket.offset);
            }
        }
    }

    /// The offsets to commit now (those that moved since the last commit), marked as sent.
    pub(crate) fn take_commit(&mut self) -> Vec<(Partition, i64)> {
        let mut out = Vec::new();
        for (partition, owned) in &mut self.owned {
            if let Some(done) = owned.done_up_to() {
                if owned.committed < Some(done) {
                    owned.committed = Some(done);
                    out.push((partition.clone(), done));
                }
            }
        }
        out
    }

    /// A commit of `partition` failed: send it again with the next one.
    pub(crate) fn commit_failed(&mut self, partition: &Partition) {
        if let Some(owned) = self.owned.get_mut(partition) {
            owned.committed = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(n: i32) -> Partition {
        ("t".into(), n)
    }

    #[test]
    fn commits_only_up_to_the_oldest_message_in_hand() {
        let mut offsets = Offsets::default();
        offsets.assign(p(0));
        let tickets: Vec<Ticket> = (10..15)
            .map(|o| offsets.received(p(0), o).unwrap())
            .collect();
        assert_eq!(offsets.take_commit(), vec![(p(0), 10)]);
        // 11..14 finish before 10: nothing past 10 may be committed.
        for t in &tickets[1..] {
            offsets.done(t);
        }
        assert_eq!(offsets.take_commit(), vec![]);
        offsets.done(&tickets[0]);
        assert_eq!(offsets.take_commit(), vec![(p(0), 15)], "all done");
        assert_eq!(offsets.take_commit(), vec![], "sent once");
    }

    #[test]
    fn a_revoked_partition_commits_what_is_done_and_its_messages_go_stale() {
        let mut offsets = Offsets::default();
        offsets.assign(p(0));
        offsets.assign(p(1));
        let a = offsets.received(p(0), 0).unwrap();
        let b = offsets.received(p(0), 1).unwrap();
        assert!(offsets.received(p(2), 0).is_none(), "not assigned");
        offsets.done(&a);
        assert_eq!(offsets.revoke(&p(0)), Some(1), "b is still in hand");
        assert!(!offsets.is_current(&b));
        // Assigned again: a new generation, the old ticket stays stale.
        offsets.assign(p(0));
        assert!(!offsets.is_current(&b));
        offsets.done(&b);
        let again = offsets.received(p(0), 1).unwrap();
        assert!(offsets.is_current(&again));
        assert_eq!(offsets.take_commit(), vec![(p(0), 1)]);
        assert_eq!(offsets.revoke(&p(1)), None, "nothing received");
    }

    #[test]
    fn a_failed_commit_is_sent_again() {
        let mut offsets = Offsets::default();
        offsets.assign(p(0));
        let t = offsets.received(p(0), 5).unwrap();
        offsets.done(&t);
        assert_eq!(offsets.take_commit(), vec![(p(0), 6)]);
        offsets.commit_failed(&p(0));
        assert_eq!(offsets.take_commit(), vec![(p(0), 6)]);
    }
}
