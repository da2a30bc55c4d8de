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

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::{FutureExt, StreamExt};
use tokio::time::Instant;

use crate::{lease::Leases, Message, PublishError, Publisher};

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
    /// Ordering key.
    pub key: (String, String),
    /// The routed destination (for metrics), if the row could be routed.
    pub destination: String,
    /// The message, or a permanent error found while decoding the row.
    pub message: Result<Message, PublishError>,
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

/// Publishes `items` (in id order) through `publisher`, at most `concurrency` aggregates at a
/// time, and returns every item's outcome. `publish_timeout` bounds a single publish: a broker
/// that does not answer is a transient failure, never a stuck lane.
pub async fn dispatch(
    items: Vec<Item>,
    publisher: Arc<dyn Publisher>,
    leases: Arc<Leases>,
    concurrency: usize,
    publish_timeout: Duration,
) -> Vec<(Item, Outcome)> {
    let lanes = into_lanes(items);
    futures::stream::iter(lanes)
        .map(|lane| run_lane(lane, publisher.clone(), leases.clone(), publish_timeout))
        .buffer_unordered(concurrency)
        .flat_map(futures::stream::iter)
        .collect()
        .await
}

/// Groups items by aggregate, keeping id order within each group.
fn into_lanes(mut items: Vec<Item>) -> Vec<Vec<Item>> {
    items.sort_by_key(|i| i.id);
    let mut index: HashMap<(String, String), usize> = HashMap::new();
    let mut lanes: Vec<Vec<Item>> = Vec::new();
    for item in items {
        match index.get(&item.key) {
            Some(&i) => lanes[i].push(item),
            None => {
                index.insert(item.key.clone(), lanes.len());
                lanes.push(vec![item]);
            }
        }
    }
    lanes
}

async fn run_lane(
    lane: Vec<Item>,
    publisher: Arc<dyn Publisher>,
    leases: Arc<Leases>,
    publish_timeout: Duration,
) -> Vec<(Item, Outcome)> {
    let mut out = Vec::with_capacity(lane.len());
    let mut stopped = false;
    for item in lane {
        if stopped || !leases.is_valid(item.partition, item.epoch) {
            stopped = true;
            out.push((item, Outcome::Skipped));
            continue;
        }
        let outcome = match (&item.message, leases.remaining(item.partition, item.epoch)) {
            (Err(e), _) => Outcome::Failed(e.clone()),
            (Ok(message), Some(lease_left)) => {
                publish_one(publisher.as_ref(), message, publish_timeout, lease_left).await
            }
            // The lease ran out between the check above and now.
            (Ok(_), None) => Outcome::Skipped,
        };
        stopped = !matches!(outcome, Outcome::Published(_));
        out.push((item, outcome));
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
    match tokio::time::timeout(wait, publish).await {
        Ok(Ok(Ok(()))) => Outcome::Published(Instant::now()),
        Ok(Ok(Err(e))) => Outcome::Failed(e),
        Ok(Err(panic)) => panicked(panic),
        Err(_) if wait < timeout => Outcome::Failed(PublishError::transient(format!(
            "no acknowledgement from {} before the partition lease ran out ({wait:?})",
            publisher.name()
        ))),
        Err(_) => Outcome::Failed(PublishError::transient(format!(
            "no acknowledgement from {} within {timeout:?}",
            publisher.name()
        ))),
    }
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
        let message = crate::message::sample(id, aggregate);
        Item {
            id,
            partition: 0,
            epoch: 1,
            attempts: 0,
            permanent_failures: 0,
            key: ("order".into(), aggregate.into()),
            destination: message.destination.clone(),
            message: Ok(message),
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
