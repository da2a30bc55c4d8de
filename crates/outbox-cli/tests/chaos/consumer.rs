//! The independent consumer: reads the JetStream stream with async-nats directly (nothing of
//! the relay), from its first message, and records every message the stream holds exactly
//! once, by stream sequence, through broker restarts.

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
    /// Stream sequence.
    pub sequence: u64,
    /// When the broker stored it (the end of the relay's part: commit to broker).
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

/// Reads the stream in the background, reconnecting and resuming after the last sequence
/// recorded whenever the broker goes away.
pub struct StreamRecorder {
    records: Arc<Mutex<Vec<Record>>>,
    resumes: Arc<Mutex<u64>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl StreamRecorder {
    /// Creates stream `name` (file storage, capturing `{prefix}.>`, the default two-minute
    /// duplicate window) on the server at `url` and starts reading it from the start.
    pub async fn start(url: &str, name: &str, prefix: &str) -> Self {
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
        let task = tokio::spawn(read(
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

async fn read(
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
