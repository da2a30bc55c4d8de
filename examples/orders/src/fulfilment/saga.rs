//! The orchestrator: the order saga as a state machine. The whole process reads in
//! [`OrderSaga::react`].

use std::time::Duration;

use outbox_consumer::{
    saga::{Saga, Start, Step, Trigger, TIMEOUT},
    Envelope, HandlerError,
};
use serde::{Deserialize, Serialize};

use super::ticket::Ticket;

/// Where an order's saga stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OrderState {
    /// `ReserveInventory` sent; waiting for the inventory service (with a deadline).
    AwaitingInventory,
    /// `ProcessPayment` sent.
    AwaitingPayment,
    /// `ShipOrder` sent.
    AwaitingShipment,
    /// Shipped and completed.
    Completed,
    /// Cancelled, with whatever compensation was needed sent.
    Cancelled,
}

/// CreateOrder → ReserveInventory → ProcessPayment → ShipOrder. A failed payment compensates
/// with ReleaseInventory + CancelOrder; an inventory service that does not answer in time
/// cancels the order the same way.
pub struct OrderSaga {
    /// How long to wait for the inventory's answer.
    pub inventory_timeout: Duration,
}

impl Saga for OrderSaga {
    type State = OrderState;
    type Data = Ticket;

    fn name(&self) -> &str {
        "order"
    }

    fn reacts_to(&self) -> &[&str] {
        &[
            "OrderCreated",
            "InventoryReserved",
            "InventoryRejected",
            "PaymentSucceeded",
            "PaymentFailed",
            "OrderShipped",
        ]
    }

    fn correlate(&self, event: &Envelope) -> Option<String> {
        event.aggregate_id.clone()
    }

    fn start(&self, event: &Envelope) -> Result<Option<Start<OrderState, Ticket>>, HandlerError> {
        if event.event_type != "OrderCreated" {
            return Ok(None);
        }
        let ticket: Ticket = event.json()?;
        let reserve = ticket.event("ReserveInventory");
        Ok(Some(
            Start::new(OrderState::AwaitingInventory, ticket).emit(reserve),
        ))
    }

    fn react(
        &self,
        state: &OrderState,
        order: &mut Ticket,
        on: &Trigger,
    ) -> Result<Step<OrderState>, HandlerError> {
        use OrderState::*;
        let send = |event_type: &str| order.event(event_type);
        Ok(match (state, on.name()) {
            (AwaitingInventory, "InventoryReserved") => {
                Step::to(AwaitingPayment).emit(send("ProcessPayment"))
            }
            (AwaitingInventory, "InventoryRejected") => {
                Step::to(Cancelled).emit(send("CancelOrder"))
            }
            (AwaitingInventory, TIMEOUT) | (AwaitingPayment, "PaymentFailed") => {
                Step::to(Cancelled)
                    .emit(send("ReleaseInventory"))
                    .emit(send("CancelOrder"))
            }
            (AwaitingPayment, "PaymentSucceeded") => {
                Step::to(AwaitingShipment).emit(send("ShipOrder"))
            }
            (AwaitingShipment, "OrderShipped") => Step::to(Completed).emit(send("CompleteOrder")),
            (_, "OrderCreated") => Step::ignore("the saga has started already"),
            (Cancelled, "InventoryReserved" | "InventoryRejected") => {
                Step::ignore("late inventory answer: the release sent on cancellation undoes it")
            }
            (state, trigger) => Step::unexpected(format!("{trigger} in {state:?}")),
        })
    }

    fn timeout(&self, state: &OrderState) -> Option<Duration> {
        (*state == OrderState::AwaitingInventory).then_some(self.inventory_timeout)
    }

    fn is_final(&self, state: &OrderState) -> bool {
        matches!(state, OrderState::Completed | OrderState::Cancelled)
    }
}
