//! AMQP 1.0 (the Service Bus publisher's generic flavour) against RabbitMQ's `rabbitmq_amqp1_0`
//! plugin (3.10): unsettled transfers to `/exchange/X/routing-key`. The test's exchange, queue
//! and binding are declared with lapin (AMQP 0-9-1); messages are read back over AMQP 1.0 with
//! an fe2o3 receiver on `/amq/queue/Q`, because RabbitMQ 3.10 hands 0-9-1 consumers the
//! AMQP 1.0 application properties as one encoded `x-amqp-1.0-app-properties` header, not as
//! headers (asserted in `what_a_091_consumer_sees`). RabbitMQ has no broker-side dedupe.
//! Azure Service Bus itself is exercised by `servicebus_live`, skipped unless a namespace is
//! configured.

use std::{
    collections::BTreeMap,
    process::Command,
    sync::{Arc, Mutex},
};

use fe2o3_amqp::{types::messaging::Data, Connection, Receiver, Session};
use fe2o3_amqp_types::primitives::SimpleValue;
use futures::StreamExt;
use lapin::{
    options::{BasicAckOptions, BasicConsumeOptions},
    types::{AMQPValue, FieldTable},
    ConnectionProperties,
};
use outbox_relayer::{
    publishers::servicebus::{ServiceBusConfig, ServiceBusPublisher},
    Publisher,
};
use outbox_testkit::{free_port, unique, wait_until, BrokerProcess, Delivery, RabbitReader};

use crate::{
    rabbitmq::private_rabbitmq,
    suite::{message, publish_until_acked, Harness, WAIT},
};

/// A topic exchange and a queue bound to it (declared over 0-9-1), read over AMQP 1.0.
struct Reader {
    /// Declares the exchange, queue and binding (without consuming) and deletes them.
    declared: RabbitReader,
    seen: Arc<Mutex<Vec<Delivery>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Reader {
    async fn start(port: u16, exchange: &str, binding: &str) -> Result<Self, String> {
        let url = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
        let declared = RabbitReader::try_declare_only(&url, exchange, binding).await?;
        let queue = declared.queue.clone();
        let mut amqp1 = Connection::open(
            unique("reader"),
            format!("amqp://guest:guest@127.0.0.1:{port}").as_str(),
        )
        .await
        .map_err(|e| format!("amqp 1.0 connect: {e}"))?;
        let mut session = Session::begin(&mut amqp1)
            .await
            .map_err(|e| format!("amqp 1.0 session: {e}"))?;
        let mut receiver = Receiver::attach(
            &mut session,
            unique("reader"),
            format!("/amq/queue/{queue}"),
        )
        .await
        .map_err(|e| format!("amqp 1.0 receiver: {e}"))?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let task = tokio::spawn(async move {
            let _keep = (amqp1, session);
            while let Ok(delivery) = receiver.recv::<Data>().await {
                sink.lock().unwrap().push(decode(delivery.message()));
                let _ = receiver.accept(&delivery).await;
            }
        });
        Ok(Self {
            declared,
            seen,
            task,
        })
    }

    async fn wait_for(&self, n: usize) -> Vec<Delivery> {
        wait_until(
            &format!("{n} messages on {}", self.declared.queue),
            WAIT,
            || {
                let len = self.seen.lock().unwrap().len();
                async move { len >= n }
            },
        )
        .await;
        self.seen.lock().unwrap().clone()
    }

    async fn cleanup(self) {
        self.task.abort();
        self.declared.cleanup().await;
    }
}

/// A delivery's application properties as headers, plus its AMQP 1.0 properties as
/// `amqp.*` entries.
fn decode(m: &fe2o3_amqp::types::messaging::Message<Data>) -> Delivery {
    let mut headers = BTreeMap::new();
    for (name, value) in m.application_properties.iter().flat_map(|a| a.iter()) {
        let text = match value {
            SimpleValue::String(s) => s.clone(),
            other => format!("{other:?}"),
        };
        headers.insert(name.clone(), text);
    }
    if let Some(p) = &m.properties {
        let fields = [
            (
                "amqp.message_id",
                p.message_id.as_ref().map(|id| match id {
                    fe2o3_amqp::types::messaging::MessageId::String(s) => s.clone(),
                    other => format!("{other:?}"),
                }),
            ),
            ("amqp.group_id", p.group_id.clone()),
            ("amqp.subject", p.subject.clone()),
            (
                "amqp.content_type",
                p.content_type.as_ref().map(|s| s.0.clone()),
            ),
            (
                "amqp.creation_time",
                p.creation_time
                    .as_ref()
                    .map(|t| t.milliseconds().to_string()),
            ),
        ];
        for (name, value) in fields {
            if let Some(value) = value {
                headers.insert(name.to_owned(), value);
            }
        }
    }
    if let Some(h) = &m.header {
        headers.insert("amqp.durable".into(), h.durable.to_string());
    }
    Delivery::from_headers(String::new(), headers, m.body.0.to_vec())
}

pub struct Amqp1 {
    /// AMQP 1.0 URL (the publisher's).
    url: String,
    /// The broker's port (the reader's, over both protocols).
    port: u16,
    exchange: String,
    prefix: String,
    reader: Option<Reader>,
}

impl Harness for Amqp1 {
    const DEDUPES: bool = false;

    fn shared_url() -> String {
        "amqp1://guest:guest@127.0.0.1:5672".into()
    }

    fn private_url(port: u16) -> String {
        format!("amqp1://guest:guest@127.0.0.1:{port}")
    }

    fn private_server(broker: &BrokerProcess) -> Command {
        private_rabbitmq(broker, "rabbitmq_amqp1_0")
    }

    fn new(url: String) -> Self {
        let port = url
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .expect("url with a port");
        Self {
            url,
            port,
            exchange: unique("amqp1"),
            prefix: unique("amqp1"),
            reader: None,
        }
    }

    async fn prepare(&mut self) -> Result<(), String> {
        if self.reader.is_none() {
            let binding = format!("{}.#", self.prefix);
            self.reader = Some(Reader::start(self.port, &self.exchange, &binding).await?);
        }
        Ok(())
    }

    /// `EXCHANGE/ROUTING-KEY`: the publisher's address template is `/exchange/{destination}`,
    /// so a test can also name an exchange that does not exist.
    fn destination(&self, i: usize) -> String {
        format!("{}/{}.d{i}.OrderPlaced", self.exchange, self.prefix)
    }

    fn unroutable(&self) -> Option<String> {
        // RabbitMQ 3.10's AMQP 1.0 plugin accepts (and drops) a message its exchange routes to
        // no queue: that is not detectable. An exchange that does not exist is: the broker
        // refuses the sender link with amqp:not-found.
        Some(format!("{}/{}.OrderPlaced", unique("missing"), self.prefix))
    }

    async fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(
            ServiceBusPublisher::connect(ServiceBusConfig {
                connection_string: self.url.clone(),
                address: Some("/exchange/{destination}".into()),
                ..Default::default()
            })
            .await
            .expect("amqp 1.0 publisher"),
        )
    }

    async fn read(&self, n: usize) -> Vec<Delivery> {
        self.reader.as_ref().expect("prepared").wait_for(n).await
    }

    async fn cleanup(self) {
        if let Some(reader) = self.reader {
            reader.cleanup().await;
        }
    }
}

crate::conformance_tests!(Amqp1);

/// The AMQP 1.0 properties arrive as set: message-id = event id, group-id = aggregate id,
/// subject = event type, content type, creation time, durable.
#[tokio::test]
async fn amqp_properties_arrive() {
    let mut harness = Amqp1::new(Amqp1::shared_url());
    harness.prepare().await.expect("prepare");
    let publisher = harness.publisher().await;
    let m = message(harness.destination(0), "agg-props", 1, b"{\"a\":1}");
    publish_until_acked(&*publisher, &m).await;
    let read = harness.read(1).await;
    let h = &read[0].headers;
    let get = |k: &str| h.get(k).map(String::as_str);
    assert_eq!(
        get("amqp.message_id"),
        Some(m.event_id.to_string().as_str())
    );
    assert_eq!(get("amqp.group_id"), Some("agg-props"));
    assert_eq!(get("amqp.subject"), Some("OrderPlaced"));
    assert_eq!(get("amqp.content_type"), Some("application/json"));
    assert_eq!(
        get("amqp.creation_time"),
        Some(m.occurred_at.timestamp_millis().to_string().as_str())
    );
    assert_eq!(get("amqp.durable"), Some("true"));
    assert_eq!(get("aggregate-type"), Some("order"));
    harness.cleanup().await;
}

/// What an AMQP 0-9-1 consumer of the same queue gets from RabbitMQ 3.10: the payload, the
/// message id and persistence, but the application properties only as one encoded AMQP 1.0
/// section in the `x-amqp-1.0-app-properties` header (RabbitMQ 4's native AMQP 1.0 maps them
/// to headers; not tested here).
#[tokio::test]
async fn what_a_091_consumer_sees() {
    let exchange = unique("amqp1");
    let connection = lapin::Connection::connect(
        outbox_testkit::RABBITMQ_URL,
        ConnectionProperties::default(),
    )
    .await
    .expect("connect");
    let channel = connection.create_channel().await.expect("channel");
    let declared = RabbitReader::declare_only(&exchange, "#").await;
    let queue = declared.queue.clone();
    let publisher = ServiceBusPublisher::connect(ServiceBusConfig {
        connection_string: Amqp1::shared_url(),
        address: Some(format!("/exchange/{exchange}/{{destination}}")),
        ..Default::default()
    })
    .await
    .expect("publisher");
    let m = message("order.placed".into(), "agg-091", 1, b"{}");
    publish_until_acked(&publisher, &m).await;
    let mut consumer = channel
        .basic_consume(
            &queue,
            "test",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let delivery = tokio::time::timeout(WAIT, consumer.next())
        .await
        .expect("a delivery within the wait")
        .expect("stream open")
        .expect("delivery");
    delivery.ack(BasicAckOptions::default()).await.expect("ack");
    let props = &delivery.properties;
    assert_eq!(delivery.data, b"{}");
    assert_eq!(
        props.message_id().as_ref().map(|s| s.to_string()),
        Some(m.event_id.to_string())
    );
    assert_eq!(*props.delivery_mode(), Some(2));
    let headers = props.headers().clone().unwrap_or_default();
    let names: Vec<String> = headers.inner().keys().map(|k| k.to_string()).collect();
    assert!(
        !names.iter().any(|n| n == "event-id"),
        "RabbitMQ 3.10 does not map application properties to headers: {names:?}"
    );
    let Some(AMQPValue::LongString(section)) = headers.inner().get("x-amqp-1.0-app-properties")
    else {
        panic!("the application properties section is kept as a header: {names:?}");
    };
    let app: fe2o3_amqp::types::messaging::ApplicationProperties =
        serde_amqp::from_slice(section.as_bytes()).expect("an encoded application-properties");
    assert_eq!(
        app.get("event-id"),
        Some(&SimpleValue::String(m.event_id.to_string()))
    );
    declared.cleanup().await;
}

/// Prepares `harness`, retrying while its (private) broker is still booting.
async fn prepare_when_up(harness: &mut Amqp1) {
    let deadline = std::time::Instant::now() + WAIT;
    while let Err(e) = harness.prepare().await {
        assert!(
            std::time::Instant::now() < deadline,
            "private broker never became ready: {e}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A connection that was up and is lost (the broker is killed) makes publishes fail as
/// transient, and the same publisher reconnects by itself once a broker is back on the port.
#[tokio::test]
async fn reconnects_after_the_connection_is_lost() {
    let port = free_port();
    let mut broker = BrokerProcess::prepare(port);
    broker.start(Amqp1::private_server(&broker)).await;
    let mut before = Amqp1::new(Amqp1::private_url(port));
    prepare_when_up(&mut before).await;
    let publisher = before.publisher().await;
    let first = message(before.destination(0), "agg-loss", 1, b"{}");
    publish_until_acked(&*publisher, &first).await;
    assert_eq!(before.read(1).await.len(), 1);

    broker.stop();
    let lost = message(before.destination(0), "agg-loss", 2, b"{}");
    let outcome = tokio::time::timeout(WAIT, publisher.publish(&lost))
        .await
        .expect("a publish on a lost connection must give up, not hang");
    match outcome {
        Err(e) if e.is_transient() => println!("connection lost: {}", e.message),
        other => panic!("a lost connection must fail as transient, got {other:?}"),
    }

    // A fresh node on the same port (its exchanges are new, so a new namespace).
    broker.start(Amqp1::private_server(&broker)).await;
    let mut after = Amqp1::new(Amqp1::private_url(port));
    prepare_when_up(&mut after).await;
    let again = message(after.destination(0), "agg-loss", 2, b"{}");
    publish_until_acked(&*publisher, &again).await;
    let read = after.read(1).await;
    assert_eq!(read[0].event_id, again.event_id.to_string());
    after.cleanup().await;
    broker.stop();
}

/// Azure Service Bus itself, when a namespace is configured (skipped otherwise, with the
/// reason printed): `OUTBOX_TEST_SERVICEBUS_CONNECTION_STRING` (a SAS connection string with
/// Send and Listen rights) and `OUTBOX_TEST_SERVICEBUS_QUEUE` (a queue with sessions enabled).
/// Publishes two aggregates' events with their aggregate ids as session ids and reads each
/// session back over AMQP 1.0 with a session receiver, checking order, ids and properties.
/// With `OUTBOX_TEST_SERVICEBUS_DUPLICATE_DETECTION=true` (the queue has duplicate detection
/// on), a second publish of one event must not arrive: the next message in its session is a
/// marker published after it.
#[tokio::test]
async fn servicebus_live() {
    let (Ok(connection_string), Ok(queue)) = (
        std::env::var("OUTBOX_TEST_SERVICEBUS_CONNECTION_STRING"),
        std::env::var("OUTBOX_TEST_SERVICEBUS_QUEUE"),
    ) else {
        println!(
            "skipped: set OUTBOX_TEST_SERVICEBUS_CONNECTION_STRING and \
             OUTBOX_TEST_SERVICEBUS_QUEUE (a session-enabled queue) to run against Azure \
             Service Bus"
        );
        return;
    };
    let dedupe = std::env::var("OUTBOX_TEST_SERVICEBUS_DUPLICATE_DETECTION")
        .is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    let publisher = ServiceBusPublisher::connect(ServiceBusConfig {
        connection_string: connection_string.clone(),
        ..Default::default()
    })
    .await
    .expect("service bus publisher");
    assert_eq!(publisher.name(), "servicebus");
    let sessions = [unique("agg"), unique("agg")];
    let mut sent = Vec::new();
    for session in &sessions {
        for v in 1..=3 {
            let m = message(queue.clone(), session, v, b"{\"live\":true}");
            publish_until_acked(&publisher, &m).await;
            sent.push(m);
        }
    }
    if dedupe {
        publish_until_acked(&publisher, &sent[0]).await;
        let marker = message(queue.clone(), &sessions[0], 4, b"{\"live\":true}");
        publish_until_acked(&publisher, &marker).await;
        sent.push(marker);
    }
    let (host, key_name, key) = azure_parts(&connection_string);
    let tcp = tokio::net::TcpStream::connect((host.as_str(), 5671))
        .await
        .expect("tcp to the namespace");
    let roots = tokio_rustls::rustls::RootCertStore::from_iter(
        webpki_roots::TLS_SERVER_ROOTS.iter().cloned(),
    );
    let tls = tokio_rustls::rustls::ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("tls versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(
            tokio_rustls::rustls::pki_types::ServerName::try_from(host.clone()).expect("name"),
            tcp,
        )
        .await
        .expect("tls handshake");
    let mut connection = Connection::builder()
        .container_id(unique("reader"))
        .hostname(host.as_str())
        .sasl_profile(fe2o3_amqp::sasl_profile::SaslProfile::Plain {
            username: key_name,
            password: key,
        })
        .scheme("amqp")
        .open_with_stream(stream)
        .await
        .expect("open");
    let mut session = Session::begin(&mut connection).await.expect("session");
    for id in &sessions {
        let source = fe2o3_amqp::types::messaging::Source::builder()
            .address(queue.clone())
            .add_to_filter_using_legacy_format(
                "com.microsoft:session-filter",
                fe2o3_amqp::types::primitives::Value::String(id.clone()),
            )
            .build();
        let mut receiver = Receiver::builder()
            .name(unique("session-reader"))
            .source(source)
            .attach(&mut session)
            .await
            .expect("session receiver");
        let expected: Vec<_> = sent.iter().filter(|m| &m.aggregate_id == id).collect();
        for m in expected {
            let delivery = tokio::time::timeout(WAIT, receiver.recv::<Data>())
                .await
                .expect("a message within the wait")
                .expect("receive");
            let d = decode(delivery.message());
            receiver.accept(&delivery).await.expect("accept");
            assert_eq!(d.event_id, m.event_id.to_string(), "session {id} in order");
            assert_eq!(
                d.headers.get("amqp.message_id"),
                Some(&m.event_id.to_string())
            );
            assert_eq!(d.headers.get("amqp.group_id"), Some(id));
            assert_eq!(d.payload, b"{\"live\":true}");
        }
        let _ = receiver.close().await;
    }
    let _ = session.end().await;
    let _ = connection.close().await;
}

/// Host, key name and key of an Azure connection string.
fn azure_parts(connection_string: &str) -> (String, String, String) {
    let mut host = None;
    let mut key_name = None;
    let mut key = None;
    for part in connection_string.split(';') {
        match part.split_once('=') {
            Some(("Endpoint", v)) => {
                host = v
                    .trim_start_matches("sb://")
                    .split('/')
                    .next()
                    .map(str::to_owned)
            }
            Some(("SharedAccessKeyName", v)) => key_name = Some(v.to_owned()),
            Some(("SharedAccessKey", v)) => key = Some(v.to_owned()),
            _ => {}
        }
    }
    (
        host.expect("Endpoint in the connection string"),
        key_name.expect("SharedAccessKeyName in the connection string"),
        key.expect("SharedAccessKey in the connection string"),
    )
}
