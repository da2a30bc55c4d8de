//! `/metrics`, `/healthz` and `/readyz`.
//!
//! * `/healthz` answers 200 while the process serves requests.
//! * `/readyz` answers 200 when this relay is making progress ([`crate::health`]) on the work it owns, else 503
//!   with the reason (also exported as `outbox_ready` and `outbox_unready{reason}`). Not ready,
//!   each after `stall_timeout`:
//!   - `database`: no relay statement has succeeded for that long;
//!   - `loop`: the relay loop has not turned for that long (a statement or publish that never
//!     returns; the lease task then stops renewing, so that another relay takes over);
//!   - `claim`: events are pending and this relay's claims have not succeeded for that long
//!     (failing, or blocked behind a lock, until `statement_timeout` / `lock_timeout`);
//!   - `stalled`: this relay found work within that time yet published (or dead-lettered)
//!     nothing for that long: broker down, every attempt failing;
//!   - `lease`: events are pending and the lease heartbeat has failed for that long: the
//!     relay can neither keep nor take a partition (its reads may still succeed: a server that
//!     refuses its writes).
//!
//!   An idle relay, or a standby that owns no partition, is ready.

use std::{net::SocketAddr, sync::Arc};

use axum::{extract::State, http::StatusCode, response::IntoResponse, routing::get, Router};
use tokio_util::sync::CancellationToken;

use crate::{health::Health, telemetry::Metrics};

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
    state
        .metrics
        .set_readiness(state.health.readiness().err().map(|n| n.reason));
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
        Err(not_ready) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", not_ready.message),
        ),
    }
}

/// The endpoints of a relay that is still starting: `/healthz` answers 200 at once, every
/// other path 503 with what the relay waits for (the database, the broker), until
/// [`Startup::serve`] hands every request to the relay's own router. So an orchestrator's
/// liveness probe does not kill a relay that is only waiting, and its readiness probe says why.
#[derive(Clone)]
pub struct Startup {
    state: Arc<std::sync::RwLock<Started>>,
}

enum Started {
    Waiting(String),
    Serving(Router),
}

impl Startup {
    /// Waiting for `what` (e.g. "waiting for the database at db:5432").
    pub fn new(what: impl Into<String>) -> Self {
        Self {
            state: Arc::new(std::sync::RwLock::new(Started::Waiting(what.into()))),
        }
    }

    /// Now waiting for `what`.
    pub fn waiting_for(&self, what: impl Into<String>) {
        *self.state.write().expect("not poisoned") = Started::Waiting(what.into());
    }

    /// From now on every request goes to `router`.
    pub fn serve(&self, router: Router) {
        *self.state.write().expect("not poisoned") = Started::Serving(router);
    }

    /// The router to serve from the start.
    pub fn router(&self) -> Router {
        let this = self.clone();
        Router::new().fallback(move |request: axum::extract::Request| {
            let this = this.clone();
            async move { this.answer(request).await }
        })
    }

    async fn answer(&self, request: axum::extract::Request) -> axum::response::Response {
        let current = match &*self.state.read().expect("not poisoned") {
            Started::Serving(router) => Ok(router.clone()),
            Started::Waiting(what) => Err(what.clone()),
        };
        match current {
            Ok(router) => {
                use tower::ServiceExt;
                match router.oneshot(request).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                }
            }
            Err(_) if request.uri().path() == "/healthz" => {
                (StatusCode::OK, "ok\n").into_response()
            }
            Err(what) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {what}\n"),
            )
                .into_response(),
        }
    }
}

/// Binds `addr` and serves until `shutdown`. Returns the bound address (port 0 picks one).
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), crate::error::Error> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| crate::error::Error::Listen {
            addr: addr.to_string(),
            source,
        })?;
    let bound = listener
        .local_addr()
        .map_err(|source| crate::error::Error::Listen {
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
