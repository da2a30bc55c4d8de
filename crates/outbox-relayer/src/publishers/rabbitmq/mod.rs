//! RabbitMQ (AMQP 0-9-1, lapin): publisher confirms, persistent messages, `message_id` = event
//! id, mandatory publishing with returns treated as permanent (unroutable) failures.

// Parts only its publisher uses are dead in a build without it.
#[cfg_attr(not(feature = "rabbitmq"), allow(dead_code))]
mod config;
#[cfg(feature = "rabbitmq")]
mod probe;
#[cfg(feature = "rabbitmq")]
mod publisher;

pub use config::RabbitMqConfig;
#[cfg(feature = "rabbitmq")]
pub use probe::probe;
#[cfg(feature = "rabbitmq")]
pub use publisher::RabbitMqPublisher;
