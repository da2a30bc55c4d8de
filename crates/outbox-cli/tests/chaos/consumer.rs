//! The independent consumer, with the broker's own client (nothing of the relay): a JetStream
//! stream read from its first message, recording every message the stream holds exactly once
//! by stream sequence, through broker restarts; or a RabbitMQ queue bound to the relay's
//! exchange, recording every message in queue order.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use async_nats::jetstream::{self, consumer, stream};
use futures::StreamExt;
use outbox_testkit::Delivery;
use tokio_util::sync::CancellationToken;

/// One message of the stream (what the verdict needs of it, to keep long runs small).
#[derive(Clone, Debug)]
pub struct Record {
    /// Stream sequence (NATS), position in the queue (RabbitMQ).
    pub sequence: u64,
    /// When the broker stored it (NATS: the end of the relay's part, commit to broker), or
    /// when the consumer received it (RabbitMQ).
    pub stored_at: SystemTime,
    /// `event-id` header.
    pub event_id: String,
    /// `aggregate-type` header.
    pub aggregate_type: String,
    /// `aggregate-id` header.
    pub aggregate_id: String,
    /// `aggregate-version` header.
    pub version: Option<i64>,
}

impl Record {
    /// As the testkit's [`outbox_testkit::Report`] reads deliveries.
    pub fn delivery(&self) -> Delivery {
        Delivery {
            event_id: self.event_id.clone(),
            aggregate_type: self.aggregate_type.clone(),
            aggregate_id: self.aggregate_id.clone(),
            version: self.version,
            ..Default::default()
        }
    }
}

/// Reads the broker in the background: NATS, reconnecting and resuming after the last
/// sequence recorded whenever the broker goes away; RabbitMQ, consuming a queue.
pub struct Recorder {
    records: Arc<Mutex<Vec<Record>>>,
    resumes: Arc<Mutex<u64>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    /// Creates stream `name` (file storage, capturing `{prefix}.>`, the default two-minute
    /// duplicate window) on the server at `url` and starts reading it from the start.
    pub async fn nats(url: &str, name: &str, prefix: &str) -> Self {
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(url)
            .await
            .expect("connect to the private nats-server");
        let js = jetstream::new(client);
        js.get_or_create_stream(stream::Config {
            name: name.to_owned(),
            subjects: vec![format!("{prefix}.>")],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await
        .expect("create the stream");
        let records = Arc::new(Mutex::new(Vec::new()));
        let resumes = Arc::new(Mutex::new(0));
        let stop = CancellationToken::new();
        let task = tokio::spawn(read_nats(
            js,
            name.to_owned(),
            records.clone(),
            resumes.clone(),
            stop.clone(),
        ));
        Self {
            records,
            resumes,
            stop,
            task,
        }
    }

    /// Consumes `queue` on the RabbitMQ server at `url` (manual acks, after recording).
    pub async fn rabbitmq(url: &str, queue: &str) -> Self {
        let records = Arc::new(Mutex::new(Vec::new()));
        let resumes = Arc::new(Mutex::new(0));
        let stop = CancellationToken::new();
        let task = tokio::spawn(read_rabbitmq(
            url.to_owned(),
            queue.to_owned(),
            records.clone(),
            resumes.clone(),
            stop.clone(),
        ));
        Self {
            records,
            resumes,
            stop,
            task,
        }
    }

    /// Everything recorded so far, in stream order.
    pub fn records(&self) -> Vec<Record> {
        self.records_since(0)
    }

    /// The records after the first `n`.
    pub fn records_since(&self, n: usize) -> Vec<Record> {
        let records = self.records.lock().unwrap();
        records.get(n..).unwrap_or_default().to_vec()
    }

    /// How many times reading had to resume after an error (broker restarts).
    pub fn resumes(&self) -> u64 {
        *self.resumes.lock().unwrap()
    }

    /// Stops reading.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Silence after which the reader checks whether it is stalled.
const STALL: Duration = Duration::from_secs(2);

async fn read_nats(
    js: jetstream::Context,
    name: String,
    records: Arc<Mutex<Vec<Record>>>,
    resumes: Arc<Mutex<u64>>,
    stop: CancellationToken,
) {
    let mut last = 0u64;
    loop {
        let session = async {
            let mut stream = js.get_stream(&name).await.map_err(|e| e.to_string())?;
            let reader = stream
                .create_consumer(consumer::pull::OrderedConfig {
                    deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                        start_sequence: last + 1,
                    },
                    ..Default::default()
                })
                .await
                .map_err(|e| e.to_string())?;
            let mut messages = reader.messages().await.map_err(|e| e.to_string())?;
            loop {
                let message = match tokio::time::timeout(STALL, messages.next()).await {
                    Ok(Some(message)) => message.map_err(|e| e.to_string())?,
                    Ok(None) => break,
                    // Silence: fine if there is nothing new, a stall if the stream has more
                    // (after a broker restart the ordered consumer can take many seconds to
                    // notice that its server-side consumer is gone).
                    Err(_) => {
                        let info = stream.info().await.map_err(|e| e.to_string())?;
                        if info.state.last_sequence > last {
                            return Err(format!(
                                "stalled at #{last} while the stream holds #{}",
                                info.state.last_sequence
                            ));
                        }
                        continue;
                    }
                };
                let info = message.info().map_err(|e| e.to_string())?;
                if info.stream_sequence <= last {
                    continue; // already recorded before a resume
                }
                let d = delivery(&message);
                let record = Record {
                    sequence: info.stream_sequence,
                    stored_at: info.published.into(),
                    event_id: d.event_id,
                    aggregate_type: d.aggregate_type,
                    aggregate_id: d.aggregate_id,
                    version: d.version,
                };
                last = info.stream_sequence;
                records.lock().unwrap().push(record);
            }
            Err::<(), String>("the message stream ended".into())
        };
        tokio::select! {
            () = stop.cancelled() => return,
            ended = session => {
                let error = ended.err().unwrap_or_default();
                *resumes.lock().unwrap() += 1;
                super::log(&format!("consumer resumes after #{last}: {error}"));
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

fn delivery(message: &jetstream::Message) -> Delivery {
    let headers: BTreeMap<String, String> = message
        .headers
        .iter()
        .flat_map(|h| h.iter())
        .map(|(k, v)| {
            (
                k.to_string(),
                v.first().map(|x| x.as_str().to_owned()).unwrap_or_default(),
            )
        })
        .collect();
    Delivery::from_headers(message.subject.to_string(), headers, Vec::new())
}

async fn read_rabbitmq(
    url: String,
    queue: String,
    records: Arc<Mutex<Vec<Record>>>,
    resumes: Arc<Mutex<u64>>,
    stop: CancellationToken,
) {
    use lapin::{
        options::{BasicAckOptions, BasicConsumeOptions},
        types::FieldTable,
        Connection, ConnectionProperties,
    };
    let mut recorded = std::collections::HashSet::new();
    loop {
        let session = async {
            let connection = Connection::connect(&url, ConnectionProperties::default())
                .await
                .map_err(|e| e.to_string())?;
            let channel = connection
                .create_channel()
                .await
                .map_err(|e| e.to_string())?;
            let mut deliveries = channel
                .basic_consume(
                    &queue,
                    "chaos",
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| e.to_string())?;
            while let Some(delivery) = deliveries.next().await {
                let delivery = delivery.map_err(|e| e.to_string())?;
                let headers: BTreeMap<String, String> = delivery
                    .properties
                    .headers()
                    .as_ref()
                    .map(|t| {
                        t.inner()
                            .iter()
                            .map(|(k, v)| (k.to_string(), amqp_text(v)))
                            .collect()
                    })
                    .unwrap_or_default();
                let d =
                    Delivery::from_headers(delivery.routing_key.to_string(), headers, Vec::new());
                // A message this consumer received but could not ack before its connection
                // failed comes again flagged `redelivered`: not the relay's duplicate.
                let again = delivery.redelivered && recorded.contains(&d.event_id);
                if !again {
                    recorded.insert(d.event_id.clone());
                    let mut records = records.lock().unwrap();
                    let sequence = records.len() as u64 + 1;
                    records.push(Record {
                        sequence,
                        stored_at: SystemTime::now(),
                        event_id: d.event_id,
                        aggregate_type: d.aggregate_type,
                        aggregate_id: d.aggregate_id,
                        version: d.version,
                    });
                }
                delivery
                    .ack(BasicAckOptions::default())
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Err::<(), String>("the consumer ended".into())
        };
        tokio::select! {
            () = stop.cancelled() => return,
            ended = session => {
                let error = ended.err().unwrap_or_default();
                *resumes.lock().unwrap() += 1;
                super::log(&format!("consumer resumes: {error}"));
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

fn amqp_text(value: &lapin::types::AMQPValue) -> String {
    use lapin::types::AMQPValue;
    match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.to_string(),
        other => format!("{other:?}"),
    }
}
