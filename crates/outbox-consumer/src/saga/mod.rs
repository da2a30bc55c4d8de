//! Orchestrated sagas on the outbox's guarantees.
//!
//! A saga coordinates a process across services (create order → reserve inventory → take
//! payment → ship; compensate when a step fails). Here an instance is a row in the `sagas`
//! table (type, correlation id, state, data as JSON, version, deadline) and every step is **one
//! local transaction**: the inbox check, loading and locking the instance, the transition, the
//! new state and the commands it emits into the outbox. A crash at any point leaves all of it or
//! none, so no step is lost and none is applied twice; the outbox relay then delivers what the
//! step emitted at least once, in order per aggregate.
//!
//! - Define the machine with [`Saga`]: one `match` over (state, trigger) in [`Saga::react`].
//! - Run it with [`SagaHandler`] inside a [`Processor`](crate::Processor).
//! - Fire deadlines with [`SagaTimeouts`]: the [`TIMEOUT`] trigger goes through the same step.
//! - Nothing a saga reacts to is dropped silently: an event for no instance yet, or one
//!   [`Saga::react`] says is [`Step::unexpected`], is rolled back and retried, then
//!   dead-lettered with the reason (it may have overtaken the event it depends on); an event
//!   the saga [`Step::ignore`]s, or that carries no correlation id, is recorded in
//!   `saga_steps` (`ignored`, `uncorrelated`) and logged; `outbox sagas list | show` reports
//!   them.

mod definition;
mod handler;
pub mod inspect;
mod runtime;
mod timeouts;

pub use definition::{Saga, Start, StartOf, Step, Trigger, TIMEOUT};
pub use handler::SagaHandler;
pub use runtime::Outcome;
pub use timeouts::{SagaTimeouts, TIMEOUT_RETRY_FIRST, TIMEOUT_RETRY_LONGEST};
