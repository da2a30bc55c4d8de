use std::{collections::HashMap, fmt, sync::Arc, time::Duration};

use fe2o3_amqp::{
    connection::{ConnectionHandle, OpenError},
    link::{SendError, SenderAttachError, SessionStopReason},
    sasl_profile::SaslProfile,
    session::{BeginError, SessionHandle},
    Connection, Sendable, Sender, Session,
};
use fe2o3_amqp_types::{
    definitions::{self, ErrorCondition, SenderSettleMode},
    messaging::{ApplicationProperties, Data, Header, Message as AmqpMessage, Outcome, Properties},
    primitives::{Binary, SimpleValue, Symbol, Timestamp},
};
use futures::future::BoxFuture;
use tokio::{net::TcpStream, sync::Mutex, time::Instant};
use tokio_rustls::{
    rustls::{self, pki_types::ServerName},
    TlsConnector,
};

use super::{
    config::{Endpoint, Flavour, DESTINATION},
    ServiceBusConfig,
};
use crate::{
    error::Error, publisher::check_payload_size, publisher::PublishError, publisher::Publisher,
    wire::message::Message,
};

/// How long the broker may stay silent before the connection is considered dead (we ask the
/// peer to send heartbeats at least this often, and fe2o3 answers the peer's own timeout).
const IDLE_TIMEOUT_MS: u32 = 60_000;

/// Rejection conditions that describe the broker's state, not the message: retried.
const TRANSIENT_REJECTIONS: &[&str] = &[
    "com.microsoft:server-busy",
    "com.microsoft:timeout",
    "amqp:resource-limit-exceeded",
    "amqp:internal-error",
];

/// Publishes over AMQP 1.0 to Azure Service Bus or any AMQP 1.0 broker: one connection and
/// session per target address, each with one sender link (attached on first use, cached), unsettled
/// transfers, `Ok` only on the `accepted` disposition. Reconnects lazily after a connection
/// loss; publishes in the meantime fail as transient.
///
/// Many callers may publish at once: a link is locked only while a transfer is handed to it,
/// and the disposition is awaited outside the lock, so publishes to one address overlap.
pub struct ServiceBusPublisher {
    config: ServiceBusConfig,
    endpoint: Endpoint,
    address: String,
    tls: Option<TlsConnector>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    conn: Option<Conn>,
    /// Increases with every connection, so a failure only tears down the one it happened on.
    generation: u64,
    /// The last failed connection attempt: callers that waited for it get its error instead
    /// of trying again at once (a down broker costs one connect timeout, not one per caller).
    failure: Option<(Instant, PublishError)>,
}

struct Conn {
    generation: u64,
    connection: ConnectionHandle<()>,
    /// One session per link: a broker that ends the session over one bad address (RabbitMQ
    /// does, for a missing exchange) leaves the other addresses' links alone.
    links: HashMap<String, Arc<Link>>,
}

struct Link {
    sender: Mutex<Sender>,
    /// Kept open as long as the sender; ended on drop.
    session: std::sync::Mutex<SessionHandle<()>>,
}

impl Link {
    fn is_usable(&self) -> bool {
        self.session.lock().map(|s| !s.is_ended()).unwrap_or(false)
    }
}

/// Everything that can go wrong on the way to a disposition, before it is classified.
enum Failure {
    /// TCP connect or TLS handshake.
    Io(std::io::Error),
    /// AMQP open (protocol header, SASL, open performative).
    Open(OpenError),
    /// Session begin.
    Begin(BeginError),
    /// The broker refused the sender link.
    Attach(SenderAttachError),
    /// The transfer or its settlement failed.
    Send(SendError),
    /// The broker settled the delivery with something other than `accepted`.
    Outcome(Outcome),
    /// No connection (or link) within the connect timeout.
    ConnectTimeout(Duration),
    /// No disposition within the ack timeout.
    AckTimeout(Duration),
    /// Another caller's connection attempt failed while this one waited for it.
    Shared(PublishError),
}

/// What a failure leaves broken.
#[derive(Debug, PartialEq, Eq)]
enum Broken {
    Nothing,
    Link,
    Connection,
}

/// Turns a failure into the relay's decision: the one place AMQP 1.0 outcomes and errors
/// become transient or permanent.
fn classify(failure: &Failure, address: &str) -> PublishError {
    match failure {
        Failure::Outcome(Outcome::Accepted(_)) => {
            PublishError::transient("amqp1: accepted outcome reported as a failure (bug)")
        }
        Failure::Outcome(Outcome::Rejected(rejected)) => {
            let reason = rejected
                .error
                .as_ref()
                .map(describe)
                .unwrap_or_else(|| "no reason given".into());
            let condition = rejected
                .error
                .as_ref()
                .map(|e| condition_text(&e.condition));
            if condition.is_some_and(|c| TRANSIENT_REJECTIONS.contains(&c.as_str())) {
                PublishError::transient(format!(
                    "amqp1: {address:?} is busy, message rejected for now: {reason}"
                ))
            } else {
                PublishError::permanent(format!(
                    "amqp1: {address:?} rejected the message: {reason}"
                ))
            }
        }
        Failure::Outcome(Outcome::Released(_)) => PublishError::transient(format!(
            "amqp1: {address:?} released the message (not delivered; retry)"
        )),
        Failure::Outcome(Outcome::Modified(modified)) => PublishError::transient(format!(
            "amqp1: {address:?} returned the message modified (delivery failed: {}, \
             undeliverable here: {}); retry",
            modified.delivery_failed.unwrap_or(false),
            modified.undeliverable_here.unwrap_or(false)
        )),
        Failure::Send(SendError::MessageSizeExceeded(e)) => PublishError::permanent(format!(
            "amqp1: message is {} bytes encoded, over the link's maximum of {} bytes",
            e.size, e.max_size
        )),
        Failure::Send(SendError::MessageEncodeError) => {
            PublishError::permanent("amqp1: the message could not be encoded")
        }
        Failure::Attach(e) if attach_refusal(e).is_some_and(is_missing_address) => {
            PublishError::permanent(format!(
                "amqp1: the broker has no node at address {address:?}: {}",
                attach_refusal(e).map(describe).unwrap_or_default()
            ))
        }
        Failure::Attach(e) => {
            PublishError::transient(format!("amqp1: attaching a sender to {address:?}: {e}"))
        }
        Failure::Send(e) => PublishError::transient(format!(
            "amqp1: sending to {address:?}: {e} (may have been delivered; retry)"
        )),
        Failure::Io(e) => PublishError::transient(format!("amqp1: connecting: {e}")),
        Failure::Open(OpenError::SaslError { code, .. }) => PublishError::transient(format!(
            "amqp1: authentication failed ({code:?}): check the key name and key"
        )),
        Failure::Open(e) => PublishError::transient(format!("amqp1: opening the connection: {e}")),
        Failure::Begin(e) => PublishError::transient(format!("amqp1: beginning a session: {e}")),
        Failure::ConnectTimeout(t) => {
            PublishError::transient(format!("amqp1: no connection (or link) within {t:?}"))
        }
        Failure::AckTimeout(t) => PublishError::transient(format!(
            "amqp1: no disposition from {address:?} within {t:?} (may have been delivered; retry)"
        )),
        Failure::Shared(e) => e.clone(),
    }
}

/// What to tear down after a failure, so the next publish starts from a working state.
fn broken(failure: &Failure) -> Broken {
    match failure {
        Failure::Outcome(_) | Failure::Shared(_) => Broken::Nothing,
        Failure::Send(
            SendError::MessageSizeExceeded(_)
            | SendError::MessageEncodeError
            | SendError::NonTerminalDeliveryState
            | SendError::IllegalDeliveryState,
        ) => Broken::Nothing,
        // The link (and its session) is dropped; a lost connection is noticed before the next
        // use.
        Failure::Send(_) | Failure::Attach(_) | Failure::Begin(_) | Failure::AckTimeout(_) => {
            Broken::Link
        }
        Failure::Io(_) | Failure::Open(_) | Failure::ConnectTimeout(_) => Broken::Connection,
    }
}

/// The error with which the broker refused a sender link, whether it closed the link
/// (Service Bus, for a missing entity) or ended its session (RabbitMQ 3.10, for a missing
/// exchange).
fn attach_refusal(error: &SenderAttachError) -> Option<&definitions::Error> {
    match error {
        SenderAttachError::RemoteClosedWithError(e)
        | SenderAttachError::SessionStopped(SessionStopReason::RemoteEndedWithError(e)) => Some(e),
        _ => None,
    }
}

/// `amqp:not-found` and friends: the address names nothing the broker can deliver to.
fn is_missing_address(error: &definitions::Error) -> bool {
    matches!(
        condition_text(&error.condition).as_str(),
        "amqp:not-found" | "amqp:resource-deleted" | "com.microsoft:entity-disabled"
    )
}

fn condition_text(condition: &ErrorCondition) -> String {
    match condition {
        ErrorCondition::AmqpError(e) => Symbol::from(e).0,
        ErrorCondition::ConnectionError(e) => Symbol::from(e).0,
        ErrorCondition::SessionError(e) => Symbol::from(e).0,
        ErrorCondition::LinkError(e) => Symbol::from(e).0,
        ErrorCondition::Custom(s) => s.0.clone(),
        #[allow(unreachable_patterns)]
        other => format!("{other:?}"),
    }
}

fn describe(error: &definitions::Error) -> String {
    match &error.description {
        Some(description) => format!("{}: {description}", condition_text(&error.condition)),
        None => condition_text(&error.condition),
    }
}

impl fmt::Debug for ServiceBusPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceBusPublisher")
            .field("endpoint", &self.endpoint)
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl ServiceBusPublisher {
    /// Validates the config and tries to connect. A broker that is down at start-up is not
    /// fatal: the relay starts and every publish tries again.
    pub async fn connect(config: ServiceBusConfig) -> Result<Self, Error> {
        let publisher = Self::new(config)?;
        let mut state = publisher.state.lock().await;
        if let Err(failure) = publisher.ensure_connected(&mut state).await {
            let e = classify(&failure, &publisher.address);
            tracing::warn!(error = %e, endpoint = %publisher.endpoint,
                "amqp 1.0 broker not reachable yet; will retry on publish");
        }
        drop(state);
        Ok(publisher)
    }

    /// Validates the config; connects on the first publish.
    pub fn new(config: ServiceBusConfig) -> Result<Self, Error> {
        config.validate().map_err(Error::Config)?;
        let endpoint = config.endpoint().map_err(Error::Config)?;
        let address = config.address_template(&endpoint);
        let tls = endpoint.tls.then(tls_connector).transpose()?;
        Ok(Self {
            config,
            endpoint,
            address,
            tls,
            state: Mutex::new(State::default()),
        })
    }

    /// The target address of `destination`.
    pub fn address_of(&self, destination: &str) -> String {
        self.address.replace(DESTINATION, destination)
    }

    /// Whether this publisher talks to Azure Service Bus (rather than a generic broker).
    pub fn is_service_bus(&self) -> bool {
        self.endpoint.flavour == Flavour::ServiceBus
    }

    /// Makes `state.conn` a live connection and session, connecting if needed.
    async fn ensure_connected(&self, state: &mut State) -> Result<(), Failure> {
        if let Some(conn) = &state.conn {
            if !conn.connection.is_closed() {
                return Ok(());
            }
            tracing::info!(endpoint = %self.endpoint, "amqp 1.0 connection lost; reconnecting");
            state.conn = None;
        }
        let timeout = self.config.connect_timeout;
        let connection = tokio::time::timeout(timeout, self.open())
            .await
            .map_err(|_| Failure::ConnectTimeout(timeout))??;
        state.generation += 1;
        state.conn = Some(Conn {
            generation: state.generation,
            connection,
            links: HashMap::new(),
        });
        tracing::info!(endpoint = %self.endpoint, address = %self.address,
            "connected to the amqp 1.0 broker");
        Ok(())
    }

    async fn open(&self) -> Result<ConnectionHandle<()>, Failure> {
        let host = self.endpoint.host.as_str();
        let tcp = TcpStream::connect((host, self.endpoint.port))
            .await
            .map_err(Failure::Io)?;
        let _ = tcp.set_nodelay(true);
        let container_id = format!("outbox-relay-{}", uuid::Uuid::now_v7());
        let sasl = match &self.endpoint.credentials {
            Some((username, password)) => SaslProfile::Plain {
                username: username.clone(),
                password: password.clone(),
            },
            None => SaslProfile::Anonymous,
        };
        // TLS is set up here and the AMQP connection runs inside it ("amqp" scheme over a TLS
        // stream: pure TLS, no AMQP TLS header exchange, which is what Service Bus expects).
        let builder = Connection::builder()
            .container_id(container_id)
            .hostname(host)
            .sasl_profile(sasl)
            .idle_time_out(IDLE_TIMEOUT_MS)
            .scheme("amqp");
        let connection = match &self.tls {
            Some(tls) => {
                let name = ServerName::try_from(host.to_owned()).map_err(|e| {
                    Failure::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
                })?;
                let stream = tls.connect(name, tcp).await.map_err(Failure::Io)?;
                builder.open_with_stream(stream).await
            }
            None => builder.open_with_stream(tcp).await,
        }
        .map_err(Failure::Open)?;
        Ok(connection)
    }

    /// The cached link for `address` (attaching it, and connecting, if needed), with the
    /// generation of the connection it belongs to.
    async fn link(&self, address: &str) -> Result<(u64, Arc<Link>), Failure> {
        let asked = Instant::now();
        let mut state = self.state.lock().await;
        if let Some(conn) = state.conn.as_mut().filter(|c| !c.connection.is_closed()) {
            match conn.links.get(address) {
                Some(link) if link.is_usable() => return Ok((conn.generation, link.clone())),
                Some(_) => {
                    conn.links.remove(address);
                }
                None => {}
            }
        } else if let Some((at, e)) = &state.failure {
            if *at > asked {
                // Someone else just tried while we waited: share the outcome.
                return Err(Failure::Shared(e.clone()));
            }
        }
        if let Err(failure) = self.ensure_connected(&mut state).await {
            state.failure = Some((Instant::now(), classify(&failure, address)));
            return Err(failure);
        }
        state.failure = None;
        let conn = state.conn.as_mut().expect("connected above");
        let timeout = self.config.connect_timeout;
        let attach = async {
            let mut session = Session::begin(&mut conn.connection)
                .await
                .map_err(Failure::Begin)?;
            let sender = Sender::builder()
                .name(format!("outbox-{}", uuid::Uuid::now_v7()))
                .target(address.to_owned())
                .sender_settle_mode(SenderSettleMode::Unsettled)
                .attach(&mut session)
                .await
                .map_err(Failure::Attach)?;
            Ok::<_, Failure>(Link {
                sender: Mutex::new(sender),
                session: std::sync::Mutex::new(session),
            })
        };
        let link = tokio::time::timeout(timeout, attach)
            .await
            .map_err(|_| Failure::ConnectTimeout(timeout))??;
        let link = Arc::new(link);
        conn.links.insert(address.to_owned(), link.clone());
        Ok((conn.generation, link))
    }

    /// Tears down what `failure` broke, if it is still the same connection and link.
    async fn repair(&self, failure: &Failure, generation: Option<u64>, address: &str) {
        let broken = broken(failure);
        if broken == Broken::Nothing {
            return;
        }
        let mut state = self.state.lock().await;
        let Some(conn) = state.conn.as_mut() else {
            return;
        };
        if generation.is_some_and(|g| g != conn.generation) {
            return;
        }
        match broken {
            Broken::Nothing => {}
            Broken::Link => {
                conn.links.remove(address);
            }
            Broken::Connection => state.conn = None,
        }
    }

    async fn send(&self, message: &Message, address: &str) -> Result<(), PublishError> {
        let (generation, link) = match self.link(address).await {
            Ok(found) => found,
            Err(failure) => {
                self.repair(&failure, None, address).await;
                return Err(classify(&failure, address));
            }
        };
        let sendable = Sendable::builder()
            .message(amqp_message(message))
            .settled(false)
            .build();
        let timeout = self.config.ack_timeout;
        let result = tokio::time::timeout(timeout, async {
            let delivery = link.sender.lock().await.send_batchable(sendable).await?;
            delivery.await
        })
        .await;
        let failure = match result {
            Ok(Ok(Outcome::Accepted(_))) => return Ok(()),
            Ok(Ok(outcome)) => Failure::Outcome(outcome),
            Ok(Err(e)) => Failure::Send(e),
            Err(_) => Failure::AckTimeout(timeout),
        };
        self.repair(&failure, Some(generation), address).await;
        Err(classify(&failure, address))
    }
}

/// The AMQP 1.0 message for an event: one `Data` section with the payload bytes; `message-id`
/// = event id (Service Bus `MessageId`, its duplicate detection key), `group-id` = aggregate id
/// (Service Bus `SessionId`), `subject` = event type, `content-type`, `creation-time` =
/// occurred at; every header as an application property (string); durable.
pub(crate) fn amqp_message(message: &Message) -> AmqpMessage<Data> {
    let mut properties = ApplicationProperties::default();
    message.visit_headers(|name, value| {
        properties.insert(name.to_owned(), SimpleValue::String(value.to_owned()));
    });
    AmqpMessage::builder()
        .header(Header::builder().durable(true).build())
        .properties(
            Properties::builder()
                .message_id(message.message_id.to_string())
                .group_id(message.aggregate_id.clone())
                .subject(message.event_type.clone())
                .content_type(Symbol::from(message.content_type.as_str()))
                .creation_time(Timestamp::from_milliseconds(
                    message.occurred_at.timestamp_millis(),
                ))
                .build(),
        )
        .application_properties(properties)
        .data(Binary::from(message.payload.to_vec()))
        .build()
}

fn tls_connector() -> Result<TlsConnector, Error> {
    let roots = rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::broker("servicebus: TLS setup", e))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

impl Publisher for ServiceBusPublisher {
    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            check_payload_size(message, self.config.max_payload_bytes)?;
            self.check_destination(&message.destination)?;
            let address = self.address_of(&message.destination);
            self.send(message, &address).await
        })
    }

    fn name(&self) -> &'static str {
        if self.is_service_bus() {
            "servicebus"
        } else {
            "amqp1"
        }
    }

    fn max_payload_bytes(&self) -> usize {
        self.config.max_payload_bytes
    }

    fn check_destination(&self, destination: &str) -> Result<(), PublishError> {
        check_entity(
            destination,
            self.is_service_bus(),
            &self.config.entity_prefixes,
        )
    }
}

/// Path segments of a Service Bus entity that lead to something other than the entity:
/// a topic's subscriptions and their rules (the `$`-prefixed subqueues, `$DeadLetterQueue`
/// and `$Transfer`, and nodes such as `$management` and `$cbs` are refused by the character
/// rule).
const SERVICE_BUS_SUB_PATHS: [&str; 2] = ["subscriptions", "rules"];

/// Refuses, as permanent, a destination the relay may not send to; the error names it and the
/// rule. Any broker: non-empty printable text, not a `$` node (`$management`, `$cbs`: the
/// broker's management and authorisation endpoints), inside `servicebus.entity_prefixes` when
/// that is set. Service Bus: an entity name (letters, digits, `.`, `-`, `_`, `/` between
/// segments that start and end with a letter or digit, at most 260 characters), none of whose
/// segments reaches a subscription or rule. A generic broker: at most 255 bytes.
fn check_entity(
    destination: &str,
    service_bus: bool,
    prefixes: &[String],
) -> Result<(), PublishError> {
    if destination.is_empty() || destination.chars().any(char::is_control) {
        return Err(PublishError::permanent(
            "amqp1: destination must be non-empty printable text",
        ));
    }
    if destination.starts_with('$') {
        return Err(PublishError::permanent(format!(
            "amqp1: destination {destination:?} refused: '$' nodes are the broker's own \
             ($management, $cbs)"
        )));
    }
    if service_bus {
        let ok = destination.len() <= 260
            && destination.split('/').all(|segment| {
                segment.starts_with(|c: char| c.is_ascii_alphanumeric())
                    && segment.ends_with(|c: char| c.is_ascii_alphanumeric())
                    && segment
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
            });
        if !ok {
            return Err(PublishError::permanent(format!(
                "servicebus: {destination:?} is not a valid entity name (letters, digits, \
                 '.', '-', '_', '/' between segments that start and end with a letter or \
                 digit; at most 260 characters; no '$' subqueue)"
            )));
        }
        let sub_path = destination.split('/').skip(1).find(|segment| {
            SERVICE_BUS_SUB_PATHS
                .iter()
                .any(|s| s.eq_ignore_ascii_case(segment))
        });
        if let Some(segment) = sub_path {
            return Err(PublishError::permanent(format!(
                "servicebus: destination {destination:?} refused: its segment {segment:?} \
                 leads to a topic's subscriptions or rules, not to an entity"
            )));
        }
    } else if destination.len() > 255 {
        return Err(PublishError::permanent(format!(
            "amqp1: destination is {} bytes, over 255",
            destination.len()
        )));
    }
    crate::wire::routing::check_prefixes("servicebus.entity_prefixes", destination, prefixes)
}

#[cfg(test)]
mod tests {
    use fe2o3_amqp_types::{
        definitions::AmqpError,
        messaging::{Modified, Rejected, Released},
        primitives::Value,
    };

    use super::*;
    use crate::publisher::FailureClass;

    fn rejected(condition: impl Into<ErrorCondition>, description: &str) -> Failure {
        Failure::Outcome(Outcome::Rejected(Rejected {
            error: Some(definitions::Error::new(
                condition,
                Some(description.to_owned()),
                None,
            )),
        }))
    }

    #[test]
    fn outcomes_are_classified() {
        let e = classify(&rejected(AmqpError::InvalidField, "bad session id"), "q");
        assert_eq!(e.class, FailureClass::Permanent);
        assert!(
            e.message.contains("amqp:invalid-field: bad session id"),
            "{e}"
        );
        let busy = rejected(
            ErrorCondition::Custom(Symbol::from("com.microsoft:server-busy")),
            "throttled",
        );
        assert_eq!(classify(&busy, "q").class, FailureClass::Transient);
        let released = Failure::Outcome(Outcome::Released(Released {}));
        assert_eq!(classify(&released, "q").class, FailureClass::Transient);
        let modified = Failure::Outcome(Outcome::Modified(Modified {
            delivery_failed: Some(true),
            undeliverable_here: None,
            message_annotations: None,
        }));
        assert_eq!(classify(&modified, "q").class, FailureClass::Transient);
        let timeout = Failure::AckTimeout(Duration::from_secs(1));
        assert_eq!(classify(&timeout, "q").class, FailureClass::Transient);
        assert_eq!(broken(&timeout), Broken::Link);
        let missing = Failure::Attach(SenderAttachError::RemoteClosedWithError(
            definitions::Error::new(AmqpError::NotFound, Some("no exchange".into()), None),
        ));
        let e = classify(&missing, "/exchange/x/k");
        assert_eq!(e.class, FailureClass::Permanent, "{e}");
        let session_ended = Failure::Attach(SenderAttachError::SessionStopped(
            SessionStopReason::RemoteEndedWithError(definitions::Error::new(
                AmqpError::NotFound,
                Some("NOT_FOUND - no exchange 'x' in vhost '/'".into()),
                None,
            )),
        ));
        let e = classify(&session_ended, "/exchange/x/k");
        assert_eq!(e.class, FailureClass::Permanent, "{e}");
        assert!(e.message.contains("no exchange 'x'"), "{e}");
        assert_eq!(broken(&session_ended), Broken::Link);
        let refused = Failure::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(classify(&refused, "q").class, FailureClass::Transient);
        assert_eq!(broken(&refused), Broken::Connection);
    }

    #[test]
    fn message_carries_ids_and_headers() {
        let m = crate::wire::message::sample(3, "agg-7");
        let amqp = amqp_message(&m);
        let props = amqp.properties.as_ref().unwrap();
        assert_eq!(
            props.message_id,
            Some(m.event_id.to_string().into()),
            "message-id is the event id"
        );
        assert_eq!(props.group_id.as_deref(), Some("agg-7"));
        assert_eq!(props.subject.as_deref(), Some("OrderPlaced"));
        assert_eq!(
            props.content_type.as_ref().map(|s| s.0.as_str()),
            Some("application/json")
        );
        assert!(amqp.header.as_ref().unwrap().durable);
        assert_eq!(amqp.body.0.as_ref(), b"{}");
        let app = amqp.application_properties.as_ref().unwrap();
        let mut expected = m.broker_headers();
        expected.sort();
        let mut got: Vec<(String, String)> = app
            .iter()
            .map(|(k, v)| match v {
                SimpleValue::String(s) => (k.clone(), s.clone()),
                other => panic!("{k} is not a string: {other:?}"),
            })
            .collect();
        got.sort();
        assert_eq!(got, expected);
        let _ = Value::Null;
    }

    #[test]
    fn addresses_and_destinations() {
        let p = ServiceBusPublisher::new(ServiceBusConfig {
            address: Some("/exchange/ev/{destination}".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(p.address_of("order.placed"), "/exchange/ev/order.placed");
        assert_eq!(p.name(), "amqp1");
        assert!(p.check_destination("order.placed").is_ok());
        assert!(p.check_destination("").is_err());
        let sb = ServiceBusPublisher::new(ServiceBusConfig {
            connection_string: "Endpoint=sb://ns.servicebus.windows.net/;\
                                SharedAccessKeyName=k;SharedAccessKey=v"
                .into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(sb.name(), "servicebus");
        assert_eq!(sb.address_of("orders"), "orders");
        assert!(sb.check_destination("orders/sub-1").is_ok());
        let e = sb.check_destination("orders placed").unwrap_err();
        assert_eq!(e.class, FailureClass::Permanent);
    }

    /// System nodes, subqueues and subscription paths are refused naming the destination and
    /// the rule; prefixes narrow what is left.
    #[test]
    fn system_nodes_and_subqueues_are_refused() {
        for (destination, rule) in [
            ("$management", "refused"),
            ("$cbs", "refused"),
            ("orders/$deadletterqueue", "not a valid"),
            ("orders/$DeadLetterQueue", "not a valid"),
            ("orders/Subscriptions/s1/$deadletterqueue", "not a valid"),
            ("orders/Subscriptions/s1", "subscriptions"),
            ("orders/subscriptions/s1/rules/r", "subscriptions"),
            ("/orders", "not a valid"),
            ("orders/", "not a valid"),
            ("orders//x", "not a valid"),
            ("orders/.x", "not a valid"),
        ] {
            let error = check_entity(destination, true, &[]).unwrap_err();
            assert_eq!(error.class, FailureClass::Permanent, "{destination}");
            assert!(
                error.message.contains(&format!("{destination:?}")),
                "{error}"
            );
            assert!(error.message.contains(rule), "{error}");
        }
        check_entity("orders", true, &[]).unwrap();
        check_entity("shop/orders.v2", true, &[]).unwrap();
        // A generic broker: '$' nodes refused, paths are the template's business.
        assert!(check_entity("$management", false, &[]).is_err());
        check_entity("ev/order.placed", false, &[]).unwrap();
        let prefixes = vec!["ev/".to_owned()];
        check_entity("ev/order.placed", false, &prefixes).unwrap();
        let error = check_entity("amq.topic/x", false, &prefixes).unwrap_err();
        assert!(
            error.message.contains("servicebus.entity_prefixes"),
            "{error}"
        );
    }
}
