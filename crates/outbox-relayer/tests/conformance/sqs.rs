//! AWS SQS, against moto's emulator: `SendMessageBatch` acceptance as the ack, standard and
//! FIFO queues (FIFO: group id = ordering key, deduplication id = event id), attributes and
//! the `outbox-headers` JSON attribute decoded back into headers. Read back with the SDK's
//! `ReceiveMessage` (all attributes, long poll of 1s) and deleted once read.
//!
//! Standard queues promise no order on AWS. moto delivers them in order, so the order test
//! passes on the standard harness too; that says nothing about AWS (docs/brokers/sqs.md).
//!
//! The shared moto runs on 127.0.0.1:4566 (`scripts/tools/sqs.sh`); the binary is
//! `/opt/outbox-tools/moto/bin/moto_server` unless `OUTBOX_MOTO_SERVER` names another.

use std::{collections::BTreeMap, process::Command, sync::Arc, time::Instant};

use aws_sdk_sqs::{
    config::{BehaviorVersion, Credentials, Region, SharedCredentialsProvider},
    types::{DeleteMessageBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName},
    Client,
};
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
use outbox_relayer::{
    publishers::sqs::{
        decode_body, decode_headers, SqsConfig, SqsPublisher, BODY_ENCODING_ATTRIBUTE,
    },
    Publisher,
};
use outbox_testkit::{unique, BrokerProcess, Delivery, Report};

use crate::suite::{self, Harness, WAIT};

/// The shared emulator, as a broker URL.
pub const SQS_URL: &str = "sqs+http://127.0.0.1:4566";

fn moto_server() -> String {
    std::env::var("OUTBOX_MOTO_SERVER")
        .unwrap_or_else(|_| "/opt/outbox-tools/moto/bin/moto_server".into())
}

/// SDK settings for the tests: dummy credentials and a region, for this client only.
fn sdk_config() -> aws_config::SdkConfig {
    aws_config::SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "test",
            "test",
            None,
            None,
            "outbox-conformance",
        )))
        .http_client(
            aws_smithy_http_client::Builder::new()
                .tls_provider(Provider::Rustls(CryptoMode::Ring))
                .build_https(),
        )
        .build()
}

/// One namespace of queues (`{prefix}-d{i}`, with `.fifo` for FIFO queues) on one endpoint.
pub struct Sqs<const FIFO: bool> {
    url: String,
    prefix: String,
    client: Client,
    /// Queue URLs by destination index, once created.
    queues: Vec<String>,
}

/// Standard queues: at-least-once, no order, no dedupe.
pub type SqsStandard = Sqs<false>;
/// FIFO queues: order per message group, dedupe within 5 minutes.
pub type SqsFifo = Sqs<true>;

/// Destinations the suite uses (`destination(i % 4)`).
const QUEUES: usize = 4;

impl<const FIFO: bool> Sqs<FIFO> {
    fn suffix() -> &'static str {
        if FIFO {
            ".fifo"
        } else {
            ""
        }
    }

    fn config(&self) -> SqsConfig {
        let mut config = SqsConfig::default();
        config.apply_broker_url(&self.url).expect("sqs broker URL");
        config
    }

    /// One `ReceiveMessage` on queue `i`; deletes what it got.
    async fn receive(&self, i: usize, wait_seconds: i32) -> Vec<Delivery> {
        let url = &self.queues[i];
        let answer = self
            .client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(wait_seconds)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await
            .expect("receive");
        let mut deliveries = Vec::new();
        let mut receipts = Vec::new();
        for m in answer.messages() {
            let attributes: Vec<(String, String)> = m
                .message_attributes()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.string_value().unwrap_or("").to_owned()))
                .collect();
            let encoding = attributes
                .iter()
                .find(|(k, _)| k == BODY_ENCODING_ATTRIBUTE)
                .map(|(_, v)| v.clone());
            let payload =
                decode_body(m.body().unwrap_or(""), encoding.as_deref()).expect("decodable body");
            let headers = decode_headers(attributes).expect("decodable headers");
            let delivery = Delivery::from_headers(self.destination(i), headers, payload);
            if FIFO {
                let system = m.attributes().cloned().unwrap_or_default();
                assert_eq!(
                    system.get(&MessageSystemAttributeName::MessageGroupId),
                    Some(&format!(
                        "{}:{}",
                        delivery.aggregate_type, delivery.aggregate_id
                    )),
                    "the group id is the ordering key"
                );
                assert_eq!(
                    system.get(&MessageSystemAttributeName::MessageDeduplicationId),
                    Some(&delivery.event_id),
                    "the deduplication id is the event id"
                );
            }
            deliveries.push(delivery);
            receipts.push(m.receipt_handle().unwrap_or_default().to_owned());
        }
        if !receipts.is_empty() {
            let mut delete = self.client.delete_message_batch().queue_url(url);
            for (n, receipt) in receipts.into_iter().enumerate() {
                delete = delete.entries(
                    DeleteMessageBatchRequestEntry::builder()
                        .id(n.to_string())
                        .receipt_handle(receipt)
                        .build()
                        .expect("entry"),
                );
            }
            delete.send().await.expect("delete what was read");
        }
        deliveries
    }
}

impl<const FIFO: bool> Harness for Sqs<FIFO> {
    const DEDUPES: bool = FIFO;

    fn shared_url() -> String {
        SQS_URL.into()
    }

    fn private_url(port: u16) -> String {
        format!("sqs+http://127.0.0.1:{port}")
    }

    fn private_server(broker: &BrokerProcess) -> Command {
        let mut command = Command::new(moto_server());
        command
            .args(["-H", "127.0.0.1", "-p", &broker.port.to_string()])
            .current_dir(&broker.dir);
        command
    }

    fn new(url: String) -> Self {
        let endpoint = url
            .strip_prefix("sqs+")
            .expect("an sqs+http URL")
            .to_owned();
        let client = Client::from_conf(
            aws_sdk_sqs::config::Builder::from(&sdk_config())
                .endpoint_url(endpoint)
                .build(),
        );
        Self {
            url,
            prefix: unique("conf"),
            client,
            queues: Vec::new(),
        }
    }

    async fn prepare(&mut self) -> Result<(), String> {
        while self.queues.len() < QUEUES {
            let name = self.destination(self.queues.len());
            let mut create = self.client.create_queue().queue_name(&name);
            if FIFO {
                create = create
                    .attributes(QueueAttributeName::FifoQueue, "true")
                    .attributes(QueueAttributeName::ContentBasedDeduplication, "false");
            }
            let created = create
                .send()
                .await
                .map_err(|e| format!("create queue {name}: {e:?}"))?;
            let url = created
                .queue_url()
                .ok_or_else(|| format!("create queue {name}: no URL"))?;
            self.queues.push(url.to_owned());
        }
        Ok(())
    }

    fn destination(&self, i: usize) -> String {
        format!("{}-d{i}{}", self.prefix, Self::suffix())
    }

    fn unroutable(&self) -> Option<String> {
        // A queue nobody created.
        Some(format!("{}-nowhere{}", unique("conf"), Self::suffix()))
    }

    async fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(
            SqsPublisher::from_sdk_config(self.config(), &sdk_config()).expect("sqs publisher"),
        )
    }

    async fn read(&self, n: usize) -> Vec<Delivery> {
        let deadline = Instant::now() + WAIT;
        let mut per_queue: Vec<Vec<Delivery>> = vec![Vec::new(); self.queues.len()];
        while per_queue.iter().map(Vec::len).sum::<usize>() < n {
            assert!(
                Instant::now() < deadline,
                "timed out after {WAIT:?} waiting for {n} messages, got {per_queue:?}"
            );
            for (i, read) in per_queue.iter_mut().enumerate() {
                read.extend(self.receive(i, 1).await);
            }
        }
        // Anything beyond `n` that is already there (a duplicate the suite must see).
        for (i, read) in per_queue.iter_mut().enumerate() {
            read.extend(self.receive(i, 0).await);
        }
        per_queue.concat()
    }

    async fn cleanup(self) {
        for url in &self.queues {
            let _ = self.client.delete_queue().queue_url(url).send().await;
        }
    }
}

mod standard {
    crate::conformance_tests!(super::SqsStandard);
}

mod fifo {
    crate::conformance_tests!(super::SqsFifo);

    /// Forty aggregates publish one message each at once to one queue: the publishes share
    /// `SendMessageBatch` requests and every one is acknowledged and arrives once.
    #[tokio::test]
    async fn concurrent_publishes_share_batches() {
        super::concurrent_publishes_share_batches::<super::SqsFifo>().await;
    }

    /// More writer headers than SQS's 10 attributes and a payload that is not text.
    #[tokio::test]
    async fn many_headers_and_binary_payloads_round_trip() {
        super::many_headers_and_binary_payloads_round_trip::<super::SqsFifo>().await;
    }
}

async fn concurrent_publishes_share_batches<H: Harness>() {
    let mut harness = H::new(H::shared_url());
    harness.prepare().await.expect("prepare");
    let publisher = harness.publisher().await;
    let sent: Vec<_> = (0..40)
        .map(|a| suite::message(harness.destination(0), &format!("agg-{a}"), 1, b"{}"))
        .collect();
    let results = futures::future::join_all(
        sent.iter()
            .map(|m| suite::publish_until_acked(&*publisher, m)),
    )
    .await;
    assert_eq!(results.len(), sent.len());
    let read = harness.read(sent.len()).await;
    let report = Report::of(&read);
    assert_eq!(report.unique, sent.len(), "{report:?}");
    assert_eq!(report.duplicates, 0, "{report:?}");
    harness.cleanup().await;
}

async fn many_headers_and_binary_payloads_round_trip<H: Harness>() {
    let mut harness = H::new(H::shared_url());
    harness.prepare().await.expect("prepare");
    let publisher = harness.publisher().await;
    let mut m = suite::message(
        harness.destination(1),
        "agg-bin",
        1,
        &[0xff, 0x00, 0xfe, 0x01],
    );
    for i in 0..12 {
        m.headers
            .insert(format!("x-extra-{i}"), format!("value {i}"));
    }
    suite::publish_until_acked(&*publisher, &m).await;
    let read = harness.read(1).await;
    assert_eq!(read.len(), 1, "{read:?}");
    assert_eq!(read[0].payload, [0xff, 0x00, 0xfe, 0x01]);
    let expected: BTreeMap<String, String> = m.broker_headers().into_iter().collect();
    assert_eq!(read[0].headers, expected);
    harness.cleanup().await;
}
