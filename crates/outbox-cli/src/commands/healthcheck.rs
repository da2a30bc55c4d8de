//! `outbox healthcheck`: GET a relay's `/healthz` (or any `http://` URL) and exit 0 on a 2xx
//! answer, 1 otherwise, with one line that says why.
//!
//! It exists for the container image's `HEALTHCHECK`, which then needs no curl or wget in the
//! image, and it keeps the exit codes that `HEALTHCHECK` gives meaning to: 0 healthy,
//! 1 unhealthy (2 is reserved, so a bad URL is reported as unhealthy too, not as an error).
//! Plain `http://` only: the probe runs on the relay's own host or container, over loopback.

use std::{process::ExitCode, time::Duration};

use axum::http::{uri::Scheme, Request, Uri};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};

use super::CommandResult;

/// Options of `outbox healthcheck`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The URL to GET (`http://` only). Any 2xx answer is healthy. A relay whose `listen` (or
    /// `metrics_listen`) is not the default names its own address here, e.g.
    /// `http://127.0.0.1:9188/healthz`, or `/readyz` to ask about progress too.
    #[arg(
        long,
        env = "OUTBOX_HEALTHCHECK_URL",
        default_value = "http://127.0.0.1:9187/healthz"
    )]
    url: String,
    /// How long connecting, sending the request and reading the answer may take in all
    /// (e.g. "3s", "500ms"); past it the check fails.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// How much of an unhealthy answer's body is quoted (`/readyz` says why in its first line).
const QUOTED_BODY: usize = 200;

/// Checks the URL; exit 0 on a 2xx answer, else 1, with one line saying why.
pub async fn run(args: Args) -> CommandResult {
    let line = match check(&args.url, args.timeout).await {
        Ok(line) => {
            super::print(&format!("healthy: {line}\n"));
            return Ok(ExitCode::SUCCESS);
        }
        Err(line) => line,
    };
    // A URL may carry credentials; an answer is the server's text: neither reaches the
    // terminal raw.
    let line = outbox_relayer::redact::urls_in(&line);
    eprintln!("unhealthy: {}", crate::escape::control(&line));
    Ok(ExitCode::from(1))
}

/// GETs `url` within `timeout`: `Ok` with the status line when it is a 2xx, `Err` with what
/// went wrong otherwise.
async fn check(url: &str, timeout: Duration) -> Result<String, String> {
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("invalid URL {url:?}: {e}"))?;
    if uri.scheme() != Some(&Scheme::HTTP) || uri.authority().is_none() {
        return Err(format!(
            "invalid URL {url:?}: expected http://host:port/path (plain HTTP only)"
        ));
    }
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(timeout));
    connector.set_nodelay(true);
    // An empty `String` is the request body: a GET sends none.
    let client: Client<HttpConnector, String> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(connector);
    let request = Request::get(uri)
        .header(axum::http::header::USER_AGENT, "outbox-healthcheck")
        .body(String::new())
        .map_err(|e| format!("invalid URL {url:?}: {e}"))?;
    let exchange = async {
        let response = client.request(request).await.map_err(|error| {
            // "client error (Connect)" says less than its cause ("tcp connect error:
            // Connection refused (os error 111)"): quote the causes.
            let cause = match std::error::Error::source(&error) {
                Some(source) if error.is_connect() => crate::render_chain(source),
                _ => crate::render_chain(&error),
            };
            format!("cannot GET {url}: {cause}")
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(format!("{status} from {url}"));
        }
        // The first line of the body says why (`/readyz`: "not ready: broker unreachable: …").
        let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), 64 * 1024)
            .await
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        let reason = text.lines().next().unwrap_or("").trim();
        let reason: String = reason.chars().take(QUOTED_BODY).collect();
        Err(if reason.is_empty() {
            format!("{status} from {url}")
        } else {
            format!("{status} from {url}: {reason}")
        })
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "no answer from {url} within {}",
            humantime::format_duration(timeout)
        )),
    }
}
