//! (k) `natsonly`: the broker client's own floor. The harness publishes as many messages as
//! the drain's backlog straight to JetStream through async-nats (the client the relay uses),
//! each with the headers the relay sets and a ~200-byte payload, keeping as many
//! acknowledgements outstanding as the relay can (`--inflight` × `--batch-size`), with no
//! database. Its CPU per message is what publishing alone costs a process with this client:
//! the part of the relay's CPU that no change in the relay can remove.

use std::time::Duration;

use async_nats::{jetstream::message::PublishMessage, HeaderMap};
use futures::{stream::FuturesUnordered, StreamExt};

use crate::{
    common::{interruptible, payload, Result},
    context::Bench,
    cost::{Cpu, Meter},
};

/// Figures of the client-only run.
#[derive(Clone, Debug)]
pub struct NatsOnlyResult {
    /// Acknowledgements outstanding at most.
    pub window: usize,
    /// CPU per process.
    pub cpu: Cpu,
}

/// Runs the scenario on its own stream, deleted afterwards.
pub async fn run(bench: &Bench) -> Result<NatsOnlyResult> {
    let scope = bench.scope("natsonly")?;
    bench.create_stream(&scope).await?;
    let result = interruptible(measure(bench, &scope.subjects)).await;
    let _ = bench.js()?.delete_stream(&scope.stream).await;
    result
}

async fn measure(bench: &Bench, subjects: &str) -> Result<NatsOnlyResult> {
    let events = bench.options.events;
    let window = (bench.options.inflight * bench.options.batch_size as usize).max(1);
    let js = bench.js()?.clone();
    let body = bytes::Bytes::from(serde_json::to_vec(&payload(1))?);
    let subject = format!("{subjects}.order.OrderPlaced");
    // What varies per message and is not the client's work is made once: the aggregate ids
    // and one occurred-at (the relay formats these on the stack).
    let values = Values {
        aggregate_ids: (0..AGGREGATES).map(|a| format!("agg-{a}")).collect(),
        occurred_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
    };
    let scope = bench.scope("natsonly")?;
    let meter = Meter::start(bench.processes(&scope).await?);
    bench.log(
        "natsonly",
        format!("publishing {events} messages, {window} acknowledgements outstanding at most"),
    );
    if bench.options.nats_core {
        return core(bench, &subject, body, window, meter, &values).await;
    }
    let mut pending = FuturesUnordered::new();
    let mut acked = 0u64;
    for n in 0..events {
        while pending.len() >= window {
            if let Some(result) = pending.next().await {
                result?;
                acked += 1;
            }
        }
        let mut id = [0u8; uuid::fmt::Hyphenated::LENGTH];
        let id = &*uuid::Uuid::now_v7().hyphenated().encode_lower(&mut id);
        let message = PublishMessage::build()
            .payload(body.clone())
            .headers(values.headers(n, id, false))
            .message_id(id);
        let js = js.clone();
        let subject = subject.clone();
        pending.push(async move {
            let ack = js.send_publish(subject, message).await?;
            tokio::time::timeout(
                Duration::from_secs(30),
                std::future::IntoFuture::into_future(ack),
            )
            .await
            .map_err(|_| "no acknowledgement within 30 s")??;
            Ok::<(), crate::common::BoxError>(())
        });
    }
    while let Some(result) = pending.next().await {
        result?;
        acked += 1;
    }
    let cpu = meter.stop(acked);
    bench.log(
        "natsonly",
        format!("{acked} messages acknowledged ({:.0}/s)", cpu.rate()),
    );
    Ok(NatsOnlyResult { window, cpu })
}

/// The same through the core client: one subscription for every acknowledgement (reply
/// subjects `<inbox>.<n>`), matched to its publish by the token, instead of the JetStream
/// context's request per message.
async fn core(
    bench: &Bench,
    subject: &str,
    body: bytes::Bytes,
    window: usize,
    meter: Meter,
    values: &Values,
) -> Result<NatsOnlyResult> {
    use std::{
        collections::HashMap,
        sync::{Arc, Mutex},
    };
    let client = bench.nats()?.clone();
    let inbox = client.new_inbox();
    let mut acks = client.subscribe(format!("{inbox}.*")).await?;
    type Waiters = Arc<Mutex<HashMap<u64, tokio::sync::oneshot::Sender<bytes::Bytes>>>>;
    let waiters: Waiters = Arc::default();
    let router = {
        let waiters = waiters.clone();
        tokio::spawn(async move {
            while let Some(m) = acks.next().await {
                let token = m
                    .subject
                    .rsplit('.')
                    .next()
                    .and_then(|t| t.parse::<u64>().ok());
                let waiter = token.and_then(|t| waiters.lock().unwrap().remove(&t));
                if let Some(w) = waiter {
                    let _ = w.send(m.payload);
                }
            }
        })
    };
    let mut pending = FuturesUnordered::new();
    let mut acked = 0u64;
    for n in 0..bench.options.events {
        while pending.len() >= window {
            if let Some(result) = pending.next().await {
                result?;
                acked += 1;
            }
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        waiters.lock().unwrap().insert(n, tx);
        let mut id = [0u8; uuid::fmt::Hyphenated::LENGTH];
        let id = &*uuid::Uuid::now_v7().hyphenated().encode_lower(&mut id);
        let headers = values.headers(n, id, true);
        client
            .publish_with_reply_and_headers(
                subject.to_owned(),
                format!("{inbox}.{n}"),
                headers,
                body.clone(),
            )
            .await?;
        pending.push(async move {
            let ack = tokio::time::timeout(Duration::from_secs(30), rx)
                .await
                .map_err(|_| "no acknowledgement within 30 s")??;
            if ack.windows(7).any(|w| w == b"\"error\"") {
                return Err(String::from_utf8_lossy(&ack).into_owned().into());
            }
            Ok::<(), crate::common::BoxError>(())
        });
    }
    while let Some(result) = pending.next().await {
        result?;
        acked += 1;
    }
    router.abort();
    let cpu = meter.stop(acked);
    bench.log(
        "natsonly",
        format!(
            "core client: {acked} messages acknowledged ({:.0}/s)",
            cpu.rate()
        ),
    );
    Ok(NatsOnlyResult { window, cpu })
}

/// Aggregates the messages are spread over, as in the drain's backlog.
const AGGREGATES: u64 = 10_000;

/// Header values made once for the whole run.
struct Values {
    aggregate_ids: Vec<String>,
    occurred_at: String,
}

impl Values {
    /// The relay's headers for message `n` with event id `id` (and `Nats-Msg-Id` when the
    /// JetStream context does not set it).
    fn headers(&self, n: u64, id: &str, msg_id: bool) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if msg_id {
            headers.insert("Nats-Msg-Id", id);
        }
        headers.insert("event-id", id);
        headers.insert("event-type", "OrderPlaced");
        headers.insert("schema-version", "1");
        headers.insert("aggregate-type", "order");
        headers.insert(
            "aggregate-id",
            self.aggregate_ids[(n % AGGREGATES) as usize].as_str(),
        );
        headers.insert("occurred-at", self.occurred_at.as_str());
        headers.insert("content-type", "application/json");
        headers
    }
}
