//! Many aggregates at once, each in order: a runner hands each message to the lane of its
//! aggregate. A lane runs one message at a time; the others of that aggregate queue behind it
//! in the order received, while other lanes go on. At most `concurrency` lanes run at once.

use std::collections::{HashMap, VecDeque};

/// Which messages must run one after another.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Lane {
    /// The messages of one aggregate (type, id).
    Aggregate(String, String),
    /// A message without an aggregate: ordered with nothing (the number tells it apart).
    Alone(u64),
}

/// The lanes running, and the messages queued behind each.
pub(crate) struct Lanes<M> {
    concurrency: usize,
    running: HashMap<Lane, VecDeque<M>>,
}

impl<M> Lanes<M> {
    pub(crate) fn new(concurrency: usize) -> Self {
        Self {
            concurrency: concurrency.max(1),
            running: HashMap::new(),
        }
    }

    /// Whether another message may be taken: fewer lanes run than allowed.
    pub(crate) fn has_room(&self) -> bool {
        self.running.len() < self.concurrency
    }

    /// The message to run now, or `None` when its lane is busy (it is queued behind).
    pub(crate) fn start(&mut self, lane: Lane, message: M) -> Option<M> {
        match self.running.get_mut(&lane) {
            Some(queue) => {
                queue.push_back(message);
                None
            }
            None => {
                self.running.insert(lane, VecDeque::new());
                Some(message)
            }
        }
    }

    /// The lane's message finished: the next one queued behind it, if any (the lane stays
    /// running), else the lane is free.
    pub(crate) fn finished(&mut self, lane: &Lane) -> Option<M> {
        let queue = self.running.get_mut(lane)?;
        let next = queue.pop_front();
        if next.is_none() {
            self.running.remove(lane);
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(id: &str) -> Lane {
        Lane::Aggregate("order".into(), id.into())
    }

    #[test]
    fn one_message_per_lane_in_order_and_bounded_lanes() {
        let mut lanes = Lanes::new(2);
        assert_eq!(lanes.start(lane("a"), 1), Some(1));
        assert_eq!(lanes.start(lane("a"), 2), None, "queued behind a's first");
        assert_eq!(lanes.start(lane("a"), 3), None);
        assert!(lanes.has_room());
        assert_eq!(lanes.start(lane("b"), 10), Some(10));
        assert!(!lanes.has_room(), "two lanes run");
        assert_eq!(lanes.finished(&lane("a")), Some(2));
        assert_eq!(lanes.finished(&lane("a")), Some(3));
        assert_eq!(lanes.finished(&lane("a")), None);
        assert!(lanes.has_room(), "a is free");
        // Messages without an aggregate never queue behind each other.
        assert_eq!(lanes.start(Lane::Alone(7), 20), Some(20));
        assert_eq!(lanes.finished(&lane("b")), None);
        assert_eq!(lanes.start(Lane::Alone(8), 21), Some(21));
    }
}
