//! What goes on the wire for one event: the event itself and its fan-out copies
//! ([`crate::fanout`]), each in the configured envelope ([`crate::cloudevents`]).
//!
//! [`Outgoing`] wraps the broker's publisher; the relay puts it in front of the publisher when
//! the configuration asks for either. Its `publish` returns `Ok` only after the broker
//! acknowledged **every** message of the event (the event first, then its copies in the
//! rule's order), so that the relay marks the row published only then (G3). The first failure
//! ends the attempt with that failure's class; the next attempt sends everything again, and
//! the broker's dedupe (each message has its own id) or the consumers' inbox absorbs what had
//! been acknowledged before.

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::{
    cloudevents::{self, Binding, Envelope},
    fanout::{self, Downcasts},
    routing::{render, RoutingConfig},
    Message, PublishError, Publisher, RelayConfig,
};

/// A publisher that sends each event as the configuration shapes it.
pub struct Outgoing {
    inner: Arc<dyn Publisher>,
    routing: RoutingConfig,
    downcasts: Downcasts,
    envelope: Envelope,
    binding: Binding,
    source: String,
}

impl Outgoing {
    /// `inner` as is when `config` neither fans out nor changes the envelope; else wrapped.
    pub fn wrap(
        inner: Arc<dyn Publisher>,
        config: &RelayConfig,
        downcasts: Downcasts,
    ) -> Arc<dyn Publisher> {
        if !config.routing.has_fan_out() && config.envelope == Envelope::Outbox {
            return inner;
        }
        Arc::new(Self {
            binding: Binding::of(inner.name()),
            inner,
            routing: config.routing.clone(),
            downcasts,
            envelope: config.envelope,
            source: config.cloudevents_source.clone(),
        })
    }

    /// Every message to send for `message`, in order, already in the envelope.
    fn messages(&self, message: &Message) -> Result<Vec<Message>, PublishError> {
        let plan = self
            .routing
            .fan_out(&message.aggregate_type, &message.event_type);
        let mut out = vec![message.clone()];
        out.extend(fanout::copies(message, plan, &self.downcasts)?);
        if self.envelope != Envelope::Outbox {
            for m in &mut out {
                let source = render(
                    &self.source,
                    &m.aggregate_type,
                    &m.event_type,
                    m.schema_version,
                );
                *m = cloudevents::encode(m, self.envelope, self.binding, &source);
            }
        }
        Ok(out)
    }
}

impl Publisher for Outgoing {
    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            let messages = self.messages(message)?;
            // Check them all first: a copy that can never go out must not leave the others
            // published again and again.
            for m in &messages {
                self.inner.check_destination(&m.destination)?;
                crate::check_payload_size(m, self.inner.max_payload_bytes())?;
            }
            for m in &messages {
                self.inner.publish(m).await?;
            }
            Ok(())
        })
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn max_payload_bytes(&self) -> usize {
        self.inner.max_payload_bytes()
    }

    fn check_destination(&self, destination: &str) -> Result<(), PublishError> {
        self.inner.check_destination(destination)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;

    use super::*;
    use crate::{fanout::FanOutCopy, routing::RouteRule};

    /// Records what was published; fails messages to the listed destinations.
    struct Recorder {
        sent: Mutex<Vec<Message>>,
        fail: Vec<&'static str>,
    }

    impl Publisher for Recorder {
        fn publish<'a>(&'a self, m: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
            Box::pin(async move {
                if self.fail.contains(&m.destination.as_str()) {
                    return Err(PublishError::transient("broker down"));
                }
                self.sent.lock().unwrap().push(m.clone());
                Ok(())
            })
        }
        fn name(&self) -> &'static str {
            "nats"
        }
        fn max_payload_bytes(&self) -> usize {
            1024
        }
    }

    fn config(envelope: Envelope) -> RelayConfig {
        let mut config = RelayConfig {
            envelope,
            ..Default::default()
        };
        config.routing.rules.push(RouteRule {
            event_type: Some("OrderPlaced".into()),
            aggregate_type: None,
            destination: "orders.v{schema_version}".into(),
            fan_out: vec![FanOutCopy {
                destination: "orders.v{schema_version}".into(),
                schema_version: 1,
                keep_fields: None,
                drop_fields: vec!["region".into()],
            }],
        });
        config
    }

    fn v2() -> Message {
        Message {
            destination: "orders.v2".into(),
            payload: serde_json::to_vec(&json!({"total": 1, "region": "eu"}))
                .unwrap()
                .into(),
            ..crate::message::sample(1, "o-1")
        }
    }

    fn recorder(fail: Vec<&'static str>) -> Arc<Recorder> {
        Arc::new(Recorder {
            sent: Mutex::new(Vec::new()),
            fail,
        })
    }

    #[tokio::test]
    async fn sends_the_event_then_its_copies_and_succeeds_only_when_all_are_acked() {
        let inner = recorder(vec![]);
        let outgoing = Outgoing::wrap(inner.clone(), &config(Envelope::Outbox), Downcasts::new());
        outgoing.publish(&v2()).await.unwrap();
        let sent = inner.sent.lock().unwrap().clone();
        let destinations: Vec<_> = sent.iter().map(|m| m.destination.as_str()).collect();
        assert_eq!(destinations, ["orders.v2", "orders.v1"]);

        let failing = recorder(vec!["orders.v1"]);
        let outgoing = Outgoing::wrap(failing.clone(), &config(Envelope::Outbox), Downcasts::new());
        let err = outgoing.publish(&v2()).await.unwrap_err();
        assert!(err.is_transient());
    }

    #[tokio::test]
    async fn copies_go_out_in_the_envelope_too() {
        let inner = recorder(vec![]);
        let config = config(Envelope::CloudeventsBinary);
        let outgoing = Outgoing::wrap(inner.clone(), &config, Downcasts::new());
        outgoing.publish(&v2()).await.unwrap();
        let sent = inner.sent.lock().unwrap().clone();
        let versions: Vec<_> = sent
            .iter()
            .map(|m| {
                let h: std::collections::HashMap<_, _> = m.broker_headers().into_iter().collect();
                (h["ce-schemaversion"].clone(), h["ce-source"].clone())
            })
            .collect();
        assert_eq!(
            versions,
            [
                ("2".to_owned(), "/outbox/order".to_owned()),
                ("1".to_owned(), "/outbox/order".to_owned())
            ]
        );
    }

    #[tokio::test]
    async fn nothing_configured_means_the_publisher_itself() {
        let inner: Arc<dyn Publisher> = recorder(vec![]);
        let wrapped = Outgoing::wrap(inner.clone(), &RelayConfig::default(), Downcasts::new());
        assert!(Arc::ptr_eq(&inner, &wrapped));
    }
}
