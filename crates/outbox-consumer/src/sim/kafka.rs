//! A Kafka consumer group of one member, modelled: two topics (version 1 of each aggregate on
//! one, the later versions on the other: Kafka orders nothing between them), two partitions
//! each (keyed by aggregate), fetched in an order the seed draws (one topic can lag the other
//! by many records), offsets committed by the runner, rebalances that revoke and assign the
//! partitions back (re-read from the committed offsets), and a runner restarted after a crash
//! reading from them too. Retention may have deleted a partition's first records (a consumer
//! that joins late).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::Stream;
use rand::{rngs::StdRng, Rng};

use crate::{
    kafka::{
        consume::{Control, Receive},
        delivery::KafkaDelivery,
        offsets::{Offsets, Partition},
    },
    Message,
};

struct State {
    logs: BTreeMap<Partition, Vec<Message>>,
    /// The first offset retention kept.
    start: BTreeMap<Partition, i64>,
    committed: BTreeMap<Partition, i64>,
    /// The runner's next offset to fetch, per partition.
    position: BTreeMap<Partition, i64>,
    /// How much the fetch favours each partition (a lagging topic).
    weight: BTreeMap<Partition, u32>,
    paused: bool,
    rng: StdRng,
    rebalances: u64,
    /// The runner's offsets (what librdkafka's callbacks would touch).
    offsets: Arc<Mutex<Offsets>>,
}

/// The topics and the group's committed offsets.
#[derive(Clone)]
pub(super) struct Kafka(Arc<Mutex<State>>);

impl Kafka {
    pub(super) fn new(mut rng: StdRng) -> Self {
        let mut weight = BTreeMap::new();
        for topic in ["Placed", "Changed"] {
            for partition in 0..2 {
                weight.insert((topic.to_owned(), partition), rng.random_range(1..=8));
            }
        }
        Self(Arc::new(Mutex::new(State {
            logs: BTreeMap::new(),
            start: BTreeMap::new(),
            committed: BTreeMap::new(),
            position: BTreeMap::new(),
            weight,
            paused: false,
            rng,
            rebalances: 0,
            offsets: Arc::new(Mutex::new(Offsets::default())),
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().expect("kafka model")
    }

    /// The relay produces a message to the topic of its event type, the partition of its
    /// aggregate.
    pub(super) fn publish(&self, message: Message, event_type: &str, aggregate: &str) {
        let partition = (
            event_type.to_owned(),
            (aggregate.bytes().map(u32::from).sum::<u32>() % 2) as i32,
        );
        let mut s = self.state();
        s.logs.entry(partition).or_default().push(message);
    }

    /// Retention deletes everything produced so far (the consumer joins late).
    pub(super) fn retain_from_here(&self) {
        let mut s = self.state();
        let ends: Vec<(Partition, i64)> = s
            .logs
            .iter()
            .map(|(p, log)| (p.clone(), log.len() as i64))
            .collect();
        for (p, end) in ends {
            s.start.insert(p, end);
        }
    }

    /// A runner (re)starts: new offsets, every partition assigned, fetched from its committed
    /// offset. Returns the offsets the runner keeps.
    pub(super) fn join(&self) -> Arc<Mutex<Offsets>> {
        let mut s = self.state();
        s.offsets = Arc::new(Mutex::new(Offsets::default()));
        s.paused = false;
        Self::assign_all(&mut s);
        s.offsets.clone()
    }

    fn assign_all(s: &mut State) {
        let partitions: Vec<Partition> = s.weight.keys().cloned().collect();
        for p in partitions {
            s.offsets.lock().expect("offsets").assign(p.clone());
            let from = s
                .committed
                .get(&p)
                .copied()
                .or_else(|| s.start.get(&p).copied())
                .unwrap_or(0)
                .max(s.start.get(&p).copied().unwrap_or(0));
            s.position.insert(p, from);
        }
    }

    /// A rebalance: every partition revoked (what is done committed, as the runner's revoke
    /// callback does), then assigned back and fetched again from the committed offsets.
    fn rebalance(s: &mut State) {
        s.rebalances += 1;
        let partitions: Vec<Partition> = s.weight.keys().cloned().collect();
        for p in &partitions {
            let done = s.offsets.lock().expect("offsets").revoke(p);
            if let Some(offset) = done {
                s.committed.insert(p.clone(), offset);
            }
        }
        Self::assign_all(s);
    }

    pub(super) fn rebalances(&self) -> u64 {
        self.state().rebalances
    }

    /// Every record read and committed.
    pub(super) fn settled(&self) -> bool {
        let s = self.state();
        s.logs.iter().all(|(p, log)| {
            let start = s.start.get(p).copied().unwrap_or(0);
            log.len() as i64 <= start || s.committed.get(p).copied() == Some(log.len() as i64)
        })
    }

    /// What the runner fetches. With `rebalances`, the group rebalances now and then.
    pub(super) fn stream(&self, rebalances: bool) -> impl Stream<Item = Receive> + Unpin {
        let model = self.clone();
        Box::pin(futures::stream::unfold(model, move |model| async move {
            loop {
                if let Some(receive) = model.next(rebalances) {
                    return Some((receive, model));
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }))
    }

    fn next(&self, rebalances: bool) -> Option<Receive> {
        let mut s = self.state();
        if rebalances && s.rng.random_bool(0.004) {
            Self::rebalance(&mut s);
        }
        if s.paused {
            return None;
        }
        let ready: Vec<(Partition, u32)> = s
            .position
            .iter()
            .filter(|(p, at)| {
                s.logs
                    .get(*p)
                    .is_some_and(|log| (**at as usize) < log.len())
            })
            .map(|(p, _)| (p.clone(), s.weight[p]))
            .collect();
        let total: u32 = ready.iter().map(|(_, w)| w).sum();
        if total == 0 {
            return None;
        }
        let mut pick = s.rng.random_range(0..total);
        let partition = ready
            .iter()
            .find(|(_, w)| {
                if pick < *w {
                    true
                } else {
                    pick -= w;
                    false
                }
            })
            .map(|(p, _)| p.clone())
            .expect("a partition");
        let offset = s.position[&partition];
        s.position.insert(partition.clone(), offset + 1);
        let message = s.logs[&partition][offset as usize].clone();
        let offsets = s.offsets.clone();
        let ticket = offsets.lock().expect("offsets").received(partition, offset);
        Some(match ticket {
            Some(ticket) => Receive::Record(KafkaDelivery::new(ticket, message, &offsets)),
            None => Receive::Skipped,
        })
    }
}

impl Control for Kafka {
    fn pause(&self, paused: bool) {
        self.state().paused = paused;
    }

    fn commit(&self, done: &[(Partition, i64)], _sync: bool) -> Result<(), String> {
        let mut s = self.state();
        for (p, offset) in done {
            let at = s.committed.entry(p.clone()).or_insert(0);
            *at = (*at).max(*offset);
        }
        Ok(())
    }
}
