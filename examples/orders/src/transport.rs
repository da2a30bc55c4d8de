//! How events travel from the relay to the consumers: the scenario's own webhook endpoint (any
//! database), or NATS JetStream / RabbitMQ with `outbox-consumer`'s runners (PostgreSQL).

#[cfg(feature = "webhook")]
use std::sync::atomic::Ordering;
use std::sync::Arc;

use outbox_relayer::Publisher;
#[cfg(feature = "brokers")]
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{shop::Storage, summary::Deliveries, BoxError, Scenario};

/// The running transport.
pub(crate) enum Transport {
    /// The relay's webhook publisher POSTs to the consumers' loopback endpoint.
    #[cfg(feature = "webhook")]
    Webhooks(crate::webhooks::Receiver),
    /// A broker, and one runner per consumer.
    #[cfg(feature = "brokers")]
    Broker {
        broker: Box<crate::brokers::Broker>,
        consumers: Vec<JoinHandle<()>>,
    },
}

impl Transport {
    /// Refuses, before anything is created, a scenario this build or the consumer runners
    /// cannot play.
    pub(crate) fn check(s: &Scenario) -> Result<(), BoxError> {
        match &s.broker_url {
            None if cfg!(feature = "webhook") => Ok(()),
            None => Err(
                "this build has no webhook transport (cargo feature `webhook`): \
                         give a broker URL"
                    .into(),
            ),
            Some(_) if !cfg!(feature = "brokers") => Err(
                "this build has no broker transport (cargo feature `brokers`): leave out the \
                 broker URL to run on webhooks"
                    .into(),
            ),
            Some(_) => match s.database_url.as_deref() {
                Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                    Ok(())
                }
                _ => Err(
                    "--broker-url: through a broker the consumers are outbox-consumer's runners, \
                     which keep their inbox on PostgreSQL only: give a postgres:// database URL, \
                     or leave out --broker-url to run this database on webhooks"
                        .into(),
                ),
            },
        }
    }

    /// Sets the transport up and starts the consumers; they stop on `stop`.
    pub(crate) async fn start(
        s: &Scenario,
        storage: &Arc<Storage>,
        stop: CancellationToken,
    ) -> Result<Self, BoxError> {
        match &s.broker_url {
            #[cfg(feature = "webhook")]
            None => Ok(Self::Webhooks(
                crate::webhooks::Receiver::start(storage.clone(), s.drop_ack_every, stop).await?,
            )),
            #[cfg(feature = "brokers")]
            Some(url) => {
                let pool = storage
                    .postgres()
                    .ok_or("the broker transport needs PostgreSQL")?;
                let broker =
                    crate::brokers::Broker::set_up(url, storage.tables(), crate::shop::CONSUMERS)
                        .await?;
                let consumers = broker
                    .start_consumers(pool, storage.tables(), storage.statements(), stop)
                    .await?;
                Ok(Self::Broker {
                    broker: Box::new(broker),
                    consumers,
                })
            }
            #[allow(unreachable_patterns)]
            _ => Err("this build lacks the transport asked for".into()),
        }
    }

    /// The transport in words.
    pub(crate) fn describe(&self) -> String {
        match self {
            #[cfg(feature = "webhook")]
            Self::Webhooks(_) => "webhooks over loopback HTTP".into(),
            #[cfg(feature = "brokers")]
            Self::Broker { broker, .. } => broker.describe(),
        }
    }

    /// A publisher for a new relay.
    pub(crate) async fn publisher(&self) -> Result<Arc<dyn Publisher>, BoxError> {
        match self {
            #[cfg(feature = "webhook")]
            Self::Webhooks(receiver) => receiver.publisher(),
            #[cfg(feature = "brokers")]
            Self::Broker { broker, .. } => broker.publisher().await,
        }
    }

    /// Deliveries the inbox discarded as duplicates so far, where the transport counts them.
    pub(crate) fn duplicates(&self) -> u64 {
        match self {
            #[cfg(feature = "webhook")]
            Self::Webhooks(receiver) => receiver.counters.duplicates.load(Ordering::Relaxed),
            #[cfg(feature = "brokers")]
            Self::Broker { .. } => 0,
        }
    }

    /// Waits for the consumers (stopped by the scenario's token), removes what the broker was
    /// given, and returns what the webhook endpoint saw.
    pub(crate) async fn finish(self) -> Option<Deliveries> {
        match self {
            #[cfg(feature = "webhook")]
            Self::Webhooks(receiver) => Some(receiver.counters.deliveries()),
            #[cfg(feature = "brokers")]
            Self::Broker { broker, consumers } => {
                for consumer in consumers {
                    let _ = consumer.await;
                }
                broker.clean_up().await;
                None
            }
        }
    }
}
