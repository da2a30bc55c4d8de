//! The consumer's rebalance and commit callbacks. librdkafka runs them while the runner polls
//! for messages, on the runner's own task: the offsets they touch are never held across an
//! await.

use std::sync::{Arc, Mutex};

use rdkafka::{
    consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance},
    error::KafkaResult,
    ClientContext, Offset, TopicPartitionList,
};

use super::offsets::{Offsets, Partition};

/// Shares the runner's offsets with librdkafka's callbacks.
pub(crate) struct Context {
    pub(crate) offsets: Arc<Mutex<Offsets>>,
    pub(crate) consumer: String,
}

impl ClientContext for Context {}

impl ConsumerContext for Context {
    /// Before partitions go to another member, commit what is done in them (synchronously: the
    /// new owner starts from it), and make their messages still queued here stale: they are
    /// dropped, not run. A message already running finishes; the new owner's delivery of it
    /// waits on its inbox row, so the aggregate's order holds across the hand-over.
    fn pre_rebalance(&self, base: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(list) => {
                let done: Vec<(Partition, i64)> = {
                    let mut offsets = self.offsets.lock().expect("offsets lock");
                    partitions(list)
                        .filter_map(|p| offsets.revoke(&p).map(|offset| (p, offset)))
                        .collect()
                };
                tracing::info!(consumer = %self.consumer, partitions = list.count(),
                    "kafka: partitions revoked");
                if !done.is_empty() {
                    if let Err(e) = base.commit(&offset_list(&done), CommitMode::Sync) {
                        // The new owner starts earlier: redeliveries the inbox skips.
                        tracing::warn!(consumer = %self.consumer, error = %e,
                            "kafka: committing revoked partitions failed");
                    }
                }
            }
            Rebalance::Assign(list) => {
                let mut offsets = self.offsets.lock().expect("offsets lock");
                for p in partitions(list) {
                    offsets.assign(p);
                }
                tracing::info!(consumer = %self.consumer, partitions = list.count(),
                    "kafka: partitions assigned");
            }
            Rebalance::Error(e) => {
                tracing::warn!(consumer = %self.consumer, error = %e, "kafka: rebalance failed");
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, list: &TopicPartitionList) {
        if let Err(e) = result {
            tracing::warn!(consumer = %self.consumer, error = %e,
                "kafka: offset commit failed; it is sent again");
            let mut offsets = self.offsets.lock().expect("offsets lock");
            for p in partitions(list) {
                offsets.commit_failed(&p);
            }
        }
    }
}

fn partitions(list: &TopicPartitionList) -> impl Iterator<Item = Partition> + '_ {
    list.elements()
        .into_iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
}

/// The list librdkafka commits: each partition with its next offset to read.
pub(crate) fn offset_list(done: &[(Partition, i64)]) -> TopicPartitionList {
    let mut list = TopicPartitionList::with_capacity(done.len());
    for ((topic, partition), offset) in done {
        // Only fails for a negative offset, which `Offsets` never returns.
        let _ = list.add_partition_offset(topic, *partition, Offset::Offset(*offset));
    }
    list
}
