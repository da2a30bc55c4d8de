//! The consumers behind a loopback HTTP endpoint, for the webhook transport: the relay's webhook
//! publisher POSTs each event; the endpoint applies it for both consumers and answers 204 only
//! after commit.
//! To show what the inbox is for, it "loses" some acknowledgements: every `drop_ack_every`-th
//! request is applied and committed, then answered 503, so the relay delivers it again.

use std::{
    collections::HashSet,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use axum::{body::Bytes, extract::State, http::HeaderMap, http::StatusCode, routing::post, Router};
use outbox::Seen;
use outbox_relayer::{
    publishers::webhook::{WebhookConfig, WebhookPublisher},
    Publisher,
};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{
    shop::{OrderCreated, Storage, CONSUMERS},
    summary::Deliveries,
    BoxError,
};

/// What the consumers saw.
#[derive(Debug, Default)]
pub struct Counters {
    /// HTTP deliveries received.
    pub deliveries: AtomicU64,
    /// Deliveries the inbox recognised and skipped (per consumer).
    pub duplicates: AtomicU64,
    /// Acknowledgements deliberately lost.
    pub dropped_acks: AtomicU64,
    /// Deliveries that failed (malformed or database error).
    pub failures: AtomicU64,
    /// Commit-to-delivery latency of each first delivery.
    pub latencies: Mutex<Vec<Duration>>,
    /// Events delivered at least once.
    seen: Mutex<HashSet<Uuid>>,
}

impl Counters {
    /// What the consumers saw so far.
    pub fn deliveries(&self) -> Deliveries {
        let mut lags = self.latencies.lock().expect("not poisoned").clone();
        lags.sort();
        Deliveries {
            deliveries: self.deliveries.load(Ordering::Relaxed),
            dropped_acks: self.dropped_acks.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            lag_p50: lags.get(lags.len() / 2).copied().unwrap_or_default(),
            lag_max: lags.last().copied().unwrap_or_default(),
        }
    }
}

#[derive(Clone)]
struct App {
    storage: Arc<Storage>,
    counters: Arc<Counters>,
    drop_ack_every: u64,
}

/// The consumers' endpoint, served until the scenario stops.
pub(crate) struct Receiver {
    url: String,
    /// What the consumers saw.
    pub(crate) counters: Arc<Counters>,
}

impl Receiver {
    /// Serves the consumers on a free loopback port until `shutdown`, losing the acknowledgement
    /// of every `drop_ack_every`-th delivery (0: none).
    pub(crate) async fn start(
        storage: Arc<Storage>,
        drop_ack_every: u64,
        shutdown: CancellationToken,
    ) -> std::io::Result<Self> {
        let counters = Arc::new(Counters::default());
        let app = Router::new()
            .route("/events/{*destination}", post(deliver))
            .with_state(App {
                storage,
                counters: counters.clone(),
                drop_ack_every,
            });
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await;
        });
        Ok(Self {
            url: format!("http://{addr}/events/{{destination}}"),
            counters,
        })
    }

    /// A webhook publisher for a new relay.
    pub(crate) fn publisher(&self) -> Result<Arc<dyn Publisher>, BoxError> {
        Ok(Arc::new(WebhookPublisher::new(WebhookConfig {
            url: self.url.clone(),
            timeout: Duration::from_secs(5),
            ..Default::default()
        })?))
    }
}

async fn deliver(State(app): State<App>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let n = app.counters.deliveries.fetch_add(1, Ordering::Relaxed) + 1;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(id), Ok(body)) = (
        header("event-id").and_then(|v| Uuid::parse_str(v).ok()),
        serde_json::from_slice::<OrderCreated>(&body),
    ) else {
        app.counters.failures.fetch_add(1, Ordering::Relaxed);
        return StatusCode::BAD_REQUEST;
    };
    if let Some(at) =
        header("occurred-at").and_then(|v| chrono::DateTime::parse_from_rfc3339(v).ok())
    {
        let first = app.counters.seen.lock().expect("not poisoned").insert(id);
        if first {
            let lag = (chrono::Utc::now() - at.with_timezone(&chrono::Utc))
                .to_std()
                .unwrap_or_default();
            app.counters
                .latencies
                .lock()
                .expect("not poisoned")
                .push(lag);
        }
    }
    for consumer in CONSUMERS {
        match app.storage.consume(consumer, id, &body).await {
            Ok(Seen::Duplicate) => {
                app.counters.duplicates.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Seen::New) => {}
            Err(error) => {
                eprintln!("consumer {consumer} failed, the relay will retry: {error}");
                app.counters.failures.fetch_add(1, Ordering::Relaxed);
                return StatusCode::SERVICE_UNAVAILABLE;
            }
        }
    }
    if app.drop_ack_every > 0 && n % app.drop_ack_every == 0 {
        app.counters.dropped_acks.fetch_add(1, Ordering::Relaxed);
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    StatusCode::NO_CONTENT
}
