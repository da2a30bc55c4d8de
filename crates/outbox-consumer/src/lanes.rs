//! Many aggregates at once, each in order: a runner hands each message to the lane of its
//! aggregate. A lane runs one message at a time; the others of that aggregate queue behind it
//! in the order received, while other lanes go on. At most `concurrency` lanes run at once.

use std::{
    collections::{HashMap, VecDeque},
    future::Future,
};

use futures::{stream::FuturesUnordered, Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::Error;

/// What a runner does with a receive error: log it and go on, or stop with an error.
pub(crate) type OnReceiveError<E> = fn(E) -> Option<Error>;

/// Takes messages from `source` into their lanes (`lane_of`) and runs `handle` on each, up to
/// `concurrency` lanes at once, until `shutdown` or the end of `source` (`ended`). The
/// messages in hand are finished first; those queued behind their aggregate are left
/// unacknowledged, for the broker to deliver again.
pub(crate) async fn drive<M, E, S, H, F>(
    mut source: S,
    concurrency: usize,
    shutdown: &CancellationToken,
    lane_of: fn(&M) -> Lane,
    on_receive_error: OnReceiveError<E>,
    ended: fn() -> Error,
    handle: H,
) -> Result<(), Error>
where
    S: Stream<Item = Result<M, E>> + Unpin,
    H: Fn(M) -> F,
    F: Future<Output = ()>,
{
    let run = |lane: Lane, message: M| {
        let handled = handle(message);
        async move {
            handled.await;
            lane
        }
    };
    let mut lanes = Lanes::new(concurrency);
    let mut in_flight = FuturesUnordered::new();
    let stopped = loop {
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
                Some(Ok(message)) => {
                    let lane = lane_of(&message);
                    if let Some(message) = lanes.start(lane.clone(), message) {
                        in_flight.push(run(lane, message));
                    }
                }
            },
        }
    };
    while in_flight.next().await.is_some() {}
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

    /// Whether `lane` has a message running.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) fn is_running(&self, lane: &Lane) -> bool {
        self.running.contains_key(lane)
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
