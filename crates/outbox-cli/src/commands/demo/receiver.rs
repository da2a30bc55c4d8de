//! The demo's consumers behind a loopback HTTP endpoint: the relay's webhook publisher POSTs
//! each event; the endpoint applies it for both consumers and answers 204 only after commit.
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
use outbox::{sqlite::SqliteInbox, Seen};
use sqlx::SqlitePool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::shop;

/// What the consumers saw.
#[derive(Default)]
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

#[derive(Clone)]
struct App {
    pool: SqlitePool,
    inbox: SqliteInbox,
    counters: Arc<Counters>,
    drop_ack_every: u64,
}

/// Serves the consumers on a free loopback port until `shutdown`; returns the webhook URL.
pub async fn start(
    pool: SqlitePool,
    inbox: SqliteInbox,
    counters: Arc<Counters>,
    drop_ack_every: u64,
    shutdown: CancellationToken,
) -> std::io::Result<String> {
    let app = Router::new()
        .route("/events/{*destination}", post(deliver))
        .with_state(App {
            pool,
            inbox,
            counters,
            drop_ack_every,
        });
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
    });
    Ok(format!("http://{addr}/events/{{destination}}"))
}

async fn deliver(State(app): State<App>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let n = app.counters.deliveries.fetch_add(1, Ordering::Relaxed) + 1;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(id), Ok(body)) = (
        header("event-id").and_then(|v| Uuid::parse_str(v).ok()),
        serde_json::from_slice::<serde_json::Value>(&body),
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
    for consumer in shop::CONSUMERS {
        match shop::consume(&app.pool, &app.inbox, consumer, id, &body).await {
            Ok(Seen::Duplicate) => {
                app.counters.duplicates.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Seen::New) => {}
            Err(error) => {
                tracing::warn!(%error, consumer, "demo consumer failed; the relay will retry");
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
