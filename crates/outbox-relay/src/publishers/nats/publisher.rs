use std::{collections::HashSet, time::Duration};

use async_nats::{
    header::HeaderMap,
    jetstream::{self, context::PublishErrorKind, message::PublishMessage, stream},
    HeaderName, HeaderValue,
};
use futures::future::BoxFuture;
use tokio::sync::Mutex;

use super::NatsConfig;
use crate::{check_payload_size, Error, Message, PublishError, Publisher};

/// Fallback when the server has not told its `max_payload` yet.
const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;

/// Publishes to NATS JetStream and waits for each PubAck.
pub struct NatsPublisher {
    client: async_nats::Client,
    js: jetstream::Context,
    config: NatsConfig,
    /// Subject patterns known to be captured by the stream.
    covered: Mutex<HashSet<String>>,
}

impl NatsPublisher {
    /// Connects (retrying in the background while the server is down).
    pub async fn connect(config: NatsConfig) -> Result<Self, Error> {
        config.validate().map_err(Error::Config)?;
        let client = async_nats::ConnectOptions::new()
            .name("outbox-relay")
            .retry_on_initial_connect()
            .event_callback(|event| async move {
                tracing::info!(%event, "nats connection event");
            })
            .connect(&config.url)
            .await
            .map_err(|e| Error::Broker(format!("nats: {e}")))?;
        let mut js = jetstream::new(client.clone());
        js.set_timeout(config.ack_timeout);
        Ok(Self {
            client,
            js,
            config,
            covered: Mutex::new(HashSet::new()),
        })
    }

    /// Makes the stream capture `subject`: creates the stream, or adds the subject's pattern.
    async fn ensure_stream_covers(&self, subject: &str) -> Result<(), PublishError> {
        let pattern = subject_pattern(subject);
        let mut covered = self.covered.lock().await;
        if covered.contains(&pattern) {
            return Ok(());
        }
        let name = &self.config.stream;
        match self.js.get_stream(name).await {
            Ok(mut existing) => {
                let info = existing.info().await.map_err(|e| {
                    PublishError::transient(format!("nats: stream {name} info: {e}"))
                })?;
                let mut cfg = info.config.clone();
                if !cfg.subjects.contains(&pattern) {
                    cfg.subjects.push(pattern.clone());
                    self.js.update_stream(&cfg).await.map_err(|e| {
                        PublishError::transient(format!(
                            "nats: adding {pattern} to stream {name}: {e}"
                        ))
                    })?;
                    tracing::info!(stream = %name, %pattern, "added subject to stream");
                }
            }
            Err(_) => {
                self.js
                    .create_stream(stream::Config {
                        name: name.clone(),
                        subjects: vec![pattern.clone()],
                        storage: stream::StorageType::File,
                        duplicate_window: Duration::from_secs(120),
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| {
                        PublishError::transient(format!("nats: creating stream {name}: {e}"))
                    })?;
                tracing::info!(stream = %name, %pattern, "created stream");
            }
        }
        covered.insert(pattern);
        Ok(())
    }

    async fn send(
        &self,
        message: &Message,
        headers: HeaderMap,
    ) -> Result<(), async_nats::jetstream::context::PublishError> {
        let publish = PublishMessage::build()
            .payload(message.payload.clone())
            .headers(headers)
            .message_id(message.message_id.to_string());
        self.js
            .send_publish(message.destination.clone(), publish)
            .await?
            .await
            .map(drop)
    }
}

/// Classifies a JetStream publish error: the one place NATS errors become retry decisions.
fn classify(error: &async_nats::jetstream::context::PublishError) -> PublishError {
    let text = format!("nats: {error}");
    match error.kind() {
        PublishErrorKind::MaxPayloadExceeded => PublishError::permanent(text),
        PublishErrorKind::WrongLastMessageId | PublishErrorKind::WrongLastSequence => {
            PublishError::permanent(text)
        }
        PublishErrorKind::StreamNotFound => PublishError::permanent(text),
        PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::MaxAckPending => PublishError::transient(text),
        // Server-side rejections that no retry can fix.
        _ if text.contains("exceeds maximum") || text.contains("message size") => {
            PublishError::permanent(text)
        }
        _ => PublishError::transient(text),
    }
}

/// The message's headers as NATS headers. A value with CR or LF would end the header line
/// (async-nats panics on one): a permanent error, never a panic. `ClaimedRow::decode` refuses
/// such rows already; this guards messages built elsewhere.
fn nats_headers(message: &Message) -> Result<HeaderMap, PublishError> {
    let mut headers = HeaderMap::new();
    let mut invalid = None;
    message.visit_headers(|name, value| match value.parse::<HeaderValue>() {
        Ok(value) => headers.insert(
            name.parse::<HeaderName>()
                .unwrap_or_else(|_| HeaderName::from_static("x-invalid-header")),
            value,
        ),
        Err(_) => invalid = Some(name.to_owned()),
    });
    match invalid {
        None => Ok(headers),
        Some(name) => Err(PublishError::permanent(format!(
            "nats: header {name:?} contains CR or LF"
        ))),
    }
}

impl Publisher for NatsPublisher {
    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            check_payload_size(message, self.max_payload_bytes())?;
            let headers = nats_headers(message)?;
            match self.send(message, headers.clone()).await {
                Ok(()) => Ok(()),
                Err(e)
                    if e.kind() == PublishErrorKind::StreamNotFound
                        && self.config.create_stream =>
                {
                    self.ensure_stream_covers(&message.destination).await?;
                    self.send(message, headers).await.map_err(|e| classify(&e))
                }
                Err(e) => Err(classify(&e)),
            }
        })
    }

    fn name(&self) -> &'static str {
        "nats"
    }

    fn max_payload_bytes(&self) -> usize {
        match self.client.server_info().max_payload {
            0 => DEFAULT_MAX_PAYLOAD,
            // Leave room for the headers.
            n => n.saturating_sub(8 * 1024).max(1),
        }
    }

    fn check_destination(&self, destination: &str) -> Result<(), PublishError> {
        if is_valid_subject(destination) {
            Ok(())
        } else {
            Err(PublishError::permanent(format!(
                "{destination:?} is not a valid NATS subject (dot-separated non-empty tokens, \
                 no spaces, no wildcards)"
            )))
        }
    }
}

/// Whether `subject` can be published to: non-empty dot-separated tokens without whitespace,
/// control characters or wildcards.
pub fn is_valid_subject(subject: &str) -> bool {
    !subject.is_empty()
        && subject.len() <= 1024
        && subject.split('.').all(|token| {
            !token.is_empty()
                && token != "*"
                && token != ">"
                && !token.chars().any(|c| c.is_whitespace() || c.is_control())
        })
}

/// The stream subject pattern that captures `subject`: `first.>`, or the subject itself when it
/// has a single token.
fn subject_pattern(subject: &str) -> String {
    match subject.split_once('.') {
        Some((first, _)) => format!("{first}.>"),
        None => subject.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_subjects() {
        assert!(is_valid_subject("order.OrderPlaced"));
        assert!(is_valid_subject("a"));
        for bad in ["", "a..b", ".a", "a.", "a b", "a.*", "a.>", "a\n"] {
            assert!(!is_valid_subject(bad), "{bad:?}");
        }
    }

    /// async-nats panics on a header value with CR or LF: such a value is a permanent error.
    #[test]
    fn a_header_value_with_a_line_break_is_a_permanent_error_not_a_panic() {
        let mut m = crate::message::sample(1, "42\r\nevent-type: Forged");
        let err = nats_headers(&m).unwrap_err();
        assert!(!err.is_transient());
        assert!(err.message.contains("aggregate-id"), "{err}");
        m.aggregate_id = "42".into();
        let headers = nats_headers(&m).unwrap();
        assert_eq!(headers.get("aggregate-id").unwrap().as_str(), "42");
    }

    #[test]
    fn patterns_capture_the_subject() {
        assert_eq!(subject_pattern("order.Placed"), "order.>");
        assert_eq!(subject_pattern("order"), "order");
    }

    #[test]
    fn config_errors_name_the_field() {
        let c = NatsConfig {
            url: "http://x".into(),
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().starts_with("nats.url"));
        let c = NatsConfig {
            stream: "a b".into(),
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().starts_with("nats.stream"));
    }
}
