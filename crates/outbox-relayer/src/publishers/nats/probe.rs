//! `outbox doctor` on NATS: the connection (credentials), JetStream, and for each destination
//! the stream that captures its subject. Reads only: no message is published, no stream is
//! created or changed.

use async_nats::jetstream;

use super::{publisher::subject_pattern, NatsConfig};
use crate::doctor::{Check, PROBE_TIMEOUT};

const AREA: &str = "broker";

/// Checks `config`'s server for `destinations` (subjects).
pub async fn probe(config: &NatsConfig, destinations: &[String]) -> Vec<Check> {
    let mut checks = Vec::new();
    let connected = async_nats::ConnectOptions::new()
        .name("outbox-doctor")
        .connection_timeout(PROBE_TIMEOUT)
        .connect(&config.url)
        .await;
    let client = match connected {
        Ok(client) => client,
        Err(error) => {
            checks.push(Check::fail(
                AREA,
                "connection",
                format!("NATS refused the connection: {error}"),
                "check the credentials and TLS settings in --broker-url",
            ));
            return checks;
        }
    };
    checks.push(Check::ok(
        AREA,
        "connection",
        "NATS accepted the connection",
    ));
    // The account-info request, read as plain JSON (its typed form changes between servers).
    let info = tokio::time::timeout(
        PROBE_TIMEOUT,
        client.request("$JS.API.INFO", bytes::Bytes::new()),
    )
    .await;
    let problem = match info {
        Ok(Ok(reply)) => serde_json::from_slice::<serde_json::Value>(&reply.payload)
            .ok()
            .and_then(|v| v.get("error").map(|e| e.to_string())),
        Ok(Err(error)) => Some(error.to_string()),
        Err(_) => Some(format!("no answer within {PROBE_TIMEOUT:?}")),
    };
    if let Some(problem) = problem {
        checks.push(Check::fail(
            AREA,
            "JetStream",
            format!("JetStream does not answer for this account: {problem}"),
            "start nats-server with JetStream (-js, or `jetstream {}` in its config) and give \
             the account JetStream limits",
        ));
        return checks;
    }
    checks.push(Check::ok(AREA, "JetStream", "enabled for this account"));
    let mut js = jetstream::new(client);
    js.set_timeout(PROBE_TIMEOUT);
    let stream = &config.stream;
    let has_stream = js.get_stream(stream).await.is_ok();
    if has_stream {
        checks.push(Check::ok(AREA, format!("stream {stream}"), "exists"));
    } else if config.create_stream {
        checks.push(Check::ok(
            AREA,
            format!("stream {stream}"),
            "missing; the relay creates it on its first publish (nats.create_stream = true)",
        ));
    } else {
        checks.push(Check::fail(
            AREA,
            format!("stream {stream}"),
            "missing, and nats.create_stream = false: every publish would fail",
            format!("nats stream add {stream} --subjects '<aggregate>.>' (or set nats.create_stream = true)"),
        ));
    }
    for subject in destinations {
        let name = format!("subject {subject}");
        match js.stream_by_subject(subject.as_str()).await {
            Ok(owner) => checks.push(Check::ok(AREA, name, format!("captured by stream {owner}"))),
            Err(_) if config.create_stream => checks.push(Check::ok(
                AREA,
                name,
                format!(
                    "no stream captures it yet; the relay adds {} to stream {stream} on its \
                     first publish",
                    subject_pattern(subject)
                ),
            )),
            Err(_) => checks.push(Check::fail(
                AREA,
                name,
                "no stream captures it, and nats.create_stream = false: its events would be \
                 dead-lettered",
                format!(
                    "nats stream edit {stream} --subjects '{}' (adding it to the stream's \
                     subjects)",
                    subject_pattern(subject)
                ),
            )),
        }
    }
    checks
}
