//! RabbitMQ (AMQP 0-9-1, lapin): publisher confirms, persistent messages, `message_id` = event
//! id, mandatory publishing with returns treated as permanent (unroutable) failures.

mod config;
mod publisher;

pub use config::RabbitMqConfig;
pub use publisher::RabbitMqPublisher;
