//! JetStream acknowledgements through one subscription. Every publish carries a reply subject
//! `<inbox>.<token>` of this publisher's own inbox; one task reads the inbox and hands each
//! PubAck to the publish waiting for its token. This is what the JetStream context does per
//! message (a request with its own inbox, a permit, two timers, a generic response parse),
//! done once for all of them: the publish path costs a map entry and a oneshot channel.
//!
//! A reply that never comes (the connection broke, the server lost the message) ends the wait
//! at `ack_timeout`: the same task sweeps the waiting publishes every tenth of it and answers
//! those past their deadline, so no publish arms a timer of its own (the relay's publish
//! timeout bounds it anyway). The attempt is then transient ("maybe delivered"), and
//! `Nats-Msg-Id` makes the retry a duplicate the stream drops. The client resubscribes the
//! inbox after a reconnect; if the subscription ends (the client closed), every waiting
//! publish, and every later one, is answered at once.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use futures::StreamExt;
use tokio::{sync::oneshot, task::JoinHandle, time::Instant};

/// What a waiting publish is answered: the reply, or why none came.
type Answer = Result<async_nats::Message, NoAck>;

/// A publish waiting for its acknowledgement.
struct Waiter {
    /// No acknowledgement after this: answered [`NoAck::TimedOut`] by the next sweep.
    deadline: Instant,
    sender: oneshot::Sender<Answer>,
}

/// The publishes waiting for their acknowledgement, by token.
struct Waiting {
    next: AtomicU64,
    /// `None` once the inbox's reader stopped: nothing can be answered any more.
    by_token: Mutex<Option<HashMap<u64, Waiter, foldhash::fast::RandomState>>>,
}

impl Waiting {
    fn new() -> Self {
        Self {
            next: AtomicU64::new(0),
            by_token: Mutex::new(Some(HashMap::default())),
        }
    }

    /// Hands `reply` to the publish waiting for `token`, if it still waits.
    fn answer(&self, token: u64, reply: async_nats::Message) {
        let waiter = match &mut *self.by_token.lock().expect("not poisoned") {
            Some(by_token) => by_token.remove(&token),
            None => None,
        };
        // No waiter: the publish gave up already (its timeout), or a stray reply.
        if let Some(waiter) = waiter {
            let _ = waiter.sender.send(Ok(reply));
        }
    }

    /// Answers every publish past its deadline.
    fn expire(&self, now: Instant) {
        let expired: Vec<Waiter> = match &mut *self.by_token.lock().expect("not poisoned") {
            Some(by_token) => by_token
                .extract_if(|_, waiter| waiter.deadline <= now)
                .map(|(_, waiter)| waiter)
                .collect(),
            None => Vec::new(),
        };
        for waiter in expired {
            let _ = waiter.sender.send(Err(NoAck::TimedOut));
        }
    }

    /// The reader stopped: every waiting publish, and every later one, learns it at once (its
    /// sender dropped).
    fn close(&self) {
        self.by_token.lock().expect("not poisoned").take();
    }
}

/// The inbox of one publisher and the task that reads it.
pub(super) struct Acks {
    inbox: String,
    waiting: Arc<Waiting>,
    /// How long a publish waits for its acknowledgement.
    ack_timeout: Duration,
    router: JoinHandle<()>,
}

impl Acks {
    /// Subscribes to a new inbox of `client` and starts handing its replies out; a publish
    /// waits `ack_timeout` at most.
    pub(super) async fn start(
        client: &async_nats::Client,
        ack_timeout: Duration,
    ) -> Result<Self, async_nats::SubscribeError> {
        let inbox = client.new_inbox();
        let mut replies = client.subscribe(format!("{inbox}.*")).await?;
        let waiting = Arc::new(Waiting::new());
        let router = {
            let waiting = waiting.clone();
            let mut sweep = tokio::time::interval(sweep_period(ack_timeout));
            sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        reply = replies.next() => {
                            let Some(reply) = reply else { break };
                            let token = reply
                                .subject
                                .rsplit('.')
                                .next()
                                .and_then(|t| t.parse::<u64>().ok());
                            if let Some(token) = token {
                                waiting.answer(token, reply);
                            }
                        }
                        now = sweep.tick() => waiting.expire(now),
                    }
                }
                waiting.close();
            })
        };
        Ok(Self {
            inbox,
            waiting,
            ack_timeout,
            router,
        })
    }

    /// A reply subject for one publish, and the wait for its acknowledgement. Registered
    /// before the publish goes out, so that no reply can arrive unexpected.
    pub(super) fn expect(&self) -> (String, Pending) {
        let token = self.waiting.next.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = oneshot::channel();
        if let Some(by_token) = &mut *self.waiting.by_token.lock().expect("not poisoned") {
            let deadline = Instant::now() + self.ack_timeout;
            by_token.insert(token, Waiter { deadline, sender });
        }
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(token);
        let mut reply = String::with_capacity(self.inbox.len() + 1 + digits.len());
        reply.push_str(&self.inbox);
        reply.push('.');
        reply.push_str(digits);
        let pending = Pending {
            waiting: self.waiting.clone(),
            token,
            receiver,
            answered: false,
        };
        (reply, pending)
    }
}

impl Drop for Acks {
    fn drop(&mut self) {
        self.router.abort();
    }
}

/// How often the waiting publishes are swept for expired ones: a tenth of the timeout (so a
/// publish waits at most 10% longer than it), between 10 ms and 1 s.
fn sweep_period(ack_timeout: Duration) -> Duration {
    (ack_timeout / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// One publish waiting for its acknowledgement; dropping it unanswered forgets the token.
pub(super) struct Pending {
    waiting: Arc<Waiting>,
    token: u64,
    receiver: oneshot::Receiver<Answer>,
    /// An answer came: the reader removed the token already.
    answered: bool,
}

/// Why no acknowledgement came.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum NoAck {
    /// None within the ack timeout.
    TimedOut,
    /// The inbox's reader stopped (the client was closed).
    Closed,
}

impl Pending {
    /// The reply, or why none came within the ack timeout.
    pub(super) async fn reply(mut self) -> Answer {
        let answer = (&mut self.receiver).await;
        self.answered = true;
        answer.unwrap_or(Err(NoAck::Closed))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        if let Some(by_token) = &mut *self.waiting.by_token.lock().expect("not poisoned") {
            by_token.remove(&self.token);
        }
    }
}

#[cfg(test)]
mod tests {
    use outbox_testkit::{unique, NATS_URL};

    use super::*;

    /// A publish nobody answers ends in `TimedOut` after about the ack timeout, through the
    /// sweep, and leaves no entry behind; an answered one gets its reply.
    #[tokio::test]
    async fn unanswered_publishes_time_out_and_answered_ones_get_their_reply() {
        let client = async_nats::connect(NATS_URL).await.unwrap();
        let acks = Acks::start(&client, Duration::from_millis(300))
            .await
            .unwrap();
        // A core subscriber that answers only messages whose payload says so.
        let subject = unique("acks");
        let mut requests = client.subscribe(subject.clone()).await.unwrap();
        let responder = {
            let client = client.clone();
            tokio::spawn(async move {
                while let Some(m) = requests.next().await {
                    if &m.payload[..] == b"answer" {
                        let reply = m.reply.unwrap();
                        client.publish(reply, "ok".into()).await.unwrap();
                    }
                }
            })
        };
        client.flush().await.unwrap();

        let started = Instant::now();
        let (reply, silent) = acks.expect();
        client
            .publish_with_reply(subject.clone(), reply, "ignore".into())
            .await
            .unwrap();
        let (reply, answered) = acks.expect();
        client
            .publish_with_reply(subject.clone(), reply, "answer".into())
            .await
            .unwrap();

        let answered = answered.reply().await.expect("the reply");
        assert_eq!(&answered.payload[..], b"ok");
        assert_eq!(silent.reply().await.unwrap_err(), NoAck::TimedOut);
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(300),
            "timed out after {waited:?}, before its ack timeout"
        );
        let left = acks
            .waiting
            .by_token
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .len();
        assert_eq!(left, 0, "every token is forgotten");
        responder.abort();
    }

    /// Once the inbox's reader stops, a waiting publish and every later one end `Closed` at
    /// once instead of waiting out their timeout.
    #[tokio::test]
    async fn a_stopped_reader_answers_every_publish_closed() {
        let client = async_nats::connect(NATS_URL).await.unwrap();
        let acks = Acks::start(&client, Duration::from_secs(3600))
            .await
            .unwrap();
        let (_, waiting) = acks.expect();
        client.drain().await.unwrap();
        assert_eq!(waiting.reply().await.unwrap_err(), NoAck::Closed);
        let (_, later) = acks.expect();
        assert_eq!(later.reply().await.unwrap_err(), NoAck::Closed);
    }
}
