//! What goes on the wire for one event: the event itself and its fan-out copies
//! ([`crate::wire::fanout`]), each in the configured envelope ([`crate::wire::cloudevents`]).
//!
//! [`Outgoing`] wraps the broker's publisher; the relay puts it in front of the publisher when
//! the configuration asks for either. Its `publish` returns `Ok` only after the broker
//! acknowledged **every** message of the event (the event first, then its copies in the
//! rule's order), so that the relay marks the row published only then (G3). The first
//! transient failure ends the attempt; the next attempt sends everything again, and the
//! broker's dedupe (each message has its own id) or the consumers' inbox absorbs what had
//! been acknowledged before. A failure of the event's own message ends it with its class.
//!
//! A copy the broker refuses for good (no stream, queue or topic takes its destination, or it
//! rejects it) after the event itself was acknowledged is dropped: logged with the reason and
//! counted in `outbox_fanout_copies_dropped_total`, and the event is published. Failing the
//! event instead would dead-letter every event of its type, and park their aggregates, over a
//! destination nobody can read from, although each was delivered where it belongs.

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::{
    config::RelayConfig,
    publisher::PublishError,
    publisher::Publisher,
    telemetry::{DestinationLabel, Metrics},
    wire::cloudevents::{self, Binding, Envelope},
    wire::fanout::{self, Downcasts},
    wire::message::Message,
    wire::routing::{render, RoutingConfig},
};

/// A publisher that sends each event as the configuration shapes it.
pub struct Outgoing {
    inner: Arc<dyn Publisher>,
    routing: RoutingConfig,
    downcasts: Downcasts,
    envelope: Envelope,
    binding: Binding,
    source: String,
    metrics: Arc<Metrics>,
}

impl Outgoing {
    /// `inner` as is when `config` neither fans out nor changes the envelope; else wrapped.
    /// Dropped copies are counted in `metrics`.
    pub fn wrap(
        inner: Arc<dyn Publisher>,
        config: &RelayConfig,
        downcasts: Downcasts,
        metrics: Arc<Metrics>,
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
            metrics,
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

impl Outgoing {
    /// Records a copy refused for good after its event was delivered.
    fn dropped(&self, event: &Message, copy: &Message, error: &PublishError) {
        tracing::error!(event_id = %event.event_id, event_type = %event.event_type,
            copy_destination = %copy.destination, copy_schema_version = copy.schema_version,
            error = %error.message,
            "fan-out copy refused for good: dropped; the event itself was delivered");
        let destination = self.metrics.destination_label(&copy.destination);
        self.metrics
            .fanout_copies_dropped
            .get_or_create(&DestinationLabel { destination })
            .inc();
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
                crate::publisher::check_payload_size(m, self.inner.max_payload_bytes())?;
            }
            let (event, copies) = messages.split_first().expect("the event comes first");
            self.inner.publish(event).await?;
            for copy in copies {
                match self.inner.publish(copy).await {
                    Ok(()) => {}
                    Err(e) if e.is_transient() => return Err(e),
                    Err(e) => self.dropped(message, copy, &e),
                }
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
    use crate::{wire::fanout::FanOutCopy, wire::routing::RouteRule};

    /// Records what was published; fails messages to the listed destinations (transiently,
    /// or for good when `refuse` is set).
    struct Recorder {
        sent: Mutex<Vec<Message>>,
        fail: Vec<&'static str>,
        refuse: bool,
    }

    impl Publisher for Recorder {
        fn publish<'a>(&'a self, m: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
            Box::pin(async move {
                if self.fail.contains(&m.destination.as_str()) {
                    if self.refuse {
                        return Err(PublishError::permanent("no stream captures it"));
                    }
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
            ..crate::wire::message::sample(1, "o-1")
        }
    }

    fn recorder(fail: Vec<&'static str>) -> Arc<Recorder> {
        Arc::new(Recorder {
            sent: Mutex::new(Vec::new()),
            fail,
            refuse: false,
        })
    }

    fn wrap(inner: Arc<Recorder>, config: &RelayConfig) -> Arc<dyn Publisher> {
        Outgoing::wrap(inner, config, Downcasts::new(), Arc::new(Metrics::new()))
    }

    #[tokio::test]
    async fn sends_the_event_then_its_copies_and_succeeds_only_when_all_are_acked() {
        let inner = recorder(vec![]);
        let outgoing = wrap(inner.clone(), &config(Envelope::Outbox));
        outgoing.publish(&v2()).await.unwrap();
        let sent = inner.sent.lock().unwrap().clone();
        let destinations: Vec<_> = sent.iter().map(|m| m.destination.as_str()).collect();
        assert_eq!(destinations, ["orders.v2", "orders.v1"]);

        let failing = recorder(vec!["orders.v1"]);
        let outgoing = wrap(failing.clone(), &config(Envelope::Outbox));
        let err = outgoing.publish(&v2()).await.unwrap_err();
        assert!(err.is_transient());
    }

    #[tokio::test]
    async fn copies_go_out_in_the_envelope_too() {
        let inner = recorder(vec![]);
        let config = config(Envelope::CloudeventsBinary);
        let outgoing = wrap(inner.clone(), &config);
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
        let wrapped = Outgoing::wrap(
            inner.clone(),
            &RelayConfig::default(),
            Downcasts::new(),
            Arc::new(Metrics::new()),
        );
        assert!(Arc::ptr_eq(&inner, &wrapped));
    }

    /// Before: the refused copy failed the event for good, so it was dead-lettered (and its
    /// aggregate parked) although its own message had been delivered.
    #[tokio::test]
    async fn a_copy_refused_for_good_is_dropped_and_counted_and_the_event_delivered() {
        let refusing = Arc::new(Recorder {
            sent: Mutex::new(Vec::new()),
            fail: vec!["orders.v1"],
            refuse: true,
        });
        let metrics = Arc::new(Metrics::new());
        let outgoing = Outgoing::wrap(
            refusing.clone(),
            &config(Envelope::Outbox),
            Downcasts::new(),
            metrics.clone(),
        );
        outgoing.publish(&v2()).await.unwrap();
        outgoing.publish(&v2()).await.unwrap();
        let sent = refusing.sent.lock().unwrap().clone();
        let destinations: Vec<_> = sent.iter().map(|m| m.destination.as_str()).collect();
        assert_eq!(destinations, ["orders.v2", "orders.v2"]);
        assert_eq!(metrics.sum("outbox_fanout_copies_dropped_total"), 2.0);

        // The event's own message refused for good still fails the event.
        let refusing = Arc::new(Recorder {
            sent: Mutex::new(Vec::new()),
            fail: vec!["orders.v2"],
            refuse: true,
        });
        let err = wrap(refusing.clone(), &config(Envelope::Outbox))
            .publish(&v2())
            .await
            .unwrap_err();
        assert!(!err.is_transient());
        assert!(
            refusing.sent.lock().unwrap().is_empty(),
            "no copy without its event"
        );
    }

    /// A copy says which stored version it was made from; the event's own message never
    /// carries the marker, even when the writer set it.
    #[tokio::test]
    async fn copies_carry_the_version_they_were_made_from_and_events_never_do() {
        for envelope in [Envelope::Outbox, Envelope::CloudeventsBinary] {
            let inner = recorder(vec![]);
            let outgoing = wrap(inner.clone(), &config(envelope));
            let mut forged = v2();
            forged
                .headers
                .insert("Copy-Of-Schema-Version".into(), "9".into());
            outgoing.publish(&forged).await.unwrap();
            let sent = inner.sent.lock().unwrap().clone();
            let marker = |m: &Message| {
                let mut found = Vec::new();
                m.visit_headers(|name, value| {
                    if name.eq_ignore_ascii_case("copy-of-schema-version") {
                        found.push(value.to_owned());
                    }
                });
                let in_map: Vec<String> = m
                    .broker_headers()
                    .into_iter()
                    .filter(|(name, _)| name.eq_ignore_ascii_case("copy-of-schema-version"))
                    .map(|(_, value)| value)
                    .collect();
                assert_eq!(found, in_map, "both views agree");
                found
            };
            assert_eq!(marker(&sent[0]), Vec::<String>::new(), "{envelope:?}");
            assert_eq!(marker(&sent[1]), vec!["2".to_owned()], "{envelope:?}");
        }
    }
}
