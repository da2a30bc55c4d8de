//! Faults a run injects beyond killed processes: steps failing after their writes, timeout
//! steps failing, the database restarted.

use std::{
    collections::HashSet,
    fmt,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use futures::future::BoxFuture;
use outbox_consumer::{
    saga::{Saga, Start, Step, Trigger, TIMEOUT},
    Envelope, Handler, HandlerError,
};
use rand::{rngs::StdRng, Rng, SeedableRng};
use sqlx::PgConnection;

use super::{saga::OrderSaga, OrderState, Ticket};

/// Restarts the database the run uses (crash, start again, wait until it answers). A test
/// that owns its server passes one; the run calls it once, mid-flow.
#[derive(Clone)]
pub struct DatabaseRestart(pub Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>);

impl fmt::Debug for DatabaseRestart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DatabaseRestart")
    }
}

/// Fails a step after the inner handler did all its writes, before the commit, with
/// probability `rate`: the whole transaction rolls back, as if the process died there.
pub(super) struct FailingSteps {
    pub inner: Arc<dyn Handler>,
    pub rate: f64,
    pub seed: u64,
    pub calls: AtomicU64,
    pub failed: Arc<AtomicU64>,
}

impl Handler for FailingSteps {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            self.inner.handle(tx, event).await?;
            let call = self.calls.fetch_add(1, Ordering::Relaxed);
            let roll = StdRng::seed_from_u64(self.seed ^ call.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .random::<f64>();
            if roll < self.rate {
                self.failed.fetch_add(1, Ordering::Relaxed);
                return Err(HandlerError::new("injected crash after the step's writes"));
            }
            Ok(())
        })
    }

    fn upcasters(&self) -> outbox_consumer::Upcasters {
        self.inner.upcasters()
    }
}

/// The order saga whose timeout step fails the first time it runs for each order (when
/// `enabled`): the scheduler must put that instance off and go on with the others.
pub(super) struct FlakyTimeouts {
    pub saga: OrderSaga,
    pub enabled: bool,
    pub failed_once: Mutex<HashSet<i64>>,
    pub failures: Arc<AtomicU64>,
}

impl Saga for FlakyTimeouts {
    type State = OrderState;
    type Data = Ticket;

    fn name(&self) -> &str {
        self.saga.name()
    }

    fn reacts_to(&self) -> &[&str] {
        self.saga.reacts_to()
    }

    fn correlate(&self, event: &Envelope) -> Option<String> {
        self.saga.correlate(event)
    }

    fn start(&self, event: &Envelope) -> Result<Option<Start<OrderState, Ticket>>, HandlerError> {
        self.saga.start(event)
    }

    fn react(
        &self,
        state: &OrderState,
        order: &mut Ticket,
        on: &Trigger,
    ) -> Result<Step<OrderState>, HandlerError> {
        if self.enabled
            && on.name() == TIMEOUT
            && self
                .failed_once
                .lock()
                .expect("not poisoned")
                .insert(order.order_id)
        {
            self.failures.fetch_add(1, Ordering::Relaxed);
            return Err(HandlerError::new(format!(
                "injected failure of order {}'s timeout step",
                order.order_id
            )));
        }
        self.saga.react(state, order, on)
    }

    fn timeout(&self, state: &OrderState) -> Option<Duration> {
        self.saga.timeout(state)
    }

    fn is_final(&self, state: &OrderState) -> bool {
        self.saga.is_final(state)
    }
}
