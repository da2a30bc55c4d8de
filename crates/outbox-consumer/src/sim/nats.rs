//! A JetStream durable pull consumer, modelled: a stream of messages delivered in order, at
//! most `max_ack_pending` unacknowledged at once, a message not acknowledged within
//! `ack_wait` (its runner crashed, its ack lost) delivered again with its delivery count
//! raised (a crashed runner's messages stay pending until then), a NAK delivering it again at
//! once, progress pushing its deadline back; now and then an ack is lost. A late
//! subscriber starts past the stream's first messages (the broker's retention took them).

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::Stream;
use rand::{rngs::StdRng, Rng};

use crate::{runner::Delivery, Message};

struct State {
    log: Vec<Message>,
    next: usize,
    /// Delivered and unacknowledged: token → (index, deadline).
    pending: HashMap<u64, (usize, Instant)>,
    again: VecDeque<usize>,
    acked: HashSet<usize>,
    delivered: HashMap<usize, u32>,
    tokens: u64,
    max_ack_pending: usize,
    ack_wait: Duration,
    rng: StdRng,
    lost_acks: u64,
}

/// The stream and its consumer's server-side state, shared by the runners that pull from it.
#[derive(Clone)]
pub(super) struct Nats(Arc<Mutex<State>>);

impl Nats {
    pub(super) fn new(rng: StdRng, max_ack_pending: usize, ack_wait: Duration) -> Self {
        Self(Arc::new(Mutex::new(State {
            log: Vec::new(),
            next: 0,
            pending: HashMap::new(),
            again: VecDeque::new(),
            acked: HashSet::new(),
            delivered: HashMap::new(),
            tokens: 0,
            max_ack_pending,
            ack_wait,
            rng,
            lost_acks: 0,
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().expect("nats model")
    }

    /// The relay publishes a message.
    pub(super) fn publish(&self, message: Message) {
        self.state().log.push(message);
    }

    /// The consumer is created now: it starts at the stream's current end (a late subscriber:
    /// what was published before is gone for it).
    pub(super) fn start_here(&self) -> usize {
        let mut s = self.state();
        s.next = s.log.len();
        s.next
    }

    /// Nothing left to deliver or acknowledge.
    pub(super) fn settled(&self) -> bool {
        let s = self.state();
        s.next == s.log.len() && s.pending.is_empty() && s.again.iter().all(|i| s.acked.contains(i))
    }

    pub(super) fn lost_acks(&self) -> u64 {
        self.state().lost_acks
    }

    /// What a runner pulls.
    pub(super) fn stream(
        &self,
    ) -> impl Stream<Item = Result<NatsDelivery, std::convert::Infallible>> + Unpin {
        let model = self.clone();
        Box::pin(futures::stream::unfold(model, |model| async move {
            loop {
                if let Some(delivery) = model.next() {
                    return Some((Ok(delivery), model));
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }))
    }

    fn next(&self) -> Option<NatsDelivery> {
        let mut s = self.state();
        let now = Instant::now();
        let expired: Vec<u64> = s
            .pending
            .iter()
            .filter(|(_, (_, deadline))| *deadline <= now)
            .map(|(token, _)| *token)
            .collect();
        for token in expired {
            let (index, _) = s.pending.remove(&token).expect("pending");
            if !s.acked.contains(&index) {
                s.again.push_back(index);
            }
        }
        if s.pending.len() >= s.max_ack_pending {
            return None;
        }
        let index = loop {
            match s.again.pop_front() {
                Some(i) if s.acked.contains(&i) => continue,
                Some(i) => break i,
                None if s.next < s.log.len() => {
                    s.next += 1;
                    break s.next - 1;
                }
                None => return None,
            }
        };
        s.tokens += 1;
        let token = s.tokens;
        let deadline = now + s.ack_wait;
        s.pending.insert(token, (index, deadline));
        let delivered = {
            let n = s.delivered.entry(index).or_default();
            *n += 1;
            *n
        };
        Some(NatsDelivery {
            model: self.clone(),
            token,
            message: s.log[index].clone(),
            delivered,
        })
    }
}

/// One delivery of the modelled consumer.
pub(super) struct NatsDelivery {
    model: Nats,
    token: u64,
    message: Message,
    delivered: u32,
}

impl Delivery for NatsDelivery {
    fn message(&self) -> &Message {
        &self.message
    }

    fn redelivered(&self) -> bool {
        self.delivered > 1
    }

    async fn ack(self) {
        let mut s = self.model.state();
        // Now and then the ack is lost: the server redelivers after the ack wait.
        if s.rng.random_bool(0.03) {
            s.lost_acks += 1;
            return;
        }
        if let Some((index, _)) = s.pending.remove(&self.token) {
            s.acked.insert(index);
        }
    }

    async fn release(self) {
        let mut s = self.model.state();
        if let Some((index, _)) = s.pending.remove(&self.token) {
            s.again.push_front(index);
        }
    }

    async fn keep(&self) {
        let mut s = self.model.state();
        let wait = s.ack_wait;
        if let Some((_, deadline)) = s.pending.get_mut(&self.token) {
            *deadline = Instant::now() + wait;
        }
    }
}
