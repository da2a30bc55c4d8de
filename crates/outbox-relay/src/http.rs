//! `/metrics`, `/healthz` and `/readyz`.
//!
//! * `/healthz` answers 200 while the process serves requests.
//! * `/readyz` answers 503 when the database has not answered for `stall_timeout`, or when this
//!   relay has found work within `stall_timeout` yet published nothing for that long (stalled
//!   while work is pending: broker down, every attempt failing). Otherwise 200.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{extract::State, http::StatusCode, response::IntoResponse, routing::get, Router};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::telemetry::Metrics;

/// Progress markers the relay updates and readiness reads.
#[derive(Debug)]
pub struct Health {
    stall_timeout: Duration,
    inner: Mutex<Marks>,
}

#[derive(Debug)]
struct Marks {
    progress: Instant,
    work_seen: Option<Instant>,
    database_ok: Instant,
}

impl Health {
    /// Fresh markers: ready until proven otherwise.
    pub fn new(stall_timeout: Duration) -> Self {
        let now = Instant::now();
        Self {
            stall_timeout,
            inner: Mutex::new(Marks {
                progress: now,
                work_seen: None,
                database_ok: now,
            }),
        }
    }

    /// Events were published or dead-lettered.
    pub fn progressed(&self) {
        self.inner.lock().expect("not poisoned").progress = Instant::now();
    }

    /// A claim found pending events.
    pub fn saw_work(&self) {
        self.inner.lock().expect("not poisoned").work_seen = Some(Instant::now());
    }

    /// A database statement succeeded.
    pub fn database_ok(&self) {
        self.inner.lock().expect("not poisoned").database_ok = Instant::now();
    }

    /// `Ok` when ready, else the reason.
    pub fn readiness(&self) -> Result<(), String> {
        let m = self.inner.lock().expect("not poisoned");
        let t = self.stall_timeout;
        if m.database_ok.elapsed() > t {
            return Err(format!(
                "database unreachable for {}s",
                m.database_ok.elapsed().as_secs()
            ));
        }
        let working = m.work_seen.is_some_and(|w| w.elapsed() < t);
        if working && m.progress.elapsed() > t {
            return Err(format!(
                "stalled: events pending and nothing published for {}s",
                m.progress.elapsed().as_secs()
            ));
        }
        Ok(())
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// The router serving the three endpoints.
pub fn router(metrics: Arc<Metrics>, health: Arc<Health>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(AppState { metrics, health })
}

async fn metrics_text(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

async fn ready(State(state): State<AppState>) -> impl IntoResponse {
    match state.health.readiness() {
        Ok(()) => (StatusCode::OK, "ready\n".to_owned()),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        ),
    }
}

/// Binds `addr` and serves until `shutdown`. Returns the bound address (port 0 picks one).
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), crate::Error> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| crate::Error::Listen {
            addr: addr.to_string(),
            source,
        })?;
    let bound = listener
        .local_addr()
        .map_err(|source| crate::Error::Listen {
            addr: addr.to_string(),
            source,
        })?;
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "metrics server stopped");
        }
    });
    Ok((bound, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_when_idle_and_not_ready_when_stalled_with_work() {
        let health = Health::new(Duration::from_secs(60));
        // No work seen: an idle relay is ready even after a long time without progress.
        health.inner.lock().unwrap().progress = Instant::now() - Duration::from_secs(600);
        assert!(health.readiness().is_ok());
        health.progressed();
        health.saw_work();
        assert!(health.readiness().is_ok(), "fresh progress marker");
        health.inner.lock().unwrap().progress = Instant::now() - Duration::from_secs(61);
        let reason = health.readiness().unwrap_err();
        assert!(reason.starts_with("stalled"), "{reason}");
        health.progressed();
        assert!(health.readiness().is_ok());
        health.inner.lock().unwrap().database_ok = Instant::now() - Duration::from_secs(61);
        assert!(health
            .readiness()
            .unwrap_err()
            .contains("database unreachable"));
    }
}
