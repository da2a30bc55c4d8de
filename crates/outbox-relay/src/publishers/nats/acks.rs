//! JetStream acknowledgements through one subscription. Every publish carries a reply subject
//! `<inbox>.<token>` of this publisher's own inbox; one task reads the inbox and hands each
//! PubAck to the publish waiting for its token. This is what the JetStream context does per
//! message (a request with its own inbox, a permit, two timers, a generic response parse),
//! done once for all of them: the publish path costs a map entry and a oneshot channel.
//!
//! A reply that never comes (the connection broke, the server lost the message) ends the wait
//! at `ack_timeout`, and the relay's publish timeout bounds it anyway: the attempt is then
//! transient ("maybe delivered"), and `Nats-Msg-Id` makes the retry a duplicate the stream
//! drops. The client resubscribes the inbox after a reconnect.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use futures::StreamExt;
use tokio::{sync::oneshot, task::JoinHandle};

/// The publishes waiting for their acknowledgement, by token.
#[derive(Default)]
struct Waiting {
    next: AtomicU64,
    by_token: Mutex<HashMap<u64, oneshot::Sender<async_nats::Message>>>,
}

/// The inbox of one publisher and the task that reads it.
pub(super) struct Acks {
    inbox: String,
    waiting: Arc<Waiting>,
    router: JoinHandle<()>,
}

impl Acks {
    /// Subscribes to a new inbox of `client` and starts handing its replies out.
    pub(super) async fn start(
        client: &async_nats::Client,
    ) -> Result<Self, async_nats::SubscribeError> {
        let inbox = client.new_inbox();
        let mut replies = client.subscribe(format!("{inbox}.*")).await?;
        let waiting = Arc::new(Waiting::default());
        let router = {
            let waiting = waiting.clone();
            tokio::spawn(async move {
                while let Some(reply) = replies.next().await {
                    let token = reply
                        .subject
                        .rsplit('.')
                        .next()
                        .and_then(|t| t.parse::<u64>().ok());
                    let waiter = token.and_then(|t| {
                        let mut by_token = waiting.by_token.lock().expect("not poisoned");
                        by_token.remove(&t)
                    });
                    // No waiter: the publish gave up already (its timeout), or a stray reply.
                    if let Some(waiter) = waiter {
                        let _ = waiter.send(reply);
                    }
                }
            })
        };
        Ok(Self {
            inbox,
            waiting,
            router,
        })
    }

    /// A reply subject for one publish, and the wait for its acknowledgement. Registered
    /// before the publish goes out, so that no reply can arrive unexpected.
    pub(super) fn expect(&self) -> (String, Pending) {
        let token = self.waiting.next.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = oneshot::channel();
        self.waiting
            .by_token
            .lock()
            .expect("not poisoned")
            .insert(token, sender);
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

/// One publish waiting for its acknowledgement; dropping it unanswered forgets the token.
pub(super) struct Pending {
    waiting: Arc<Waiting>,
    token: u64,
    receiver: oneshot::Receiver<async_nats::Message>,
    /// The reply came: the reader removed the token already.
    answered: bool,
}

/// Why no acknowledgement came.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum NoAck {
    /// None within the wait.
    TimedOut,
    /// The inbox's reader stopped (the client was closed).
    Closed,
}

impl Pending {
    /// The reply, waited for at most `timeout`.
    pub(super) async fn reply(mut self, timeout: Duration) -> Result<async_nats::Message, NoAck> {
        match tokio::time::timeout(timeout, &mut self.receiver).await {
            Ok(Ok(reply)) => {
                self.answered = true;
                Ok(reply)
            }
            Ok(Err(_)) => Err(NoAck::Closed),
            Err(_) => Err(NoAck::TimedOut),
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        self.waiting
            .by_token
            .lock()
            .expect("not poisoned")
            .remove(&self.token);
    }
}
