//! AMQP 1.0: Azure Service Bus, or any AMQP 1.0 broker (RabbitMQ's `rabbitmq_amqp1_0` plugin,
//! ActiveMQ Artemis, Qpid), with fe2o3-amqp.
//!
//! # Guarantees
//!
//! * **Ack.** Every message is sent unsettled on a sender link and `publish` returns `Ok` only
//!   when the broker settles it with `accepted` (Service Bus accepts once the message is
//!   stored). `rejected` is permanent and carries the broker's error condition and description
//!   (except throttling conditions such as `com.microsoft:server-busy`, which are transient);
//!   `released`, `modified`, a detached link, a lost connection and a missing disposition after
//!   `ack_timeout` are transient. A sender the broker refuses to attach because its address
//!   does not exist (`amqp:not-found`: no such queue, topic or exchange) is permanent. The
//!   decision is made in one function, `classify`.
//! * **Ids and order.** `message-id` is the event id: Service Bus duplicate detection (when
//!   enabled on the entity) drops a second copy within its window. `group-id` is the aggregate
//!   id: Service Bus delivers a session-enabled entity's messages of one session id in order,
//!   to one consumer at a time. The relay publishes one aggregate's events one at a time.
//! * **Body and metadata.** One `Data` section holds the payload bytes unchanged; every relay
//!   and writer header is an application property (string); `subject` is the event type,
//!   `content-type` and `creation-time` are set; the message is durable.
//! * **Connections.** One connection; per target address one session with one sender link,
//!   begun and attached on first use and cached (a broker that ends a session over a bad
//!   address, as RabbitMQ does for a missing exchange, breaks no other address). A lost
//!   connection is replaced on the next publish (lazily, within `connect_timeout`), a broken
//!   link is re-attached. Publishes to one address overlap: the link is locked only while a
//!   transfer is handed over, and each caller awaits its own disposition.
//!
//! Authentication is SASL PLAIN with the shared access key name and key (Service Bus accepts
//! it), or ANONYMOUS for a generic broker without credentials. CBS token authentication
//! (SAS tokens, Entra ID) is not implemented.

// Parts only its publisher uses are dead in a build without it.
#[cfg_attr(not(feature = "servicebus"), allow(dead_code))]
mod config;
#[cfg(feature = "servicebus")]
mod publisher;

pub use config::{ServiceBusConfig, GENERIC_ADDRESS, SERVICE_BUS_ADDRESS};
#[cfg(feature = "servicebus")]
pub use publisher::ServiceBusPublisher;
