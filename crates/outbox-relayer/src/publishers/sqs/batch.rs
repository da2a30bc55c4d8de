//! Collects concurrent publishes to one queue into `SendMessageBatch` requests.
//!
//! Each queue has a lane: a task fed by a channel. It takes the first waiting entry, then
//! whatever else arrives within the linger, up to 10 entries and the batch byte limit, and
//! sends them as one request (several requests per lane may be in flight). Every caller
//! awaits its own entry's result: a partial failure fails only the failed entries. The relay
//! publishes one aggregate's events strictly one after another, so an aggregate never has two
//! entries waiting at once and batching never reorders it.
//!
//! The sending itself is behind [`SendBatch`], so the batching is tested without the network.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::encode::Entry;
use crate::publisher::PublishError;

/// SQS's limit on entries in one `SendMessageBatch`.
pub const MAX_ENTRIES: usize = 10;

/// Batch requests in flight at once per queue.
const IN_FLIGHT_PER_QUEUE: usize = 8;

/// The outcome of one entry of a batch.
pub type EntryResult = Result<(), PublishError>;

/// Sends one batch to a queue. `Ok` holds one result per entry, in the entries' order;
/// `Err` means the whole request failed.
pub trait SendBatch: Send + Sync + 'static {
    /// Sends `entries` (at most [`MAX_ENTRIES`]) to the queue at `queue_url`.
    fn send(
        &self,
        queue_url: String,
        entries: Vec<Entry>,
    ) -> BoxFuture<'_, Result<Vec<EntryResult>, PublishError>>;
}

struct Pending {
    entry: Entry,
    reply: oneshot::Sender<EntryResult>,
}

/// Limits of one batch.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// How long the first entry waits for others.
    pub linger: Duration,
    /// Total size of the entries of one batch ([`Entry::size`]).
    pub max_bytes: usize,
}

/// One lane per queue URL.
pub struct Batcher<S> {
    sender: Arc<S>,
    limits: Limits,
    lanes: Mutex<HashMap<String, mpsc::UnboundedSender<Pending>>>,
}

impl<S: SendBatch> Batcher<S> {
    /// A batcher sending through `sender`.
    pub fn new(sender: S, limits: Limits) -> Self {
        Self {
            sender: Arc::new(sender),
            limits,
            lanes: Mutex::new(HashMap::new()),
        }
    }

    /// Queues `entry` for `queue_url` and waits for its own result.
    pub async fn submit(&self, queue_url: &str, entry: Entry) -> EntryResult {
        let (reply, answer) = oneshot::channel();
        let mut pending = Pending { entry, reply };
        // A lane whose task ended (it cannot, short of a panic) is replaced once.
        for _ in 0..2 {
            match self.lane(queue_url).send(pending) {
                Ok(()) => {
                    return answer.await.unwrap_or_else(|_| {
                        Err(PublishError::transient(
                            "sqs: the batch carrying this message ended without a result",
                        ))
                    })
                }
                Err(mpsc::error::SendError(back)) => {
                    pending = back;
                    self.lanes.lock().expect("lanes").remove(queue_url);
                }
            }
        }
        Err(PublishError::transient("sqs: batch lane is not running"))
    }

    fn lane(&self, queue_url: &str) -> mpsc::UnboundedSender<Pending> {
        let mut lanes = self.lanes.lock().expect("lanes");
        if let Some(lane) = lanes.get(queue_url) {
            return lane.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run_lane(
            self.sender.clone(),
            queue_url.to_owned(),
            rx,
            self.limits,
        ));
        lanes.insert(queue_url.to_owned(), tx.clone());
        tx
    }
}

/// Forms batches for one queue until every sender of the channel is gone.
async fn run_lane<S: SendBatch>(
    sender: Arc<S>,
    queue_url: String,
    mut rx: mpsc::UnboundedReceiver<Pending>,
    limits: Limits,
) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT_PER_QUEUE));
    let mut carried: Option<Pending> = None;
    loop {
        let first = match carried.take() {
            Some(pending) => pending,
            None => match rx.recv().await {
                Some(pending) => pending,
                None => return,
            },
        };
        let mut bytes = first.entry.size();
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + limits.linger;
        while batch.len() < MAX_ENTRIES {
            // `timeout_at` polls the channel before looking at the clock, so a zero linger
            // still takes whatever is already waiting.
            let Ok(Some(next)) = tokio::time::timeout_at(deadline, rx.recv()).await else {
                break;
            };
            let size = next.entry.size();
            if bytes + size > limits.max_bytes {
                carried = Some(next);
                break;
            }
            bytes += size;
            batch.push(next);
        }
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let sender = sender.clone();
        let queue_url = queue_url.clone();
        tokio::spawn(async move {
            flush(&*sender, queue_url, batch).await;
            drop(permit);
        });
    }
}

/// Sends one batch and hands every caller its own entry's result.
async fn flush<S: SendBatch>(sender: &S, queue_url: String, batch: Vec<Pending>) {
    let (entries, replies): (Vec<Entry>, Vec<_>) =
        batch.into_iter().map(|p| (p.entry, p.reply)).unzip();
    let count = entries.len();
    match sender.send(queue_url, entries).await {
        Ok(results) => {
            let mut results = results.into_iter();
            for reply in replies {
                let result = results.next().unwrap_or_else(|| {
                    Err(PublishError::transient(format!(
                        "sqs: SendMessageBatch answered for fewer than its {count} entries"
                    )))
                });
                let _ = reply.send(result);
            }
        }
        Err(error) => {
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use futures::future::join_all;

    use super::*;
    use crate::publisher::FailureClass;

    /// Every batch sent: its queue URL and its entries' bodies.
    type Sent = Arc<StdMutex<Vec<(String, Vec<String>)>>>;

    /// Records the batches; an entry whose body starts with `transient`/`permanent` fails so;
    /// a batch containing `boom` fails as a whole; `short` makes the answer one entry short.
    #[derive(Default)]
    struct Fake {
        batches: Sent,
    }

    impl SendBatch for Fake {
        fn send(
            &self,
            queue_url: String,
            entries: Vec<Entry>,
        ) -> BoxFuture<'_, Result<Vec<EntryResult>, PublishError>> {
            let bodies: Vec<String> = entries.into_iter().map(|e| e.body).collect();
            self.batches
                .lock()
                .unwrap()
                .push((queue_url, bodies.clone()));
            Box::pin(async move {
                // A round trip, so later batches form while this one is in flight.
                tokio::time::sleep(Duration::from_millis(20)).await;
                if bodies.iter().any(|b| b == "boom") {
                    return Err(PublishError::transient("throttled"));
                }
                let mut results: Vec<EntryResult> = bodies
                    .iter()
                    .map(|b| {
                        if b.starts_with("transient") {
                            Err(PublishError::transient(b.clone()))
                        } else if b.starts_with("permanent") {
                            Err(PublishError::permanent(b.clone()))
                        } else {
                            Ok(())
                        }
                    })
                    .collect();
                if bodies.iter().any(|b| b == "short") {
                    results.pop();
                }
                Ok(results)
            })
        }
    }

    fn entry(body: &str) -> Entry {
        Entry {
            body: body.into(),
            attributes: Vec::new(),
            group_id: None,
            deduplication_id: None,
        }
    }

    fn batcher(linger_ms: u64, max_bytes: usize) -> (Batcher<Fake>, Sent) {
        let fake = Fake::default();
        let batches = fake.batches.clone();
        let limits = Limits {
            linger: Duration::from_millis(linger_ms),
            max_bytes,
        };
        (Batcher::new(fake, limits), batches)
    }

    fn sizes(batches: &StdMutex<Vec<(String, Vec<String>)>>) -> Vec<usize> {
        batches
            .lock()
            .unwrap()
            .iter()
            .map(|(_, b)| b.len())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_publishes_form_batches_of_ten() {
        let (batcher, batches) = batcher(5, 1 << 20);
        let bodies: Vec<String> = (0..25).map(|i| format!("m{i}")).collect();
        let results = join_all(bodies.iter().map(|b| batcher.submit("q", entry(b)))).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(sizes(&batches), [10, 10, 5]);
        // Entries keep their arrival order within and across batches.
        let sent: Vec<String> = batches
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(_, b)| b.clone())
            .collect();
        assert_eq!(sent, bodies);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_publish_goes_out_after_the_linger() {
        let (batcher, batches) = batcher(5, 1 << 20);
        let started = tokio::time::Instant::now();
        batcher.submit("q", entry("alone")).await.unwrap();
        // Paused clock: the elapsed time is the linger plus the fake's round trip, exactly.
        assert_eq!(started.elapsed(), Duration::from_millis(25));
        assert_eq!(sizes(&batches), [1]);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_linger_sends_what_is_waiting() {
        let (batcher, batches) = batcher(0, 1 << 20);
        let results = join_all((0..4).map(|i| batcher.submit("q", entry(&format!("m{i}"))))).await;
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(sizes(&batches).iter().sum::<usize>(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_partial_failure_fails_only_its_entries() {
        let (batcher, batches) = batcher(5, 1 << 20);
        let bodies = [
            "ok0",
            "transient:throttled",
            "ok2",
            "permanent:InvalidMessageContents",
            "ok4",
        ];
        let results = join_all(bodies.iter().map(|b| batcher.submit("q", entry(b)))).await;
        assert_eq!(sizes(&batches), [5]);
        assert!(results[0].is_ok() && results[2].is_ok() && results[4].is_ok());
        assert_eq!(
            results[1].as_ref().unwrap_err().class,
            FailureClass::Transient
        );
        let permanent = results[3].as_ref().unwrap_err();
        assert_eq!(permanent.class, FailureClass::Permanent);
        assert_eq!(permanent.message, "permanent:InvalidMessageContents");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_request_fails_every_entry() {
        let (batcher, _) = batcher(5, 1 << 20);
        let results = join_all(["a", "boom", "c"].map(|b| batcher.submit("q", entry(b)))).await;
        for r in results {
            assert_eq!(r.unwrap_err(), PublishError::transient("throttled"));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_answer_is_transient() {
        let (batcher, _) = batcher(5, 1 << 20);
        let results = join_all(["a", "short"].map(|b| batcher.submit("q", entry(b)))).await;
        assert!(results[0].is_ok());
        let error = results[1].as_ref().unwrap_err();
        assert!(error.is_transient(), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn batches_respect_the_byte_limit() {
        // Each entry is 100 bytes; 250 bytes per batch fit two.
        let (batcher, batches) = batcher(5, 250);
        let body = "x".repeat(100);
        let results = join_all((0..5).map(|_| batcher.submit("q", entry(&body)))).await;
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(sizes(&batches), [2, 2, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn queues_are_batched_apart() {
        let (batcher, batches) = batcher(5, 1 << 20);
        let results = join_all(
            (0..6).map(|i| batcher.submit(if i % 2 == 0 { "q-even" } else { "q-odd" }, entry("m"))),
        )
        .await;
        assert!(results.iter().all(Result::is_ok));
        let mut per_queue: Vec<(String, usize)> = batches
            .lock()
            .unwrap()
            .iter()
            .map(|(q, b)| (q.clone(), b.len()))
            .collect();
        per_queue.sort();
        assert_eq!(per_queue, [("q-even".into(), 3), ("q-odd".into(), 3)]);
    }
}
