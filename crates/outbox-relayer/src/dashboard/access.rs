//! Who may read and who may act, checked before a handler runs (and before a body is read).
//!
//! * Actions (replay, skip) need `Authorization: Bearer <admin_token>`, and a request whose
//!   `Origin` is not this server is refused; without an admin token they are refused (403).
//! * Reads (`/api/status`, `/api/dead-letters`) need the read token or the admin token when a
//!   read token is configured, when the dashboard listens on an address other than loopback,
//!   or when `allowed_hosts` names a host (a proxy forwards other callers); on loopback with
//!   no allowed host and no read token they are open. Otherwise, with neither token, reads are
//!   refused (403 naming the settings) rather than open to the network.
//!
//! Tokens travel in a header the page sets from an input field, never in a cookie, so another
//! site cannot make a browser send them (CSRF). They are compared in constant time.

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    http::{header, HeaderMap, HeaderValue, StatusCode},
    middleware::Next,
    response::Response,
};

use super::Dashboard;

/// Why a call is refused: the status and a message.
type Refusal = (StatusCode, String);

/// Runs a read only for a caller the read rule lets in.
pub(super) async fn readers(
    State(d): State<Arc<Dashboard>>,
    request: Request,
    next: Next,
) -> Response {
    match may_read(&d, request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refuse(refusal),
    }
}

/// Runs a mutating call only for an authorised caller, before its body is read.
pub(super) async fn admins(
    State(d): State<Arc<Dashboard>>,
    request: Request,
    next: Next,
) -> Response {
    match may_act(&d, request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refuse(refusal),
    }
}

fn refuse((status, message): Refusal) -> Response {
    let mut response = super::error(status, message);
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

/// The read rule (see the module's documentation).
fn may_read(d: &Dashboard, headers: &HeaderMap) -> Result<(), Refusal> {
    let read_token = configured(&d.read_token);
    // Open only where no one but this machine can be the caller: a loopback listener reached
    // by loopback names. A name in `allowed_hosts` says a proxy forwards other callers here.
    let loopback_only = d.listen.ip().is_loopback() && d.allowed_hosts.is_empty();
    if loopback_only && read_token.is_none() {
        return Ok(());
    }
    let tokens: Vec<&str> = [read_token, configured(&d.token)]
        .into_iter()
        .flatten()
        .collect();
    if tokens.is_empty() {
        return Err((
            StatusCode::FORBIDDEN,
            format!(
                "reads are refused: the dashboard {}, and neither read_token \
                 (OUTBOX_READ_TOKEN) nor admin_token (OUTBOX_ADMIN_TOKEN) is set; set one, or \
                 listen on 127.0.0.1 with no allowed_hosts",
                match d.listen.ip().is_loopback() {
                    true => "answers the names in allowed_hosts (callers beyond loopback)".into(),
                    false => format!("listens on {}, beyond loopback", d.listen),
                }
            ),
        ));
    }
    let given = bearer(headers);
    // Every token is compared, so the time taken does not say which one matched.
    let matched = tokens
        .iter()
        .fold(false, |any, t| constant_time_eq(given, t.as_bytes()) | any);
    if !matched {
        return Err((
            StatusCode::UNAUTHORIZED,
            "a valid bearer token (read_token or admin_token) is required to read".into(),
        ));
    }
    Ok(())
}

/// Checks the admin token (constant-time) and the request's origin.
fn may_act(d: &Dashboard, headers: &HeaderMap) -> Result<(), Refusal> {
    let Some(expected) = configured(&d.token) else {
        return Err((
            StatusCode::FORBIDDEN,
            "the dashboard is read-only: no admin_token is configured".into(),
        ));
    };
    if let (Some(origin), Some(host)) = (headers.get(header::ORIGIN), headers.get(header::HOST)) {
        let origin = origin.to_str().unwrap_or_default();
        let host = host.to_str().unwrap_or_default();
        if origin != format!("http://{host}") && origin != format!("https://{host}") {
            return Err((StatusCode::FORBIDDEN, "cross-origin request refused".into()));
        }
    }
    if !constant_time_eq(bearer(headers), expected.as_bytes()) {
        return Err((
            StatusCode::UNAUTHORIZED,
            "a valid bearer token is required".into(),
        ));
    }
    Ok(())
}

/// A token that is set and not empty (an empty one would match a request without any).
fn configured(token: &Option<String>) -> Option<&str> {
    token.as_deref().filter(|t| !t.is_empty())
}

/// The bearer token of a request (empty without one).
fn bearer(headers: &HeaderMap) -> &[u8] {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .as_bytes()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
