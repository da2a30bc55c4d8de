//! Ordered lanes: the events of a batch grouped by aggregate. Lanes run concurrently; within a
//! lane, events are published one at a time, in id order, each only after the previous one was
//! acknowledged. The first failure ends the lane: the aggregate's later events are left pending
//! and wait for the failed one (guarantee G4), while other lanes go on.
//!
//! A publish never outlives the lease it was claimed under: it is given at most the time the
//! lease stays locally valid (which ends before any other relay can take the partition over).
//! Past it, the attempt is a transient failure ("maybe delivered"), so a successor never
//! publishes an aggregate's next event while this relay still waits for the previous one's
//! acknowledgement. A copy the broker client still delivers late (its own retry) can arrive
//! after the successor's first delivery of the same event: on a broker without deduplication
//! a consumer may see a repeated earlier event, never a later one before its first delivery.

use std::{collections::HashMap, ops::Range, sync::Arc, time::Duration};

use futures::{stream::FuturesUnordered, FutureExt, StreamExt};
use tokio::time::Instant;

use crate::{lease::Leases, publisher::PublishError, publisher::Publisher, wire::message::Message};

/// One event ready for a lane: the decoded message, or why the row cannot be published.
#[derive(Debug)]
pub struct Item {
    /// Row id.
    pub id: i64,
    /// Partition of the row.
    pub partition: i32,
    /// Lease epoch the row was claimed under.
    pub epoch: i64,
    /// Attempts before this one.
    pub attempts: i32,
    /// Permanent failures before this one.
    pub permanent_failures: i32,
    /// The message, or a permanent error found while decoding the row.
    pub message: Result<Message, PublishError>,
    /// The ordering key of a row that does not decode (a message carries its own).
    pub unpublishable_key: Option<(String, String)>,
}

impl Item {
    /// The ordering key (`aggregate_type`, `aggregate_id`).
    pub fn key(&self) -> (&str, &str) {
        match (&self.message, &self.unpublishable_key) {
            (Ok(m), _) => (&m.aggregate_type, &m.aggregate_id),
            (Err(_), Some((kind, id))) => (kind, id),
            (Err(_), None) => ("", ""),
        }
    }

    /// The routed destination, for metrics: [`super::UNDECODABLE`] for a row that does not
    /// decode.
    pub fn destination(&self) -> &str {
        match &self.message {
            Ok(m) => &m.destination,
            Err(_) => super::UNDECODABLE,
        }
    }
}

/// What happened to an item.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// The broker acknowledged it, at this instant.
    Published(Instant),
    /// Publishing failed (or the row could not be decoded).
    Failed(PublishError),
    /// Not attempted: an earlier event of its aggregate failed, or the lease was lost.
    Skipped,
}

/// Publishes `items` through `publisher`, at most `concurrency` aggregates at a time, each
/// aggregate's events in id order, and returns every item with its outcome, in the order
/// given. `publish_timeout` bounds a single publish: a broker that does not answer is a
/// transient failure, never a stuck lane. The items stay where they are while they publish
/// (lanes are ranges of indices), so a batch costs one vector of outcomes, not a copy of the
/// batch per lane.
pub async fn dispatch(
    items: Vec<Item>,
    publisher: Arc<dyn Publisher>,
    leases: Arc<Leases>,
    concurrency: usize,
    publish_timeout: Duration,
) -> Vec<(Item, Outcome)> {
    let (order, lanes) = lanes(&items);
    let mut outcomes: Vec<Outcome> = items.iter().map(|_| Outcome::Skipped).collect();
    {
        let (publisher, leases) = (publisher.as_ref(), leases.as_ref());
        let mut waiting = lanes.into_iter();
        let mut running = FuturesUnordered::new();
        loop {
            while running.len() < concurrency.max(1) {
                let Some(lane) = waiting.next() else { break };
                running.push(run_lane(
                    &items,
                    &order[lane],
                    publisher,
                    leases,
                    publish_timeout,
                ));
            }
            let Some(done) = running.next().await else {
                break;
            };
            for (i, outcome) in done {
                outcomes[i] = outcome;
            }
        }
    }
    items.into_iter().zip(outcomes).collect()
}

/// The lanes of `items`: their indices ordered by aggregate, then id, and the range of that
/// order each aggregate's lane takes (lanes numbered by their first event's id).
fn lanes(items: &[Item]) -> (Vec<usize>, Vec<Range<usize>>) {
    let mut by_id: Vec<usize> = (0..items.len()).collect();
    by_id.sort_unstable_by_key(|&i| items[i].id);
    let mut index: HashMap<(&str, &str), usize> = HashMap::with_capacity(items.len());
    let mut lane_of = vec![0; items.len()];
    for &i in &by_id {
        let next = index.len();
        lane_of[i] = *index.entry(items[i].key()).or_insert(next);
    }
    let mut order = by_id;
    order.sort_by_key(|&i| lane_of[i]);
    let mut lanes = Vec::with_capacity(index.len());
    let mut start = 0;
    for end in 1..=order.len() {
        if end == order.len() || lane_of[order[end]] != lane_of[order[start]] {
            lanes.push(start..end);
            start = end;
        }
    }
    (order, lanes)
}

async fn run_lane(
    items: &[Item],
    lane: &[usize],
    publisher: &dyn Publisher,
    leases: &Leases,
    publish_timeout: Duration,
) -> Vec<(usize, Outcome)> {
    let mut out = Vec::with_capacity(lane.len());
    let mut stopped = false;
    for &i in lane {
        let item = &items[i];
        // One look at the lease: valid now, and for how long.
        let lease_left = match stopped {
            true => None,
            false => leases.remaining(item.partition, item.epoch),
        };
        let Some(lease_left) = lease_left else {
            stopped = true;
            out.push((i, Outcome::Skipped));
            continue;
        };
        let outcome = match &item.message {
            Err(e) => Outcome::Failed(e.clone()),
            Ok(message) => publish_one(publisher, message, publish_timeout, lease_left).await,
        };
        stopped = !matches!(outcome, Outcome::Published(_));
        out.push((i, outcome));
    }
    out
}

/// Publishes one message, waiting for its acknowledgement at most `timeout` and no longer than
/// `lease_left`. A panicking publisher is a permanent failure of this message.
async fn publish_one(
    publisher: &dyn Publisher,
    message: &Message,
    timeout: Duration,
    lease_left: Duration,
) -> Outcome {
    if let Err(e) = publisher.check_destination(&message.destination) {
        return Outcome::Failed(e);
    }
    if message.payload.len() > publisher.max_payload_bytes() {
        return Outcome::Failed(PublishError::permanent(format!(
            "payload is {} bytes, over the {} limit of {} bytes",
            message.payload.len(),
            publisher.name(),
            publisher.max_payload_bytes()
        )));
    }
    let wait = timeout.min(lease_left);
    #[cfg(feature = "otel")]
    if let Some((span, traced)) = crate::otel::start(publisher.name(), message) {
        let outcome = send(publisher, &traced, wait, timeout).await;
        span.finish(match &outcome {
            Outcome::Failed(e) => Err(e),
            _ => Ok(()),
        });
        return outcome;
    }
    send(publisher, message, wait, timeout).await
}

/// Sends `message` and waits for its acknowledgement at most `wait` (the publish timeout, or
/// less when the lease runs out first).
async fn send(
    publisher: &dyn Publisher,
    message: &Message,
    wait: Duration,
    timeout: Duration,
) -> Outcome {
    let panicked = |panic: Box<dyn std::any::Any + Send>| {
        Outcome::Failed(PublishError::permanent(format!(
            "the {} publisher panicked: {}",
            publisher.name(),
            crate::error::panic_message(&panic)
        )))
    };
    // A panic when the publish starts or while it runs.
    let publish =
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| publisher.publish(message)))
        {
            Ok(publish) => std::panic::AssertUnwindSafe(publish).catch_unwind(),
            Err(panic) => return panicked(panic),
        };
    let started = Instant::now();
    match tokio::time::timeout(wait, publish).await {
        Ok(Ok(Ok(()))) => Outcome::Published(Instant::now()),
        // A transient failure that took long (the client's own timeout, an endpoint that
        // answers 503 after seconds) is a destination slow to answer, as one that does not.
        Ok(Ok(Err(e))) if e.is_transient() && started.elapsed() >= SLOW_FAILURE => {
            Outcome::Failed(PublishError::transient(format!(
                "{UNANSWERED}{} within {:?}: {}",
                publisher.name(),
                started.elapsed(),
                e.message
            )))
        }
        Ok(Ok(Err(e))) => Outcome::Failed(e),
        Ok(Err(panic)) => panicked(panic),
        // Cut short by the lease: a sign that the destination hangs only when it had a while
        // to answer (a lease about to run out may leave it a few milliseconds).
        Err(_) if wait < timeout => Outcome::Failed(PublishError::transient(format!(
            "{}{} before the partition lease ran out ({wait:?})",
            if wait >= SLOW_FAILURE {
                UNANSWERED
            } else {
                "no answer from "
            },
            publisher.name()
        ))),
        Err(_) => Outcome::Failed(PublishError::transient(format!(
            "{UNANSWERED}{} within {timeout:?}",
            publisher.name()
        ))),
    }
}

/// How the failure of a publish that got no answer in time begins.
const UNANSWERED: &str = "no acknowledgement from ";

/// A transient failure that came after this long is a destination slow to answer.
const SLOW_FAILURE: Duration = Duration::from_secs(1);

/// Whether `error` is a publish that got no answer in time, or a transient failure that took
/// [`SLOW_FAILURE`] or longer (a destination that hangs or is slow to answer, rather than one
/// that refuses at once).
#[cfg(feature = "postgres")]
pub(crate) fn unanswered(error: &PublishError) -> bool {
    error.is_transient() && error.message.starts_with(UNANSWERED)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use futures::future::BoxFuture;

    use super::*;

    /// Records the order of publishes; fails the events whose id is listed.
    struct Recorder {
        log: Mutex<Vec<i64>>,
        fail: Vec<i64>,
    }

    impl Publisher for Recorder {
        fn publish<'a>(&'a self, m: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
            Box::pin(async move {
                // Yield so that lanes interleave.
                tokio::task::yield_now().await;
                if self.fail.contains(&m.id) {
                    return Err(PublishError::permanent("rejected"));
                }
                self.log.lock().unwrap().push(m.id);
                Ok(())
            })
        }
        fn name(&self) -> &'static str {
            "recorder"
        }
        fn max_payload_bytes(&self) -> usize {
            1024
        }
    }

    fn item(id: i64, aggregate: &str) -> Item {
        let message = crate::wire::message::sample(id, aggregate);
        Item {
            id,
            partition: 0,
            epoch: 1,
            attempts: 0,
            permanent_failures: 0,
            message: Ok(message),
            unpublishable_key: None,
        }
    }

    fn leases() -> Arc<Leases> {
        let leases = Leases::default();
        leases.add_for_test(&[(0, 1)]);
        Arc::new(leases)
    }

    #[tokio::test]
    async fn keeps_order_per_aggregate_and_stops_a_lane_at_its_first_failure() {
        let publisher = Arc::new(Recorder {
            log: Mutex::new(Vec::new()),
            fail: vec![3],
        });
        // a: 1, 3 (fails), 5 ; b: 2, 4, 6 — given out of order on purpose.
        let items = [6, 1, 4, 3, 2, 5]
            .into_iter()
            .map(|id| item(id, if id % 2 == 0 { "b" } else { "a" }))
            .collect();
        let results = dispatch(
            items,
            publisher.clone(),
            leases(),
            8,
            Duration::from_secs(5),
        )
        .await;
        let log = publisher.log.lock().unwrap().clone();
        let b: Vec<i64> = log.iter().copied().filter(|id| id % 2 == 0).collect();
        assert_eq!(b, vec![2, 4, 6]);
        assert!(log.contains(&1) && !log.contains(&5));
        let outcome = |id| &results.iter().find(|(i, _)| i.id == id).unwrap().1;
        assert!(matches!(outcome(3), Outcome::Failed(e) if !e.is_transient()));
        assert_eq!(outcome(5), &Outcome::Skipped);
    }

    #[tokio::test]
    async fn undecodable_rows_fail_without_a_publish_and_block_their_lane() {
        let publisher = Arc::new(Recorder {
            log: Mutex::new(Vec::new()),
            fail: vec![],
        });
        let mut bad = item(1, "a");
        bad.message = Err(PublishError::permanent("headers must be a JSON object"));
        bad.unpublishable_key = Some(("order".into(), "a".into()));
        let items = vec![bad, item(2, "a"), item(3, "b")];
        let results = dispatch(
            items,
            publisher.clone(),
            leases(),
            8,
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(*publisher.log.lock().unwrap(), vec![3]);
        assert_eq!(results.len(), 3);
    }

    /// Fails transiently: aggregate `slow` after two seconds, the others at once.
    struct Refusing;

    impl Publisher for Refusing {
        fn publish<'a>(&'a self, m: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
            Box::pin(async move {
                if m.aggregate_id == "slow" {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                Err(PublishError::transient("503"))
            })
        }
        fn name(&self) -> &'static str {
            "refusing"
        }
        fn max_payload_bytes(&self) -> usize {
            1024
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_transient_failure_that_took_long_reads_as_unanswered() {
        let results = dispatch(
            vec![item(1, "slow"), item(2, "fast")],
            Arc::new(Refusing),
            leases(),
            8,
            Duration::from_secs(30),
        )
        .await;
        let errors: Vec<&PublishError> = results
            .iter()
            .map(|(_, outcome)| match outcome {
                Outcome::Failed(e) => e,
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(unanswered(errors[0]), "{}", errors[0]);
        assert!(errors[0].message.ends_with(": 503"), "{}", errors[0]);
        assert!(!unanswered(errors[1]), "{}", errors[1]);
        assert_eq!(errors[1].message, "503");
    }

    /// Never acknowledges.
    struct Silent;

    impl Publisher for Silent {
        fn publish<'a>(&'a self, _: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
            Box::pin(futures::future::pending())
        }
        fn name(&self) -> &'static str {
            "silent"
        }
        fn max_payload_bytes(&self) -> usize {
            1024
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_publish_waits_no_longer_than_its_lease_stays_valid() {
        let leases = Leases::default();
        leases.add_for_test_lasting(&[(0, 1)], Duration::from_secs(2));
        let started = Instant::now();
        let results = dispatch(
            vec![item(1, "a"), item(2, "a")],
            Arc::new(Silent),
            Arc::new(leases),
            8,
            Duration::from_secs(30),
        )
        .await;
        // The attempt ends when the lease would lapse, not after the 30 s publish timeout: a
        // successor can take the partition only after that, so it never publishes the
        // aggregate's next event while this relay still waits for the previous one's ack.
        assert!(started.elapsed() <= Duration::from_secs(2));
        match &results[0].1 {
            Outcome::Failed(e) => {
                assert!(e.is_transient(), "maybe delivered: {e}");
                assert!(
                    e.message.contains("before the partition lease ran out"),
                    "{e}"
                );
                // Two seconds without an answer: a destination that hangs.
                assert!(unanswered(e), "{e}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(results[1].1, Outcome::Skipped);
    }

    #[tokio::test]
    async fn lost_lease_skips_everything() {
        let publisher = Arc::new(Recorder {
            log: Mutex::new(Vec::new()),
            fail: vec![],
        });
        let items = vec![item(1, "a"), item(2, "b")];
        let results = dispatch(
            items,
            publisher.clone(),
            Arc::new(Leases::default()),
            8,
            Duration::from_secs(5),
        )
        .await;
        assert!(publisher.log.lock().unwrap().is_empty());
        assert!(results.iter().all(|(_, o)| *o == Outcome::Skipped));
    }
}
