//! Many aggregates at once, each in order: a runner hands each message to the lane of its
//! aggregate (read from the decoded event, whichever envelope it came in). A lane runs one
//! message at a time; the others of that aggregate queue behind it in the order received,
//! while other lanes go on. At most `concurrency` lanes run at once, and at most
//! `max_in_hand` messages are held in memory (running or queued): beyond that the runner
//! stops taking more, whatever the broker would deliver.

use std::{
    collections::{HashMap, VecDeque},
    future::Future,
};

use futures::{stream::FuturesUnordered, Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use super::{Delivery, Received};
use crate::{metrics::Counts, Error};

/// What a runner does with a receive error: log it and go on, or stop with an error.
pub(crate) type OnReceiveError<E> = fn(E) -> Option<Error>;

/// How much a runner takes on at once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Lanes running at once.
    pub(crate) concurrency: usize,
    /// Messages in memory (running and queued behind their lane).
    pub(crate) max_in_hand: usize,
}

/// Takes messages from `source` into their lanes and runs `handle` on each, within `limits`,
/// until `shutdown` or the end of `source` (`ended`). The messages in hand are finished
/// first; those queued behind their aggregate are released, for the broker to deliver again.
/// `in_hand` is kept at the number of messages held.
pub(crate) async fn drive<D, E, S, H, F>(
    mut source: S,
    limits: Limits,
    shutdown: &CancellationToken,
    counts: &Counts,
    on_receive_error: OnReceiveError<E>,
    ended: fn() -> Error,
    handle: H,
) -> Result<(), Error>
where
    D: Delivery,
    S: Stream<Item = Result<D, E>> + Unpin,
    H: Fn(Received<D>) -> F,
    F: Future<Output = ()>,
{
    let run = |lane: Lane, message: Received<D>| {
        let handled = handle(message);
        async move {
            handled.await;
            lane
        }
    };
    let mut lanes = Lanes::new(limits);
    let mut in_flight = FuturesUnordered::new();
    let stopped = loop {
        counts.set_in_hand(lanes.in_hand());
        tokio::select! {
            () = shutdown.cancelled() => break None,
            Some(lane) = in_flight.next(), if !in_flight.is_empty() => {
                if let Some(message) = lanes.finished(&lane) {
                    in_flight.push(run(lane, message));
                }
            }
            next = source.next(), if lanes.has_room() => match next {
                None => break Some(ended()),
                Some(Err(e)) => {
                    if let Some(error) = on_receive_error(e) {
                        break Some(error);
                    }
                }
                Some(Ok(delivery)) => {
                    let message = Received::new(delivery);
                    let lane = lanes.lane_of(&message);
                    if let Some(message) = lanes.start(lane.clone(), message) {
                        in_flight.push(run(lane, message));
                    }
                }
            },
        }
    };
    while in_flight.next().await.is_some() {}
    for message in lanes.drain_queued() {
        message.delivery.release().await;
    }
    counts.set_in_hand(0);
    stopped.map_or(Ok(()), Err)
}

/// Which messages must run one after another.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Lane {
    /// The messages of one aggregate (type, id).
    Aggregate(String, String),
    /// A message without an aggregate: ordered with nothing (the number tells it apart).
    Alone(u64),
}

impl Lane {
    /// The lane of a decoded event: its aggregate (the processor's rule: an id, and a type
    /// when it gives one), else a lane of its own.
    pub(crate) fn of<D>(message: &Received<D>, alone: &mut u64) -> Self {
        match message
            .decoded
            .as_ref()
            .ok()
            .and_then(crate::store::Aggregate::of)
        {
            Some(aggregate) => Self::Aggregate(aggregate.kind, aggregate.id),
            None => Self::alone(alone),
        }
    }

    fn alone(alone: &mut u64) -> Self {
        *alone += 1;
        Self::Alone(*alone)
    }
}

/// The lanes running, and the messages queued behind each.
pub(crate) struct Lanes<M> {
    limits: Limits,
    running: HashMap<Lane, VecDeque<M>>,
    in_hand: usize,
    alone: u64,
}

impl<M> Lanes<M> {
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            limits: Limits {
                concurrency: limits.concurrency.max(1),
                max_in_hand: limits.max_in_hand.max(1),
            },
            running: HashMap::new(),
            in_hand: 0,
            alone: 0,
        }
    }

    /// Whether another message may be taken: fewer lanes run than allowed, and fewer
    /// messages are held than allowed.
    pub(crate) fn has_room(&self) -> bool {
        self.running.len() < self.limits.concurrency && self.in_hand < self.limits.max_in_hand
    }

    /// Messages held: running, or queued behind their lane.
    pub(crate) fn in_hand(&self) -> usize {
        self.in_hand
    }

    /// Whether `lane` has a message running.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) fn is_running(&self, lane: &Lane) -> bool {
        self.running.contains_key(lane)
    }

    /// The message to run now, or `None` when its lane is busy (it is queued behind).
    pub(crate) fn start(&mut self, lane: Lane, message: M) -> Option<M> {
        self.in_hand += 1;
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
        self.in_hand = self.in_hand.saturating_sub(1);
        let next = queue.pop_front();
        if next.is_none() {
            self.running.remove(lane);
        }
        next
    }

    /// The messages still queued, taken out (the runner stops: they are released).
    pub(crate) fn drain_queued(&mut self) -> Vec<M> {
        let queued: Vec<M> = self.running.drain().flat_map(|(_, q)| q).collect();
        self.in_hand = 0;
        queued
    }
}

impl<D> Lanes<Received<D>> {
    /// The lane of `message`.
    pub(crate) fn lane_of(&mut self, message: &Received<D>) -> Lane {
        Lane::of(message, &mut self.alone)
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
        let mut lanes = Lanes::new(Limits {
            concurrency: 2,
            max_in_hand: 100,
        });
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

    /// Before: room was counted in lanes only, so one busy aggregate took every message the
    /// broker would give into its queue.
    #[test]
    fn messages_queued_behind_a_busy_lane_count_against_the_room() {
        let mut lanes = Lanes::new(Limits {
            concurrency: 16,
            max_in_hand: 3,
        });
        assert_eq!(lanes.start(lane("a"), 1), Some(1));
        assert_eq!(lanes.start(lane("a"), 2), None);
        assert!(lanes.has_room());
        assert_eq!(lanes.start(lane("a"), 3), None);
        assert!(!lanes.has_room(), "three in hand, one lane running");
        assert_eq!(lanes.in_hand(), 3);
        assert_eq!(lanes.finished(&lane("a")), Some(2));
        assert!(lanes.has_room());
        assert_eq!(lanes.drain_queued(), vec![3]);
        assert_eq!(lanes.in_hand(), 0);
    }
}
