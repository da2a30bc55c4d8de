//! One folder per broker, each behind its cargo feature.

#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "servicebus")]
pub mod servicebus;
#[cfg(feature = "webhook")]
pub mod webhook;
