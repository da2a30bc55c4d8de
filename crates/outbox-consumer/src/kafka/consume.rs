//! The Kafka runner's loop, over any [`Control`] and stream of [`Receive`]: the rdkafka
//! consumer in production, a seeded model of partitions, rebalances and commits in the
//! simulation. Records run in their aggregate's lane; a partition's offset is committed up to
//! its oldest record still in hand; records of a revoked partition still queued are dropped
//! (its next owner reads them again); beyond `max_in_hand` records the partitions are paused.

use std::{collections::VecDeque, sync::Mutex, time::Duration};

use futures::{stream::FuturesUnordered, Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use super::{
    delivery::KafkaDelivery,
    lock,
    offsets::{Offsets, Partition},
};
use crate::{
    runner::{
        lanes::{Lane, Lanes, Limits},
        Received, Worker,
    },
    DeadLetters, Error,
};

/// What the loop receives.
pub(crate) enum Receive {
    /// A record of a partition assigned here.
    Record(KafkaDelivery),
    /// A record of a partition no longer assigned here: ignored.
    Skipped,
    /// A receive error the consumer recovers from (logged).
    Transient(String),
    /// A receive error that ends the runner.
    Fatal(String),
}

/// What the loop does to its consumer besides receiving.
pub(crate) trait Control {
    /// Stops fetching (`true`, while the runner holds `max_in_hand` records), or fetches
    /// again; the consumer keeps polling either way, so it stays in its group.
    fn pause(&self, paused: bool);
    /// Commits `done` (each partition's next offset to read), synchronously when `sync`.
    fn commit(&self, done: &[(Partition, i64)], sync: bool) -> Result<(), String>;
}

/// Runs records from `stream` until `shutdown` or its end; then finishes the records running
/// and commits what is done.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn consume<S, C, D>(
    mut stream: S,
    control: &C,
    offsets: &Mutex<Offsets>,
    worker: &Worker<D>,
    max_in_hand: usize,
    commit_interval: Duration,
    shutdown: &CancellationToken,
) -> Result<(), Error>
where
    S: Stream<Item = Receive> + Unpin,
    C: Control,
    D: DeadLetters,
{
    let mut runs = Runs {
        // Kafka bounds what it holds by pausing its partitions (below), not by reading less:
        // the lanes only bound how many run at once.
        lanes: Lanes::new(Limits {
            concurrency: worker.config.concurrency,
            max_in_hand: usize::MAX,
        }),
        waiting: VecDeque::new(),
        held: 0,
    };
    let mut in_flight = FuturesUnordered::new();
    let run = |lane: Lane, message: Received<KafkaDelivery>| {
        let handled = worker.handle(message, shutdown);
        async move {
            handled.await;
            lane
        }
    };
    let mut tick = tokio::time::interval(commit_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut paused = false;
    let mut receive_errors = 0u32;
    let stopped = loop {
        worker.processor.counts().set_in_hand(runs.held);
        tokio::select! {
            () = shutdown.cancelled() => break None,
            Some(lane) = in_flight.next(), if !in_flight.is_empty() => {
                runs.held -= 1;
                for (lane, message) in runs.next_after(lane, offsets) {
                    in_flight.push(run(lane, message));
                }
            }
            next = stream.next() => match next {
                Some(Receive::Record(delivery)) => {
                    receive_errors = 0;
                    runs.held += 1;
                    let received = Received::new(delivery);
                    let lane = runs.lanes.lane_of(&received);
                    if let Some((lane, message)) = runs.admit(lane, received) {
                        in_flight.push(run(lane, message));
                    }
                }
                Some(Receive::Skipped) => {}
                Some(Receive::Fatal(e)) => {
                    break Some(Error::broker("kafka: fatal consumer error", e));
                }
                Some(Receive::Transient(e)) => {
                    receive_errors += 1;
                    if receive_errors.is_power_of_two() {
                        tracing::warn!(error = %e, receive_errors, "kafka: receiving failed; retrying");
                    }
                }
                None => break Some(Error::broker_message("kafka: consumer stream ended")),
            },
            _ = tick.tick() => commit(control, offsets, false),
        }
        // Bounded memory: stop fetching while full, fetch again at half.
        if runs.held >= max_in_hand && !paused {
            control.pause(true);
            paused = true;
        } else if paused && runs.held <= max_in_hand / 2 {
            control.pause(false);
            paused = false;
        }
    };
    while in_flight.next().await.is_some() {}
    worker.processor.counts().set_in_hand(0);
    commit(control, offsets, true);
    stopped.map_or(Ok(()), Err)
}

/// Commits the offsets that moved. A failed asynchronous commit is sent again by the next.
fn commit<C: Control>(control: &C, offsets: &Mutex<Offsets>, sync: bool) {
    let done = lock(offsets).take_commit();
    if done.is_empty() {
        return;
    }
    if let Err(e) = control.commit(&done, sync) {
        tracing::warn!(error = %e, "kafka: offset commit failed; it is sent again");
        let mut offsets = lock(offsets);
        for (partition, _) in &done {
            offsets.commit_failed(partition);
        }
    }
}

/// The messages held: in their lanes, or waiting for a lane to be free.
struct Runs {
    lanes: Lanes<Received<KafkaDelivery>>,
    /// Messages whose aggregate has no lane yet, while every lane is busy, in arrival order.
    waiting: VecDeque<(Lane, Received<KafkaDelivery>)>,
    held: usize,
}

impl Runs {
    /// The message to run now, if its lane is free and there is room; otherwise it queues
    /// (behind its aggregate's running lane, or behind the messages already waiting).
    fn admit(
        &mut self,
        lane: Lane,
        message: Received<KafkaDelivery>,
    ) -> Option<(Lane, Received<KafkaDelivery>)> {
        if self.lanes.is_running(&lane) || (self.waiting.is_empty() && self.lanes.has_room()) {
            return self.lanes.start(lane.clone(), message).map(|m| (lane, m));
        }
        self.waiting.push_back((lane, message));
        None
    }

    /// After `lane`'s message finished: the messages to run now (the lane's next current one,
    /// then waiting ones while there is room). Stale messages (their partition was revoked)
    /// are dropped on the way.
    fn next_after(
        &mut self,
        lane: Lane,
        offsets: &Mutex<Offsets>,
    ) -> Vec<(Lane, Received<KafkaDelivery>)> {
        let mut start = Vec::new();
        while let Some(next) = self.lanes.finished(&lane) {
            if lock(offsets).is_current(&next.delivery.ticket) {
                start.push((lane.clone(), next));
                break;
            }
            tracing::debug!(ticket = ?next.delivery.ticket, "kafka: stale record dropped");
            self.held -= 1;
        }
        while let Some((lane, message)) = self.waiting.pop_front() {
            if !lock(offsets).is_current(&message.delivery.ticket) {
                tracing::debug!(ticket = ?message.delivery.ticket, "kafka: stale record dropped");
                self.held -= 1;
                continue;
            }
            if !self.lanes.is_running(&lane) && !self.lanes.has_room() {
                self.waiting.push_front((lane, message));
                break;
            }
            if let Some(message) = self.lanes.start(lane.clone(), message) {
                start.push((lane, message));
            }
        }
        start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(id: &str) -> Lane {
        Lane::Aggregate("order".into(), id.into())
    }

    /// Two lanes at most; `b` and `c` wait for room in arrival order, `a`'s second message queues
    /// behind its first; messages of a revoked partition are dropped instead of run.
    #[test]
    fn messages_wait_for_room_in_order_and_stale_ones_are_dropped() {
        let offsets = std::sync::Arc::new(Mutex::new(Offsets::default()));
        let p0 = ("t".to_owned(), 0);
        let p1 = ("t".to_owned(), 1);
        lock(&offsets).assign(p0.clone());
        lock(&offsets).assign(p1.clone());
        let message = |p: &Partition, offset, id| {
            let ticket = lock(&offsets).received(p.clone(), offset).unwrap();
            (
                lane(id),
                Received::new(KafkaDelivery::new(
                    ticket,
                    crate::Message::new("t", Default::default(), bytes::Bytes::new()),
                    &offsets,
                )),
            )
        };
        let mut runs = Runs {
            lanes: Lanes::new(Limits {
                concurrency: 2,
                max_in_hand: usize::MAX,
            }),
            waiting: VecDeque::new(),
            held: 0,
        };
        let started =
            |r: Option<(Lane, Received<KafkaDelivery>)>| r.map(|(_, m)| m.delivery.ticket.offset);
        let mut admit = |(lane, m)| runs.admit(lane, m);
        assert_eq!(started(admit(message(&p0, 0, "a"))), Some(0));
        assert_eq!(started(admit(message(&p1, 0, "x"))), Some(0));
        assert_eq!(started(admit(message(&p0, 1, "b"))), None, "no room");
        assert_eq!(started(admit(message(&p0, 2, "a"))), None, "behind a");
        assert_eq!(started(admit(message(&p1, 1, "c"))), None, "no room");
        runs.held = 5;
        // `a`'s first finishes: its second runs, nothing else has room.
        let next: Vec<i64> = runs
            .next_after(lane("a"), &offsets)
            .into_iter()
            .map(|(_, m)| m.delivery.ticket.offset)
            .collect();
        assert_eq!(next, vec![2]);
        // Partition 1 is revoked: `c` (waiting) is dropped when its turn comes.
        assert_eq!(lock(&offsets).revoke(&p1), Some(0), "x still in hand");
        let next: Vec<(Lane, i64)> = runs
            .next_after(lane("x"), &offsets)
            .into_iter()
            .map(|(l, m)| (l, m.delivery.ticket.offset))
            .collect();
        assert_eq!(next, vec![(lane("b"), 1)], "b starts, c is stale");
        assert_eq!(runs.held, 4, "c no longer held");
        assert!(runs.waiting.is_empty());
    }
}
