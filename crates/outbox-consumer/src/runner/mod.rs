//! What every runner shares, whatever its broker: one message's way through the processor
//! ([`Worker::handle`]), the lanes that keep each aggregate's messages one after another
//! ([`lanes`]), and the sweeper that applies held events when they are due ([`sweeper`]).
//!
//! A runner adapts its broker's deliveries to [`Delivery`] and its dead-letter destination to
//! [`DeadLetters`]; the rest is here, so every broker keeps the same promise: each event is
//! applied once, in its aggregate's order, or held with a visible reason, or dead-lettered
//! with its reason. Nothing waits in the broker's in-flight window: an event whose turn has
//! not come, and one whose first attempt failed, is stored in the consumer's database and
//! acknowledged.

pub(crate) mod lanes;
pub(crate) mod sweeper;

use std::{future::Future, time::Duration};

use tokio_util::sync::CancellationToken;

pub(crate) use crate::processor::Retry;
use crate::DeadLetters;
use crate::{
    metrics::Count,
    processor::Delivered,
    store::{Aggregate, Hold},
    ConsumerConfig, DecodeError, Envelope, HandlerError, Message, Outcome, Processor,
};

/// A runner's whole life until `shutdown` (or its source ends): its lanes take `source`'s
/// deliveries while the sweeper applies held events as they come due. NATS and RabbitMQ run
/// exactly this; Kafka runs its own loop beside the same sweeper ([`with_sweeper`]).
pub(crate) async fn run<D, E, St, S>(
    source: St,
    worker: &Worker<S>,
    shutdown: &CancellationToken,
    on_receive_error: lanes::OnReceiveError<E>,
    ended: fn() -> crate::Error,
) -> Result<(), crate::Error>
where
    D: Delivery,
    St: futures::Stream<Item = Result<D, E>> + Unpin,
    S: DeadLetters,
{
    let limits = lanes::Limits {
        concurrency: worker.config.concurrency,
        max_in_hand: worker.config.max_in_hand,
    };
    with_sweeper(worker, shutdown, async {
        lanes::drive(
            source,
            limits,
            shutdown,
            worker.processor.counts(),
            on_receive_error,
            ended,
            |message| worker.handle(message, shutdown),
        )
        .await
    })
    .await
}

/// Runs `consume` with the worker's sweeper beside it, until `consume` ends (the sweeper then
/// stops too).
pub(crate) async fn with_sweeper<S, F>(
    worker: &Worker<S>,
    shutdown: &CancellationToken,
    consume: F,
) -> Result<(), crate::Error>
where
    S: DeadLetters,
    F: Future<Output = Result<(), crate::Error>>,
{
    let sweeping = shutdown.child_token();
    let (result, ()) = tokio::join!(
        async {
            let result = consume.await;
            sweeping.cancel();
            result
        },
        worker.sweep(&sweeping),
    );
    result
}

/// One delivery of a broker, as the runner core needs it.
pub(crate) trait Delivery: Send + 'static {
    /// The message as received.
    fn message(&self) -> &Message;
    /// Whether the broker says it delivered this message before (a consumer stopped or
    /// crashed with it in hand, an ack lost): its tries are counted from the database.
    fn redelivered(&self) -> bool;
    /// Done: the broker must not deliver it again.
    fn ack(self) -> impl Future<Output = ()> + Send;
    /// Not done (the runner stops): the broker delivers it again.
    fn release(self) -> impl Future<Output = ()> + Send;
    /// Still being worked on: the broker's redelivery deadline is pushed back (NATS).
    fn keep(&self) -> impl Future<Output = ()> + Send;
    /// Whether it may still be worked on here (Kafka: its partition is still assigned).
    fn current(&self) -> bool {
        true
    }
    /// Where it was read, as dead-letter headers (Kafka: its partition and offset).
    fn origin(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
}

/// A received message, decoded once on arrival (its aggregate picks its lane).
pub(crate) struct Received<D> {
    pub(crate) delivery: D,
    pub(crate) decoded: Result<Envelope, DecodeError>,
}

impl<D: Delivery> Received<D> {
    pub(crate) fn new(delivery: D) -> Self {
        let decoded = delivery.message().decode();
        Self { delivery, decoded }
    }
}

/// What handles one message: shared by the messages in flight.
pub(crate) struct Worker<S> {
    pub(crate) processor: Processor,
    pub(crate) config: ConsumerConfig,
    pub(crate) dead: S,
    /// `nats`, `rabbitmq`, `kafka`: the delivery span's messaging system.
    pub(crate) system: &'static str,
    /// The longest wait between tries while the database is down (less than the broker's
    /// redelivery deadline, which `keep` pushes back meanwhile).
    pub(crate) outage_wait: Duration,
}

impl<S: DeadLetters> Worker<S> {
    pub(crate) fn retry(&self) -> Retry<'_> {
        Retry {
            config: &self.config,
            dead: &self.dead,
        }
    }

    /// Takes one message to its end: applied, skipped, held (then its aggregate's due events
    /// applied), or dead-lettered, and acknowledged; or, when the runner stops during a
    /// database outage, released for redelivery.
    pub(crate) async fn handle<D: Delivery>(
        &self,
        received: Received<D>,
        shutdown: &CancellationToken,
    ) {
        let Received { delivery, decoded } = received;
        // An event that cannot be decoded, or reach its current version, never will.
        let event = match decoded
            .map_err(|e| e.to_string())
            .and_then(|e| self.processor.upcast(e).map_err(|e| e.to_string()))
        {
            Ok(event) => event,
            Err(reason) => {
                self.dead_letter_and_ack(delivery, &reason, 1, shutdown)
                    .await;
                return;
            }
        };
        let result = if delivery.redelivered() {
            self.hold_redelivered(&delivery, &event, shutdown).await
        } else {
            self.outage("deliver", &delivery, &event, shutdown, || {
                self.processor.deliver(delivery.message(), &event)
            })
            .await
        };
        match result {
            Ok(delivered) => {
                tracing::debug!(outcome = ?delivered.outcome, destination = %event.destination,
                    "processed");
                delivery.ack().await;
                if let Some(aggregate) = delivered.drain {
                    self.drain(&aggregate).await;
                }
            }
            Err(e) if e.is_infrastructure() => delivery.release().await,
            // Below its aggregate's start: its place, not its failure, so the start stays.
            Err(e) if e.is_below_start() => {
                self.dead_letter_and_ack(delivery, e.message(), 1, shutdown)
                    .await
            }
            Err(e) if e.is_permanent() => {
                self.give_up(delivery, &event, e.message(), shutdown).await
            }
            Err(e) => self.hold_failed(delivery, &event, e, shutdown).await,
        }
    }

    /// A delivery the broker made before: held at once (due now) and applied from there, so
    /// that its tries are counted in the database across restarts.
    async fn hold_redelivered<D: Delivery>(
        &self,
        delivery: &D,
        event: &Envelope,
        shutdown: &CancellationToken,
    ) -> Result<Delivered, HandlerError> {
        let hold = Hold {
            due_in: Some(Duration::ZERO),
            attempts: 0,
            last_error: None,
            reason: "delivered again by the broker: applied from the consumer's database",
        };
        let parked = self
            .outage("hold", delivery, event, shutdown, || {
                self.processor.park(delivery.message(), event, &hold)
            })
            .await?;
        if !parked {
            self.processor.count(Count::Duplicates);
            return Ok(Delivered {
                outcome: Outcome::Duplicate,
                drain: None,
            });
        }
        // An event without an aggregate is applied by the sweeper's next pass.
        Ok(Delivered {
            outcome: Outcome::Held,
            drain: Aggregate::of(event),
        })
    }

    /// The first attempt failed: the message is held for its next attempt (or dead-lettered,
    /// when it has no other) and acknowledged.
    async fn hold_failed<D: Delivery>(
        &self,
        delivery: D,
        event: &Envelope,
        error: HandlerError,
        shutdown: &CancellationToken,
    ) {
        if self.config.max_attempts <= 1 {
            self.give_up(delivery, event, error.message(), shutdown)
                .await;
            return;
        }
        let backoff = self.config.backoff(1);
        let reason = format!(
            "attempt 1 of {} failed; tried again after {}: {}",
            self.config.max_attempts,
            humantime::format_duration(Duration::from_millis(backoff.as_millis() as u64)),
            error.message()
        );
        tracing::warn!(%error, consumer = self.processor.name(), ?backoff,
            "handler failed; held for its next attempt");
        let hold = Hold {
            due_in: Some(backoff),
            attempts: 1,
            last_error: Some(error.message()),
            reason: &reason,
        };
        let parked = self
            .outage("hold", &delivery, event, shutdown, || {
                self.processor.park(delivery.message(), event, &hold)
            })
            .await;
        match parked {
            Ok(_) => delivery.ack().await,
            Err(e) if e.is_infrastructure() => delivery.release().await,
            Err(e) => {
                let reason = format!("{}; holding it failed: {e}", error.message());
                self.give_up(delivery, event, &reason, shutdown).await;
            }
        }
    }

    /// Runs `step` in the delivery's span, again while the database is down (keeping the
    /// delivery meanwhile), until it answers or the runner stops.
    async fn outage<D, T, F, Fut>(
        &self,
        what: &'static str,
        delivery: &D,
        event: &Envelope,
        shutdown: &CancellationToken,
        step: F,
    ) -> Result<T, HandlerError>
    where
        D: Delivery,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, HandlerError>>,
    {
        crate::outage::retrying(
            self.system,
            what,
            &self.processor,
            event,
            shutdown,
            self.outage_wait,
            || delivery.current(),
            || delivery.keep(),
            step,
        )
        .await
    }

    /// Applies `aggregate`'s held events that are due; a failure is logged (they stay due and
    /// the sweeper comes back to them).
    pub(crate) async fn drain(&self, aggregate: &Aggregate) {
        if let Err(error) = self.processor.drain(aggregate, &self.retry()).await {
            tracing::warn!(%error, consumer = self.processor.name(), aggregate_type = %aggregate.kind,
                aggregate_id = %aggregate.id, "held events not applied yet; the sweeper retries");
        }
    }

    /// Gives up a decoded delivery after its first attempt: its aggregate, if the gate orders
    /// it and has not started it, starts no later than its version (so that it waits for the
    /// replay instead of starting past it, as for a held event given up), then the message is
    /// dead-lettered and acknowledged. Released when the start cannot be recorded before the
    /// runner stops.
    async fn give_up<D: Delivery>(
        &self,
        delivery: D,
        event: &Envelope,
        reason: &str,
        shutdown: &CancellationToken,
    ) {
        let kept = self
            .outage("keep start", &delivery, event, shutdown, || {
                self.processor.keep_start(event)
            })
            .await;
        match kept {
            Err(e) if e.is_infrastructure() => delivery.release().await,
            // Recorded, or not the gate's to record: dead-letter it either way.
            _ => {
                self.dead_letter_and_ack(delivery, reason, 1, shutdown)
                    .await
            }
        }
    }

    /// Dead-letters the message and acknowledges it; while the dead letter cannot be stored,
    /// tries again after a backoff (keeping the delivery), until the runner stops (the
    /// message is then released).
    async fn dead_letter_and_ack<D: Delivery>(
        &self,
        delivery: D,
        reason: &str,
        attempts: u32,
        shutdown: &CancellationToken,
    ) {
        tracing::error!(reason, attempts, destination = %delivery.message().destination,
            consumer = self.processor.name(), "dead-lettering message");
        let origin = delivery.origin();
        let mut tries = 0;
        loop {
            match self
                .dead
                .dead_letter(delivery.message(), reason, attempts, &origin)
                .await
            {
                Ok(()) => {
                    self.processor.count(Count::DeadLettered);
                    delivery.ack().await;
                    return;
                }
                Err(e) => {
                    tries += 1;
                    tracing::warn!(error = %e, tries, "dead-letter publish failed; will retry");
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => {
                    delivery.release().await;
                    return;
                }
                () = tokio::time::sleep(self.config.backoff(tries)) => {}
            }
            if !delivery.current() {
                return;
            }
            delivery.keep().await;
        }
    }
}
