use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::BoxFuture;
use rumqttc::{
    v5::{
        mqttbytes::{
            v5::{Packet, PubAck, PubAckReason, PublishProperties},
            QoS,
        },
        AsyncClient, ConnectionError, Event, MqttOptions, StateError,
    },
    Outgoing, Transport,
};
use tokio::{
    sync::{mpsc, Mutex, Semaphore},
    task::JoinHandle,
};

use super::{config::Endpoint, MqttConfig};
use crate::{
    error::Error, publisher::check_payload_size, publisher::PublishError, publisher::Publisher,
    wire::message::Message,
};

/// What a connection's event loop reports.
type Report = Result<Event, PublishError>;

/// One MQTT connection and the task polling its event loop. At most one publish is in flight
/// on it, so the PUBACK that follows a publish is that publish's.
struct Connection {
    client: AsyncClient,
    events: mpsc::UnboundedReceiver<Report>,
    task: JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Publishes to an MQTT 5 broker with QoS 1. Connections are opened on demand (up to
/// `connections`), reused while healthy and dropped after any failure, so a late PUBACK or a
/// queued request from a failed attempt can never be taken for another message's ack.
pub struct MqttPublisher {
    config: MqttConfig,
    endpoint: Endpoint,
    idle: Mutex<Vec<Connection>>,
    slots: Semaphore,
    instance: u32,
    opened: AtomicU64,
}

impl MqttPublisher {
    /// Checks the configuration; connections open on the first publishes.
    pub fn connect(config: MqttConfig) -> Result<Self, Error> {
        config.validate().map_err(Error::Config)?;
        let endpoint = config.endpoint().map_err(Error::Config)?;
        tracing::info!(url = %crate::publishers::redact_url(&config.url), "mqtt publisher ready");
        Ok(Self {
            slots: Semaphore::new(config.connections),
            config,
            endpoint,
            idle: Mutex::new(Vec::new()),
            instance: rand::random(),
            opened: AtomicU64::new(0),
        })
    }

    fn options(&self) -> MqttOptions {
        let n = self.opened.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}-{:08x}-{n}", self.config.client_id, self.instance);
        let mut options = MqttOptions::new(id, &self.endpoint.host, self.endpoint.port);
        options
            .set_keep_alive(self.config.keep_alive)
            .set_clean_start(true)
            .set_connection_timeout(self.config.connect_timeout.as_secs().max(1));
        if let Some((user, password)) = &self.endpoint.credentials {
            options.set_credentials(user, password);
        }
        if self.endpoint.tls {
            // rumqttc's TLS uses the process's rustls provider: ring, as everywhere else here.
            let _ = rustls::crypto::ring::default_provider().install_default();
            options.set_transport(Transport::tls_with_default_config());
        }
        options
    }

    fn open(&self) -> Connection {
        let (client, mut event_loop) = AsyncClient::new(self.options(), 4);
        let (sender, events) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                let report = event_loop.poll().await.map_err(|e| connection_failure(&e));
                let failed = report.is_err();
                if sender.send(report).is_err() || failed {
                    break;
                }
            }
        });
        Connection {
            client,
            events,
            task,
        }
    }

    /// An idle healthy connection, or a new one.
    async fn connection(&self) -> Connection {
        while let Some(mut connection) = self.idle.lock().await.pop() {
            if healthy(&mut connection) {
                return connection;
            }
        }
        self.open()
    }

    fn properties(message: &Message) -> PublishProperties {
        let mut user_properties = Vec::with_capacity(message.headers.len() + 8);
        message.visit_headers(|name, value| user_properties.push((name.into(), value.into())));
        PublishProperties {
            content_type: Some(message.content_type.clone()),
            user_properties,
            ..Default::default()
        }
    }

    async fn send(
        &self,
        connection: &mut Connection,
        message: &Message,
    ) -> Result<(), PublishError> {
        connection
            .client
            .publish_with_properties(
                message.destination.as_str(),
                QoS::AtLeastOnce,
                self.config.retain,
                message.payload.clone(),
                Self::properties(message),
            )
            .await
            .map_err(|e| PublishError::transient(format!("mqtt: {e}")))?;
        let mut packet_id = None;
        while let Some(report) = connection.events.recv().await {
            match report? {
                Event::Outgoing(Outgoing::Publish(id)) => packet_id = Some(id),
                Event::Incoming(Packet::PubAck(ack)) if Some(ack.pkid) == packet_id => {
                    return classify(&ack, &message.destination, self.config.require_subscribers);
                }
                Event::Incoming(Packet::Disconnect(disconnect)) => {
                    return Err(PublishError::transient(format!(
                        "mqtt: the broker disconnected ({:?})",
                        disconnect.reason_code
                    )));
                }
                _ => {}
            }
        }
        Err(PublishError::transient("mqtt: connection closed"))
    }
}

/// Drains what an idle connection reported; false if it failed meanwhile.
fn healthy(connection: &mut Connection) -> bool {
    loop {
        match connection.events.try_recv() {
            Ok(Ok(_)) => continue,
            Ok(Err(_)) | Err(mpsc::error::TryRecvError::Disconnected) => return false,
            Err(mpsc::error::TryRecvError::Empty) => return !connection.task.is_finished(),
        }
    }
}

/// A connection-level failure. Everything is transient (broker down, refused credentials,
/// TLS) except a packet over the broker's maximum size, which no retry can fix.
fn connection_failure(error: &ConnectionError) -> PublishError {
    let text = format!("mqtt: {error}");
    match error {
        ConnectionError::MqttState(StateError::OutgoingPacketTooLarge { pkt_size, max }) => {
            PublishError::permanent(format!(
                "mqtt: message of {pkt_size} bytes is over the broker's maximum packet size of \
                 {max} bytes"
            ))
        }
        _ => PublishError::transient(text),
    }
}

/// Classifies a PUBACK: the one place MQTT outcomes become retry decisions.
fn classify(ack: &PubAck, topic: &str, require_subscribers: bool) -> Result<(), PublishError> {
    let reason = ack
        .properties
        .as_ref()
        .and_then(|p| p.reason_string.clone())
        .map(|r| format!(": {r}"))
        .unwrap_or_default();
    let text = format!("mqtt: PUBACK {:?} for topic {topic:?}{reason}", ack.reason);
    match ack.reason {
        PubAckReason::Success => Ok(()),
        PubAckReason::NoMatchingSubscribers if !require_subscribers => Ok(()),
        PubAckReason::NoMatchingSubscribers => Err(PublishError::permanent(format!(
            "{text} (no subscriber would receive it; set mqtt.require_subscribers = false to \
             accept that)"
        ))),
        PubAckReason::NotAuthorized
        | PubAckReason::TopicNameInvalid
        | PubAckReason::PayloadFormatInvalid => Err(PublishError::permanent(text)),
        PubAckReason::PacketIdentifierInUse
        | PubAckReason::QuotaExceeded
        | PubAckReason::UnspecifiedError
        | PubAckReason::ImplementationSpecificError => Err(PublishError::transient(text)),
    }
}

impl Publisher for MqttPublisher {
    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            check_payload_size(message, self.config.max_payload_bytes)?;
            self.check_destination(&message.destination)?;
            let _slot = self
                .slots
                .acquire()
                .await
                .map_err(|_| PublishError::transient("mqtt: publisher closed"))?;
            let mut connection = self.connection().await;
            // A new connection may first have to connect.
            let limit = self.config.ack_timeout + self.config.connect_timeout;
            let outcome = tokio::time::timeout(limit, self.send(&mut connection, message))
                .await
                .unwrap_or_else(|_| {
                    Err(PublishError::transient(format!(
                        "mqtt: no PUBACK within {limit:?}"
                    )))
                });
            // A connection is reused only after a clean exchange (a PUBACK, whatever its code).
            let answered = match &outcome {
                Ok(()) => true,
                Err(e) => e.message.starts_with("mqtt: PUBACK"),
            };
            if answered {
                self.idle.lock().await.push(connection);
            }
            outcome
        })
    }

    fn name(&self) -> &'static str {
        "mqtt"
    }

    fn max_payload_bytes(&self) -> usize {
        self.config.max_payload_bytes
    }

    fn check_destination(&self, destination: &str) -> Result<(), PublishError> {
        check_topic(destination, &self.config.topic_prefixes)
    }
}

/// Refuses, as permanent, a topic an event may not be published to: an illegal name, a `$`
/// topic (the broker's own, `$SYS/…`; MQTT 5 §4.7.2), or one outside `mqtt.topic_prefixes`
/// when that is set. The error names the topic and the rule.
fn check_topic(topic: &str, prefixes: &[String]) -> Result<(), PublishError> {
    if !is_valid_topic(topic) {
        return Err(PublishError::permanent(format!(
            "mqtt: {topic:?} is not a valid MQTT topic name (1 to 65535 bytes, no '+' or '#' \
             wildcards, no NUL)"
        )));
    }
    if topic.starts_with('$') {
        return Err(PublishError::permanent(format!(
            "mqtt: topic {topic:?} refused: topics starting with '$' are the broker's own \
             ($SYS/…)"
        )));
    }
    crate::wire::routing::check_prefixes("mqtt.topic_prefixes", topic, prefixes)
}

/// Whether `topic` can be published to: non-empty, at most 65,535 bytes, no wildcard and no
/// NUL character.
pub fn is_valid_topic(topic: &str) -> bool {
    !topic.is_empty() && topic.len() <= 65_535 && !topic.contains(['+', '#', '\0'])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(reason: PubAckReason) -> PubAck {
        PubAck {
            pkid: 1,
            reason,
            properties: None,
        }
    }

    #[test]
    fn classifies_pubacks() {
        assert!(classify(&ack(PubAckReason::Success), "t", true).is_ok());
        let dropped = classify(&ack(PubAckReason::NoMatchingSubscribers), "t", true).unwrap_err();
        assert!(!dropped.is_transient());
        assert!(dropped.message.contains("require_subscribers"));
        assert!(classify(&ack(PubAckReason::NoMatchingSubscribers), "t", false).is_ok());
        assert!(!classify(&ack(PubAckReason::NotAuthorized), "t", true)
            .unwrap_err()
            .is_transient());
        assert!(classify(&ack(PubAckReason::QuotaExceeded), "t", true)
            .unwrap_err()
            .is_transient());
    }

    #[test]
    fn broker_topics_and_wildcards_are_refused_naming_topic_and_rule() {
        check_topic("shop/orders/placed", &[]).unwrap();
        for (topic, rule) in [
            ("$SYS/broker/clients", "refused"),
            ("$share/g/t", "refused"),
            ("a/+/b", "not a valid"),
            ("a/#", "not a valid"),
            ("a\0b", "not a valid"),
            ("", "not a valid"),
        ] {
            let error = check_topic(topic, &[]).unwrap_err();
            assert!(!error.is_transient(), "{topic:?}");
            assert!(error.message.contains(rule), "{error}");
        }
        let prefixes = vec!["shop/".to_owned()];
        check_topic("shop/orders", &prefixes).unwrap();
        let error = check_topic("billing/paid", &prefixes).unwrap_err();
        assert!(error.message.contains("mqtt.topic_prefixes"), "{error}");
    }

    #[test]
    fn validates_topics() {
        assert!(is_valid_topic("order.OrderPlaced"));
        assert!(is_valid_topic("shop/orders/placed"));
        for bad in ["", "a/+/b", "a/#", "a\0b"] {
            assert!(!is_valid_topic(bad), "{bad:?}");
        }
    }
}
