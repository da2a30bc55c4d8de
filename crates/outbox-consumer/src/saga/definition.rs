//! What a saga is: a typed state machine written as plain Rust.

use std::{fmt::Debug, time::Duration};

use outbox::Event;
use serde::{de::DeserializeOwned, Serialize};

use crate::{Envelope, HandlerError};

/// The trigger name a saga sees when the deadline of its current state passes.
pub const TIMEOUT: &str = "saga.timeout";

/// An orchestrated saga: states, the events it reacts to, and what each transition emits.
///
/// One instance exists per correlation id (an order id, say). Each event the instance receives
/// is one *step*, run by [`SagaHandler`](super::SagaHandler) as one database transaction: the
/// inbox check, loading and locking the instance, [`Saga::react`], saving the new state and
/// data, and enqueueing what the step emits into the outbox. A crash at any point leaves either
/// all of that or none of it, so a step is never lost and never applied twice.
///
/// The whole machine reads as one `match` in [`Saga::react`]:
///
/// ```
/// use outbox::Event;
/// use outbox_consumer::saga::{Saga, Start, Step, Trigger, TIMEOUT};
/// use outbox_consumer::{Envelope, HandlerError};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
/// enum State { AwaitingPayment, Paid, Cancelled }
///
/// #[derive(Serialize, Deserialize)]
/// struct Order { id: String }
///
/// struct Checkout;
///
/// impl Saga for Checkout {
///     type State = State;
///     type Data = Order;
///
///     fn name(&self) -> &str { "checkout" }
///     fn reacts_to(&self) -> &[&str] { &["OrderPlaced", "PaymentTaken"] }
///     fn correlate(&self, event: &Envelope) -> Option<String> { event.aggregate_id.clone() }
///     fn start(&self, event: &Envelope) -> Result<Option<Start<State, Order>>, HandlerError> {
///         if event.event_type != "OrderPlaced" {
///             return Ok(None);
///         }
///         let id = event.aggregate_id.clone().ok_or_else(|| HandlerError::new("no order id"))?;
///         let take_payment = Event::new("order", &id, "TakePayment");
///         Ok(Some(Start::new(State::AwaitingPayment, Order { id }).emit(take_payment)))
///     }
///     fn react(&self, state: &State, order: &mut Order, on: &Trigger)
///         -> Result<Step<State>, HandlerError> {
///         Ok(match (state, on.name()) {
///             (State::AwaitingPayment, "PaymentTaken") => Step::to(State::Paid),
///             (State::AwaitingPayment, TIMEOUT) => Step::to(State::Cancelled)
///                 .emit(Event::new("order", &order.id, "CancelOrder")),
///             // Placed twice (a producer's retry with a new id): the payment is taken once.
///             (_, "OrderPlaced") => Step::ignore("the order is placed already"),
///             _ => Step::unexpected("not expected in this state"),
///         })
///     }
///     fn timeout(&self, state: &State) -> Option<std::time::Duration> {
///         (*state == State::AwaitingPayment).then(|| std::time::Duration::from_secs(900))
///     }
///     fn is_final(&self, state: &State) -> bool { matches!(state, State::Paid | State::Cancelled) }
/// }
/// ```
pub trait Saga: Send + Sync + 'static {
    /// The states. Stored by their serde name, so unit enum variants read well in the table
    /// and in `outbox sagas show`.
    type State: Clone + Debug + PartialEq + Serialize + DeserializeOwned + Send + Sync;
    /// What the instance remembers between steps, stored as JSON.
    type Data: Serialize + DeserializeOwned + Send + Sync;

    /// The saga type, the first half of an instance's key (`order-fulfilment`).
    fn name(&self) -> &str;

    /// The event types this saga handles. Others are not addressed to it and are skipped
    /// without a trace (the subscription's filter in effect); every one listed here is
    /// applied, recorded as ignored, or retried and then dead-lettered.
    fn reacts_to(&self) -> &[&str];

    /// The instance an event belongs to, or `None` when the event carries no correlation id
    /// (recorded as `uncorrelated`).
    fn correlate(&self, event: &Envelope) -> Option<String>;

    /// The first step of a new instance when `event` starts one: its state, its data and what
    /// it emits. Called only when no instance exists for the correlation id, so the starting
    /// arm runs once per instance: a second starting event (a new event id) goes to
    /// [`Saga::react`] like any other, where it is usually [`Step::ignore`]d.
    ///
    /// `Ok(None)`: the event does not start an instance. It may have arrived before the one
    /// that does (another aggregate's stream, a concurrent reply), so it is rolled back and
    /// retried with backoff, then dead-lettered with the reason, never dropped. `Err` rolls
    /// the step back the same way.
    fn start(&self, event: &Envelope) -> Result<Option<StartOf<Self>>, HandlerError>;

    /// The transition for `trigger` in `state` of an existing instance: the next state, what
    /// to emit, or why the event is ignored or not expected. Called for final states too, so
    /// a late reply can still be compensated. Returning `Err` (or [`Step::unexpected`] for an
    /// event) rolls the step back: the event is retried, then dead-lettered.
    fn react(
        &self,
        state: &Self::State,
        data: &mut Self::Data,
        trigger: &Trigger<'_>,
    ) -> Result<Step<Self::State>, HandlerError>;

    /// How long the instance may stay in `state` before [`TIMEOUT`] fires (`None`: no limit).
    fn timeout(&self, _state: &Self::State) -> Option<Duration> {
        None
    }

    /// Whether `state` ends the saga: it gets no deadline and counts as finished.
    fn is_final(&self, state: &Self::State) -> bool;
}

/// What drives a step: an event, or the current state's deadline passing.
#[derive(Clone, Copy, Debug)]
pub enum Trigger<'a> {
    /// An event received through the inbox.
    Event(&'a Envelope),
    /// The deadline of the state the instance is in passed.
    Timeout,
}

impl Trigger<'_> {
    /// The event type, or [`TIMEOUT`].
    pub fn name(&self) -> &str {
        match self {
            Trigger::Event(e) => &e.event_type,
            Trigger::Timeout => TIMEOUT,
        }
    }

    /// The event, if this is one.
    pub fn event(&self) -> Option<&Envelope> {
        match self {
            Trigger::Event(e) => Some(e),
            Trigger::Timeout => None,
        }
    }

    /// The event's JSON payload; an error for a timeout or a payload of another shape.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, HandlerError> {
        match self {
            Trigger::Event(e) => Ok(e.json()?),
            Trigger::Timeout => Err(HandlerError::new("a timeout carries no payload")),
        }
    }
}

/// The result of [`Saga::react`].
#[derive(Debug)]
pub struct Step<S> {
    pub(crate) change: Change<S>,
    pub(crate) emit: Vec<Event>,
}

#[derive(Debug)]
pub(crate) enum Change<S> {
    To(S),
    Stay,
    Ignore(String),
    Unexpected(String),
}

/// The [`Start`] of saga `S`.
pub type StartOf<S> = Start<<S as Saga>::State, <S as Saga>::Data>;

/// The first step of an instance, returned by [`Saga::start`]: its state (whose deadline
/// starts now), its data, and what it emits.
#[derive(Debug)]
pub struct Start<S, D> {
    pub(crate) state: S,
    pub(crate) data: D,
    pub(crate) emit: Vec<Event>,
}

impl<S, D> Start<S, D> {
    /// A new instance in `state` with `data`.
    pub fn new(state: S, data: D) -> Self {
        Self {
            state,
            data,
            emit: Vec::new(),
        }
    }

    /// Enqueue `event` into the outbox with the instance's creation (headers as
    /// [`Step::emit`]).
    pub fn emit(mut self, event: Event) -> Self {
        self.emit.push(event);
        self
    }
}

impl<S> Step<S> {
    /// Move to `state` (its deadline starts now).
    pub fn to(state: S) -> Self {
        Self {
            change: Change::To(state),
            emit: Vec::new(),
        }
    }

    /// Keep the current state and its deadline.
    pub fn stay() -> Self {
        Self {
            change: Change::Stay,
            emit: Vec::new(),
        }
    }

    /// The event is known and moot here (a second start, a late reply already compensated):
    /// state, data and deadline stay as they were, and the step is recorded with `reason` as
    /// `ignored`. What the step emits is still enqueued (a refund for a late payment, say).
    pub fn ignore(reason: impl Into<String>) -> Self {
        Self {
            change: Change::Ignore(reason.into()),
            emit: Vec::new(),
        }
    }

    /// The event is not expected in this state, perhaps not *yet* (it overtook the event
    /// that leads to the state that expects it): the step is rolled back, nothing changes,
    /// and the event is retried with backoff, then dead-lettered with `reason` (replayable
    /// once the saga is fixed). For a [`TIMEOUT`] trigger the step is recorded as
    /// `unexpected` and the deadline cleared instead (a timeout is not redelivered). Logged
    /// as a warning either way.
    pub fn unexpected(reason: impl Into<String>) -> Self {
        Self {
            change: Change::Unexpected(reason.into()),
            emit: Vec::new(),
        }
    }

    /// Enqueue `event` into the outbox in the step's transaction. The saga adds the headers
    /// `correlation-id` (the instance), `causation-id` (the triggering event) and `saga-type`
    /// where the event does not set them.
    pub fn emit(mut self, event: Event) -> Self {
        self.emit.push(event);
        self
    }
}
