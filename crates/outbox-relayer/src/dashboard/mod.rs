//! The dashboard: a small self-contained page (no CDN) and the JSON API under `/api/` it uses.
//!
//! | endpoint | token | what |
//! | --- | --- | --- |
//! | `GET /`, `/dashboard.js`, `/dashboard.css` | no | the page (it holds no data) |
//! | `GET /api/status` | read | backlog, lag, dead count, totals, partitions and owners |
//! | `GET /api/dead-letters?limit=&event_type=&aggregate_type=&aggregate_id=&error=` | read | dead letters with their errors; `limit` 1 to 200 (default 100), each row bounded and its sensitive headers redacted (see [`crate::admin::DeadLetter`]) |
//! | `POST /api/dead-letters/replay` `{"ids": [..], "reason": ".."}` | admin | replay (audited) |
//! | `POST /api/dead-letters/skip` `{"ids": [..], "reason": ".."}` | admin | skip (audited, reason required) |
//!
//! What each boundary enforces, in the order a request meets it:
//! * [`hosts`]: only requests whose `Host` is allowed are answered (421 otherwise), so a page
//!   on another site that rebinds its name to this relay's address reads nothing.
//! * [`access`]: reads need a token beyond loopback or when a read token is set; actions need
//!   the admin token and this server's origin, checked before the body is read, so a refused
//!   caller learns nothing about its body (401 or 403, never a validation error); an
//!   authorised caller with a malformed body gets 400 or 422 and a message naming what is
//!   wrong.
//! * [`security_headers`] on every response.
//!
//! `/metrics`, `/healthz` and `/readyz` are not part of this router (see [`crate::http`]): they
//! take no token and any `Host`, for probes and scrapers. No secret is ever returned.

mod access;
mod hosts;
mod security_headers;

use std::{net::SocketAddr, sync::Arc};

use axum::{
    extract::{rejection::JsonRejection, Query, State},
    http::{header, StatusCode},
    middleware,
    response::{Html, IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use serde::Deserialize;

use crate::{
    admin::{Admin, DeadLetterFilter},
    store::Store,
    telemetry::Metrics,
};

pub use hosts::check_allowed_hosts;

const PAGE: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("dashboard.js");
const STYLE: &str = include_str!("dashboard.css");

/// The most dead letters one `GET /api/dead-letters` returns, whatever `limit` asks.
pub const MAX_LIST_LIMIT: i64 = 200;

/// What the dashboard reads and acts on, and who may.
#[derive(Clone)]
pub struct Dashboard {
    /// Operator actions.
    pub admin: Admin,
    /// Backlog and partitions.
    pub store: Arc<dyn Store>,
    /// This relay's metrics (totals).
    pub metrics: Arc<Metrics>,
    /// Bearer token for mutating calls, also accepted for reads; `None` makes the dashboard
    /// read-only.
    pub token: Option<String>,
    /// Bearer token for reads only; when set, reads need it (or the admin token) even on
    /// loopback.
    pub read_token: Option<String>,
    /// The address the dashboard is served at: beyond loopback, reads need a token; its IP is
    /// an allowed `Host`.
    pub listen: SocketAddr,
    /// `Host` names allowed besides `localhost`, `127.0.0.1`, `[::1]` and the listen address
    /// (`name` on any port, `name:port`); checked by [`check_allowed_hosts`].
    pub allowed_hosts: Vec<String>,
}

/// The dashboard's routes, to merge with the metrics router.
pub fn router(dashboard: Dashboard) -> Router {
    let hosts = Arc::new(hosts::HostAllowList::new(
        dashboard.listen,
        &dashboard.allowed_hosts,
    ));
    let dashboard = Arc::new(dashboard);
    let reads = Router::new()
        .route("/api/status", get(status))
        .route("/api/dead-letters", get(dead_letters))
        .route_layer(middleware::from_fn_with_state(
            dashboard.clone(),
            access::readers,
        ));
    let actions = Router::new()
        .route("/api/dead-letters/replay", post(replay))
        .route("/api/dead-letters/skip", post(skip))
        .route_layer(middleware::from_fn_with_state(
            dashboard.clone(),
            access::admins,
        ));
    Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route(
            "/dashboard.js",
            get(|| asset("text/javascript; charset=utf-8", SCRIPT)),
        )
        .route(
            "/dashboard.css",
            get(|| asset("text/css; charset=utf-8", STYLE)),
        )
        .merge(reads)
        .merge(actions)
        .route_layer(middleware::from_fn_with_state(hosts, hosts::allowed))
        .route_layer(middleware::from_fn(security_headers::add))
        .with_state(dashboard)
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": message.into() }))).into_response()
}

async fn status(State(d): State<Arc<Dashboard>>) -> Response {
    let backlog = match d.store.backlog().await {
        Ok(b) => b,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, format!("database: {e}")),
    };
    let partitions = d.store.partition_status().await.unwrap_or_default();
    Json(serde_json::json!({
        "pending": backlog.pending,
        "oldest_pending_age_seconds": backlog.oldest_age.map(|a| a.as_secs_f64()),
        "dead": backlog.dead,
        "published_total": d.metrics.sum("outbox_published_total"),
        "failed_total": d.metrics.sum("outbox_failed_total"),
        "partitions": partitions,
        "writable": d.token.is_some(),
    }))
    .into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    limit: Option<i64>,
    event_type: Option<String>,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    error: Option<String>,
}

async fn dead_letters(State(d): State<Arc<Dashboard>>, Query(q): Query<ListQuery>) -> Response {
    let filter = DeadLetterFilter {
        event_type: q.event_type,
        aggregate_type: q.aggregate_type,
        aggregate_id: q.aggregate_id,
        error_contains: q.error,
        limit: Some(q.limit.unwrap_or(100).clamp(1, MAX_LIST_LIMIT)),
        ..Default::default()
    };
    match d.admin.dead_letters(&filter).await {
        Ok(list) => Json(list).into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, format!("database: {e}")),
    }
}

/// Body of the mutating calls.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Action {
    ids: Vec<i64>,
    reason: String,
}

/// The action in a body, or the status and a message naming what is wrong with it (400 for
/// JSON that does not parse, 422 for JSON of the wrong shape, 415 without a JSON content type).
fn check_action(body: Result<Json<Action>, JsonRejection>) -> Result<Action, (StatusCode, String)> {
    let Json(action) = body.map_err(|rejection| (rejection.status(), rejection.body_text()))?;
    if action.ids.is_empty() || action.ids.len() > 10_000 {
        return Err((
            StatusCode::BAD_REQUEST,
            "ids: give 1 to 10000 row ids".into(),
        ));
    }
    if action.reason.trim().is_empty() {
        return Err((StatusCode::BAD_REQUEST, "reason: say why".into()));
    }
    Ok(action)
}

async fn replay(
    State(d): State<Arc<Dashboard>>,
    body: Result<Json<Action>, JsonRejection>,
) -> Response {
    let action = match check_action(body) {
        Ok(action) => action,
        Err((status, message)) => return error(status, message),
    };
    match d
        .admin
        .replay_report(&action.ids, "dashboard", &action.reason)
        .await
    {
        // `not_replayed`: the ids left dead, each before the dead event that parks its
        // aggregate (see `Admin::replay`).
        Ok(done) => Json(serde_json::json!({
            "replayed": done.replayed,
            "not_replayed": done.not_replayed,
        }))
        .into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, format!("database: {e}")),
    }
}

async fn skip(
    State(d): State<Arc<Dashboard>>,
    body: Result<Json<Action>, JsonRejection>,
) -> Response {
    let action = match check_action(body) {
        Ok(action) => action,
        Err((status, message)) => return error(status, message),
    };
    match d.admin.skip(&action.ids, "dashboard", &action.reason).await {
        Ok(n) => Json(serde_json::json!({ "released": n })).into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, format!("database: {e}")),
    }
}
