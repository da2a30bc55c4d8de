//! The dashboard: a small self-contained page (no CDN) and the JSON API under `/api/` it uses.
//!
//! | endpoint | token | what |
//! | --- | --- | --- |
//! | `GET /` | no | the page |
//! | `GET /api/status` | no | backlog, lag, dead count, totals, partitions and owners |
//! | `GET /api/dead-letters?limit=&event_type=&aggregate_type=&aggregate_id=&error=` | no | dead letters with their errors |
//! | `POST /api/dead-letters/replay` `{"ids": [..], "reason": ".."}` | yes | replay (audited) |
//! | `POST /api/dead-letters/skip` `{"ids": [..], "reason": ".."}` | yes | skip (audited, reason required) |
//!
//! Reading needs no token; every mutating call needs `Authorization: Bearer <admin_token>`.
//! Without a configured token the mutating calls are refused (403). The token and the origin
//! are checked before the body is read, so a refused caller learns nothing about its body (401
//! or 403, never a validation error); an authorised caller with a malformed body gets 400 or
//! 422 and a message naming what is wrong. The token travels in a header the page sets from an
//! input field, never in a cookie, so another site cannot make a browser send it (CSRF);
//! requests whose `Origin` is not this server are refused too. Bound to localhost unless
//! `--listen` says otherwise. No secret is ever returned.

use std::sync::Arc;

use axum::{
    extract::{rejection::JsonRejection, Query, Request, State},
    http::{header, HeaderMap, StatusCode},
    middleware::{self, Next},
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

const PAGE: &str = include_str!("index.html");

/// What the dashboard reads and acts on.
#[derive(Clone)]
pub struct Dashboard {
    /// Operator actions.
    pub admin: Admin,
    /// Backlog and partitions.
    pub store: Arc<dyn Store>,
    /// This relay's metrics (totals).
    pub metrics: Arc<Metrics>,
    /// Bearer token for mutating calls; `None` makes the dashboard read-only.
    pub token: Option<String>,
}

/// The dashboard's routes, to merge with the metrics router.
pub fn router(dashboard: Dashboard) -> Router {
    let dashboard = Arc::new(dashboard);
    let actions = Router::new()
        .route("/api/dead-letters/replay", post(replay))
        .route("/api/dead-letters/skip", post(skip))
        .route_layer(middleware::from_fn_with_state(
            dashboard.clone(),
            authorized,
        ));
    Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/api/status", get(status))
        .route("/api/dead-letters", get(dead_letters))
        .merge(actions)
        .with_state(dashboard)
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
        limit: Some(q.limit.unwrap_or(100).clamp(1, 1000)),
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

/// Why a mutating call is refused: the status and a message.
type Refusal = (StatusCode, &'static str);

/// Runs a mutating call only for an authorised caller, before its body is read.
async fn authorized(State(d): State<Arc<Dashboard>>, request: Request, next: Next) -> Response {
    match authorize(&d, request.headers()) {
        Ok(()) => next.run(request).await,
        Err((status, message)) => error(status, message),
    }
}

/// Checks the bearer token (constant-time) and the request's origin.
fn authorize(d: &Dashboard, headers: &HeaderMap) -> Result<(), Refusal> {
    let Some(expected) = &d.token else {
        return Err((
            StatusCode::FORBIDDEN,
            "the dashboard is read-only: no admin_token is configured",
        ));
    };
    if let (Some(origin), Some(host)) = (headers.get(header::ORIGIN), headers.get(header::HOST)) {
        let origin = origin.to_str().unwrap_or_default();
        let host = host.to_str().unwrap_or_default();
        if origin != format!("http://{host}") && origin != format!("https://{host}") {
            return Err((StatusCode::FORBIDDEN, "cross-origin request refused"));
        }
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if !constant_time_eq(given.as_bytes(), expected.as_bytes()) {
        return Err((StatusCode::UNAUTHORIZED, "a valid bearer token is required"));
    }
    Ok(())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn compares_tokens_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
