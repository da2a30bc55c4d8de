//! The source documents' order saga, both ways, on PostgreSQL and a real broker:
//! CreateOrder → ReserveInventory → ProcessPayment → ShipOrder, where a declined payment is
//! compensated (ReleaseInventory + CancelOrder) and an inventory service that does not answer in
//! time gets the order cancelled.
//!
//! - [`Mode::Orchestrated`]: the [`OrderSaga`] state machine sends commands and reacts to
//!   replies; each step is one transaction (inbox + transition + state + commands).
//! - [`Mode::Choreographed`]: the services react to each other's events through the inbox and
//!   emit through the outbox; the order service's sweeper gives up on overdue orders.
//!
//! [`run`] places orders, injects crashes (relays and consumers killed abruptly, steps failing
//! after their writes, the saga's timeout steps failing once, the database restarted when the
//! caller owns it) and checks the end state from the services' own tables.

mod faults;
mod report;
mod run;
mod saga;
mod services;
mod ticket;

pub use faults::DatabaseRestart;
pub use report::Report;
pub use run::{run, Scenario};
pub use saga::{OrderSaga, OrderState};
pub use services::{cancel_overdue, Service, ServiceHandler};
pub use ticket::{install, place_order, Mode, Ticket, BACKORDER_SKU, DECLINED_CARD, STOCKED};
