use std::{collections::HashSet, time::Duration};

use async_nats::{
    client::PublishErrorKind as ClientErrorKind, header::HeaderMap, jetstream, jetstream::stream,
    HeaderName, StatusCode,
};
use futures::future::BoxFuture;
use tokio::sync::Mutex;

use super::{
    acks::{Acks, NoAck},
    subjects::check_subject,
    NatsConfig,
};
use crate::{
    error::Error, publisher::check_payload_size, publisher::PublishError, publisher::Publisher,
    wire::message::Message,
};

/// Fallback when the server has not told its `max_payload` yet.
const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;

/// Publishes to NATS JetStream and waits for each PubAck.
pub struct NatsPublisher {
    client: async_nats::Client,
    /// For stream management (create, add subjects); publishes go through `acks`.
    js: jetstream::Context,
    acks: Acks,
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
            .map_err(|e| Error::broker("nats", e))?;
        let mut js = jetstream::new(client.clone());
        js.set_timeout(config.ack_timeout);
        let acks = Acks::start(&client, config.ack_timeout)
            .await
            .map_err(|e| Error::broker("nats: subscribing to the acknowledgements", e))?;
        Ok(Self {
            client,
            js,
            acks,
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
                    self.js
                        .update_stream(&cfg)
                        .await
                        .map_err(|e| stream_update_error(&e, &pattern, name))?;
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

    /// Publishes `message` with `headers` (and its `Nats-Msg-Id`) and waits for the PubAck.
    async fn send(&self, message: &Message, mut headers: HeaderMap) -> Result<(), SendError> {
        let mut id = [0u8; uuid::fmt::Hyphenated::LENGTH];
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            &*message.message_id.hyphenated().encode_lower(&mut id),
        );
        let (reply, pending) = self.acks.expect();
        self.client
            .publish_with_reply_and_headers(
                message.destination.clone(),
                reply,
                headers,
                message.payload.clone(),
            )
            .await
            .map_err(SendError::Client)?;
        let reply = pending.reply().await.map_err(SendError::NoAck)?;
        match reply.status {
            Some(StatusCode::NO_RESPONDERS) => return Err(SendError::NoStream),
            Some(status) if !status.is_success() => return Err(SendError::Status(status)),
            _ => {}
        }
        read_ack(&reply.payload)
    }
}

/// The failure of adding `pattern` to stream `name`: permanent when the pattern overlaps
/// another stream's subjects (no retry makes a subject belong to two streams: the event is a
/// dead letter naming the clash, rather than a transient failure retried forever), transient
/// otherwise.
fn stream_update_error(
    error: &async_nats::jetstream::context::UpdateStreamError,
    pattern: &str,
    name: &str,
) -> PublishError {
    use async_nats::jetstream::{context::CreateStreamErrorKind, ErrorCode};
    let message = format!("nats: adding {pattern} to stream {name}: {error}");
    match error.kind() {
        CreateStreamErrorKind::JetStream(e)
            if e.error_code() == ErrorCode::STREAM_SUBJECT_OVERLAP =>
        {
            PublishError::permanent(format!(
                "{message}: another stream already takes these subjects; route the event to \
                 a subject of that stream's or under another first token"
            ))
        }
        _ => PublishError::transient(message),
    }
}

/// Whether a reply is the stream's acknowledgement: a JetStream PubAck, naming the stream that
/// stored the message and its sequence there. Anything else is not one, whoever sent it (a
/// core-NATS service answering on the subject, a JetStream API endpoint, garbage), and the
/// message is not published.
fn read_ack(reply: &[u8]) -> Result<(), SendError> {
    if is_plain_ack(reply) {
        return Ok(());
    }
    match serde_json::from_slice::<AckReply>(reply) {
        Ok(AckReply {
            error: Some(error), ..
        }) => Err(SendError::Refused(error)),
        Ok(AckReply {
            stream: Some(stream),
            seq: Some(_),
            error: None,
        }) if !stream.is_empty() => Ok(()),
        Ok(_) => Err(SendError::NotAnAck(
            "a JSON reply without a stream name and sequence".into(),
        )),
        Err(e) => Err(SendError::NotAnAck(format!("not JetStream's JSON: {e}"))),
    }
}

/// A JetStream reply: a PubAck (`{"stream":…,"seq":…}`), or an error.
#[derive(serde::Deserialize)]
struct AckReply {
    #[serde(default)]
    stream: Option<String>,
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default)]
    error: Option<ApiError>,
}

/// Whether `reply` is a PubAck without an error, told without parsing it: a JSON object that
/// starts with a non-empty `stream` name (no escapes) and a `seq` number, and in which the
/// key `error` does not occur (JetStream writes its replies itself, without escapes in keys).
/// Anything else is parsed.
fn is_plain_ack(reply: &[u8]) -> bool {
    let Some(rest) = reply.strip_prefix(br#"{"stream":""#) else {
        return false;
    };
    let name = rest
        .iter()
        .take_while(|&&b| b != b'"' && b != b'\\' && b >= b' ')
        .count();
    let rest = &rest[name..];
    let Some(rest) = rest
        .strip_prefix(br#"","seq":"#)
        .or_else(|| rest.strip_prefix(br#"", "seq":"#))
    else {
        return false;
    };
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    let rest = &rest[digits..];
    name > 0
        && digits > 0
        && (rest == b"}"
            || (rest.starts_with(b",")
                && rest.ends_with(b"}")
                && !rest.windows(7).any(|w| w == br#""error""#)))
}

/// The error of a JetStream reply.
#[derive(serde::Deserialize, Debug)]
struct ApiError {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    err_code: u64,
    #[serde(default)]
    description: String,
}

/// Why a publish was not acknowledged.
#[derive(Debug)]
enum SendError {
    /// No stream captures the subject (the server answered "no responders").
    NoStream,
    /// The client refused it: over the server's payload limit, a bad subject, or closed.
    Client(async_nats::PublishError),
    /// No acknowledgement came.
    NoAck(NoAck),
    /// The stream refused the message.
    Refused(ApiError),
    /// A status reply other than no responders.
    Status(StatusCode),
    /// A reply that is not a PubAck (what it is instead).
    NotAnAck(String),
}

/// JetStream error codes of a message that no retry can store: over the stream's message size,
/// and the expectations the relay never sets (wrong last message id or sequence).
const PERMANENT_CODES: [u64; 3] = [10054, 10070, 10071];

/// Classifies a failed publish: the one place NATS errors become retry decisions.
fn classify(error: SendError, destination: &str) -> PublishError {
    match error {
        SendError::NoStream => {
            PublishError::permanent(format!("nats: no stream captures subject {destination}"))
        }
        SendError::Client(e) => match e.kind() {
            ClientErrorKind::MaxPayloadExceeded | ClientErrorKind::InvalidSubject => {
                PublishError::permanent(format!("nats: {e}"))
            }
            ClientErrorKind::Send => PublishError::transient(format!("nats: {e}")),
        },
        SendError::NoAck(NoAck::TimedOut) => {
            PublishError::transient("nats: no acknowledgement within the ack timeout")
        }
        SendError::NoAck(NoAck::Closed) => {
            PublishError::transient("nats: the connection closed before the acknowledgement")
        }
        SendError::Refused(e) => {
            let text = format!(
                "nats: stream refused the message: {} (code {}, error {})",
                e.description, e.code, e.err_code
            );
            let too_large =
                e.description.contains("exceeds maximum") || e.description.contains("message size");
            if PERMANENT_CODES.contains(&e.err_code) || too_large {
                PublishError::permanent(text)
            } else {
                PublishError::transient(text)
            }
        }
        SendError::Status(status) => {
            PublishError::transient(format!("nats: the server answered status {status}"))
        }
        // Something on the subject answers, and it is not a stream: no retry makes it one,
        // and a transient class would pause the whole publisher over one event's subject.
        SendError::NotAnAck(what) => PublishError::permanent(format!(
            "nats: the reply on subject {destination:?} is not a JetStream acknowledgement \
             ({what}); a service, not a stream, answers there"
        )),
    }
}

/// The message's headers as NATS headers. A value with CR or LF would end the header line
/// (async-nats panics on one): a permanent error, never a panic. `ClaimedRow::decode` refuses
/// such rows already; this guards messages built elsewhere. The relay's own header names are
/// built once, not parsed for every message. A writer's header in the server's own namespace
/// (`Nats-…`, in any case) is dropped: JetStream acts on those (`Nats-Rollup` purges a
/// subject, `Nats-Expected-Stream` and `Nats-TTL` change what is stored), and the relay sets
/// the one it needs, `Nats-Msg-Id`, itself.
fn nats_headers(message: &Message) -> Result<HeaderMap, PublishError> {
    let mut headers = HeaderMap::new();
    let mut invalid = None;
    message.visit_headers(|name, value| {
        if is_server_header(name) {
            return;
        }
        if value.contains(['\r', '\n']) {
            invalid = Some(name.to_owned());
            return;
        }
        let name = match STANDARD_NAMES.iter().find(|(n, _)| *n == name) {
            Some((_, header)) => header.clone(),
            None => name
                .parse::<HeaderName>()
                .unwrap_or_else(|_| HeaderName::from_static("x-invalid-header")),
        };
        headers.insert(name, value);
    });
    match invalid {
        None => Ok(headers),
        Some(name) => Err(PublishError::permanent(format!(
            "nats: header {name:?} contains CR or LF"
        ))),
    }
}

/// Whether `name` is in the NATS server's header namespace (`Nats-`, any case).
fn is_server_header(name: &str) -> bool {
    name.as_bytes()
        .get(..5)
        .is_some_and(|p| p.eq_ignore_ascii_case(b"nats-"))
}

/// The relay's standard header names, as NATS header names.
static STANDARD_NAMES: [(&str, HeaderName); 8] = {
    use crate::wire::message::header::*;
    [
        (EVENT_ID, HeaderName::from_static(EVENT_ID)),
        (EVENT_TYPE, HeaderName::from_static(EVENT_TYPE)),
        (SCHEMA_VERSION, HeaderName::from_static(SCHEMA_VERSION)),
        (AGGREGATE_TYPE, HeaderName::from_static(AGGREGATE_TYPE)),
        (AGGREGATE_ID, HeaderName::from_static(AGGREGATE_ID)),
        (
            AGGREGATE_VERSION,
            HeaderName::from_static(AGGREGATE_VERSION),
        ),
        (OCCURRED_AT, HeaderName::from_static(OCCURRED_AT)),
        (CONTENT_TYPE, HeaderName::from_static(CONTENT_TYPE)),
    ]
};

impl Publisher for NatsPublisher {
    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            check_payload_size(message, self.max_payload_bytes())?;
            // Here too, whoever calls: a refused subject must never reach the server, nor be
            // added to the stream.
            self.check_destination(&message.destination)?;
            let destination = &message.destination;
            match self.send(message, nats_headers(message)?).await {
                Ok(()) => Ok(()),
                Err(SendError::NoStream) if self.config.create_stream => {
                    // Boxed: the stream-management future is large, and the publish future
                    // of every message would otherwise be as large as it.
                    Box::pin(self.ensure_stream_covers(destination)).await?;
                    // Built again: the map is moved into the first attempt (and the retry is
                    // once per stream, not per message).
                    self.send(message, nats_headers(message)?)
                        .await
                        .map_err(|e| classify(e, destination))
                }
                Err(e) => Err(classify(e, destination)),
            }
        })
    }

    fn name(&self) -> &'static str {
        "nats"
    }

    fn max_payload_bytes(&self) -> usize {
        // An atomic the client keeps from the server's INFO (`server_info()` clones the whole
        // INFO on every call, twice per message).
        match self.client.max_payload() {
            0 => DEFAULT_MAX_PAYLOAD,
            // Leave room for the headers.
            n => n.saturating_sub(8 * 1024).max(1),
        }
    }

    fn check_destination(&self, destination: &str) -> Result<(), PublishError> {
        check_subject(destination, &self.config.subject_prefixes)
    }
}

/// The stream subject pattern that captures `subject`: `first.>`, or the subject itself when it
/// has a single token.
pub(super) fn subject_pattern(subject: &str) -> String {
    match subject.split_once('.') {
        Some((first, _)) => format!("{first}.>"),
        None => subject.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// async-nats panics on a header value with CR or LF: such a value is a permanent error.
    #[test]
    fn a_header_value_with_a_line_break_is_a_permanent_error_not_a_panic() {
        let mut m = crate::wire::message::sample(1, "42\r\nevent-type: Forged");
        let err = nats_headers(&m).unwrap_err();
        assert!(!err.is_transient());
        assert!(err.message.contains("aggregate-id"), "{err}");
        m.aggregate_id = "42".into();
        let headers = nats_headers(&m).unwrap();
        assert_eq!(headers.get("aggregate-id").unwrap().as_str(), "42");
    }

    /// A writer cannot set headers JetStream acts on; the relay's `Nats-Msg-Id` is its own.
    #[test]
    fn writer_headers_in_the_servers_namespace_are_dropped() {
        let mut m = crate::wire::message::sample(1, "42");
        for name in [
            "Nats-Rollup",
            "nats-expected-stream",
            "NATS-MSG-ID",
            "Nats-TTL",
        ] {
            m.headers.insert(name.into(), "forged".into());
        }
        m.headers.insert("natsy".into(), "kept".into());
        let headers = nats_headers(&m).unwrap();
        let names: Vec<String> = headers.iter().map(|(n, _)| n.to_string()).collect();
        assert!(
            !names
                .iter()
                .any(|n| n.to_ascii_lowercase().starts_with("nats-")),
            "{names:?}"
        );
        assert_eq!(headers.get("natsy").unwrap().as_str(), "kept");
    }

    /// A header the message does not have is not sent.
    #[test]
    fn a_header_the_message_lacks_is_absent_from_its_map() {
        let mut m = crate::wire::message::sample(1, "42");
        m.aggregate_version = None;
        let headers = nats_headers(&m).unwrap();
        assert!(headers.get("aggregate-version").is_none());
        assert_eq!(headers.get("event-type").unwrap().as_str(), m.event_type);
        m.aggregate_version = Some(7);
        let headers = nats_headers(&m).unwrap();
        assert_eq!(headers.get("aggregate-version").unwrap().as_str(), "7");
    }

    #[test]
    fn plain_acks_are_told_apart_from_errors() {
        assert!(is_plain_ack(br#"{"stream":"OUTBOX","seq":12}"#));
        assert!(is_plain_ack(
            br#"{"stream":"OUTBOX","seq":12,"duplicate":true}"#
        ));
        for other in [
            &br#"{"error":{"code":503,"description":"no space"}}"#[..],
            br#"{"stream":"OUTBOX","error":{"code":400}}"#,
            br#"{"stream":"OUTBOX""#,
            br#"{"stream":"OUTBOX"}"#,
            br#"{"stream":"","seq":1}"#,
            br#"{"stream":"OUTBOX","seq":}"#,
            b"",
            b"garbage",
        ] {
            assert!(!is_plain_ack(other), "{}", String::from_utf8_lossy(other));
        }
    }

    /// Only a PubAck (a stream name and a sequence) acknowledges a publish; a reply without an
    /// `error` that is not one (a service's answer, an API response) is a permanent failure.
    #[test]
    fn only_a_pub_ack_acknowledges() {
        for ack in [
            &br#"{"stream":"OUTBOX","seq":12}"#[..],
            br#"{"stream":"OUTBOX", "seq":12, "domain":"hub"}"#,
            br#"{"seq":12,"stream":"OUTBOX","duplicate":true}"#,
        ] {
            assert!(read_ack(ack).is_ok(), "{}", String::from_utf8_lossy(ack));
        }
        for other in [
            &br#"{"stream":"OUTBOX"}"#[..],
            br#"{"seq":3}"#,
            br#"{"stream":"","seq":3}"#,
            br#"{"type":"io.nats.jetstream.api.v1.stream_delete_response","success":true}"#,
            br#"{"ok":true}"#,
            b"ok",
            b"",
        ] {
            let error = classify(read_ack(other).unwrap_err(), "svc.echo");
            assert!(!error.is_transient(), "{}", String::from_utf8_lossy(other));
            assert!(error.message.contains("\"svc.echo\""), "{error}");
        }
        assert!(matches!(
            read_ack(br#"{"error":{"code":503,"description":"no space"}}"#),
            Err(SendError::Refused(_))
        ));
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
