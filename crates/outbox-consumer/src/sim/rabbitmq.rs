//! A RabbitMQ queue, modelled: deliveries in queue order within a prefetch window, a nack
//! (requeue) or a consumer gone (its runner crashed: the channel closed) putting the
//! unacknowledged message back at the head with `redelivered` set, and, as on a quorum queue, a
//! delivery limit past which the broker drops a message that keeps coming back.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::Stream;

use crate::{runner::Delivery, Message};

struct Queued {
    index: usize,
    redelivered: bool,
    returns: u32,
}

struct State {
    log: Vec<Message>,
    queue: VecDeque<Queued>,
    unacked: HashMap<u64, Queued>,
    tags: u64,
    prefetch: usize,
    delivery_limit: u32,
    dropped: Vec<usize>,
    subscribed: bool,
}

/// The queue, shared by the runners that consume it.
#[derive(Clone)]
pub(super) struct RabbitMq(Arc<Mutex<State>>);

impl RabbitMq {
    pub(super) fn new(prefetch: usize, delivery_limit: u32) -> Self {
        Self(Arc::new(Mutex::new(State {
            log: Vec::new(),
            queue: VecDeque::new(),
            unacked: HashMap::new(),
            tags: 0,
            prefetch,
            delivery_limit,
            dropped: Vec::new(),
            subscribed: true,
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().expect("rabbitmq model")
    }

    /// The queue is bound from now on only (a late subscriber: what was published before never
    /// reached it).
    pub(super) fn bind_later(&self) {
        self.state().subscribed = false;
    }

    /// The queue is bound now.
    pub(super) fn bind(&self) {
        self.state().subscribed = true;
    }

    /// The relay publishes a message (routed to the queue when it is bound).
    pub(super) fn publish(&self, message: Message) {
        let mut s = self.state();
        s.log.push(message);
        if s.subscribed {
            let index = s.log.len() - 1;
            s.queue.push_back(Queued {
                index,
                redelivered: false,
                returns: 0,
            });
        }
    }

    pub(super) fn settled(&self) -> bool {
        let s = self.state();
        s.queue.is_empty() && s.unacked.is_empty()
    }

    /// Messages the broker dropped at the delivery limit.
    pub(super) fn dropped(&self) -> Vec<usize> {
        self.state().dropped.clone()
    }

    pub(super) fn stream(
        &self,
    ) -> impl Stream<Item = Result<RabbitDelivery, std::convert::Infallible>> + Unpin {
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

    fn next(&self) -> Option<RabbitDelivery> {
        let mut s = self.state();
        if s.unacked.len() >= s.prefetch {
            return None;
        }
        let queued = s.queue.pop_front()?;
        s.tags += 1;
        let tag = s.tags;
        let delivery = RabbitDelivery {
            model: self.clone(),
            tag,
            message: s.log[queued.index].clone(),
            redelivered: queued.redelivered,
            done: false,
        };
        s.unacked.insert(tag, queued);
        Some(delivery)
    }

    /// Back at the head, delivered again (or dropped past the delivery limit).
    fn requeue(&self, tag: u64) {
        let mut s = self.state();
        if let Some(mut queued) = s.unacked.remove(&tag) {
            queued.returns += 1;
            queued.redelivered = true;
            if queued.returns > s.delivery_limit {
                s.dropped.push(queued.index);
            } else {
                s.queue.push_front(queued);
            }
        }
    }
}

/// One delivery of the modelled queue.
pub(super) struct RabbitDelivery {
    model: RabbitMq,
    tag: u64,
    message: Message,
    redelivered: bool,
    done: bool,
}

impl Delivery for RabbitDelivery {
    fn message(&self) -> &Message {
        &self.message
    }

    fn redelivered(&self) -> bool {
        self.redelivered
    }

    async fn ack(mut self) {
        self.done = true;
        self.model.state().unacked.remove(&self.tag);
    }

    async fn release(mut self) {
        self.done = true;
        self.model.requeue(self.tag);
    }

    async fn keep(&self) {}
}

/// A delivery dropped unanswered (its runner crashed, its channel closed) goes back to the
/// head of the queue, as the broker does.
impl Drop for RabbitDelivery {
    fn drop(&mut self) {
        if !self.done {
            self.model.requeue(self.tag);
        }
    }
}
