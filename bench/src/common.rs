//! What every part of the harness shares: the error type, a scenario's scope (schema, stream,
//! topic), the events' payload, and waiting on a condition or a signal.

use std::time::{Duration, Instant};

use outbox::Tables;

/// Error type of the harness: any error, printed with its message.
pub type Result<T> = std::result::Result<T, BoxError>;

/// Any error of the harness.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where one scenario lives: its outbox schema, JetStream stream and subject prefix.
#[derive(Clone, Debug)]
pub struct Scope {
    /// Scenario name (`drain`, `dbbound`, …).
    pub scenario: &'static str,
    /// The outbox tables, in schema `bench_<scenario>_<run>`.
    pub tables: Tables,
    /// JetStream stream `BENCH_<RUN>_<SCENARIO>`.
    pub stream: String,
    /// Subject prefix `bench.<run>.<scenario>`; the stream captures `<prefix>.>`.
    pub subjects: String,
    /// Kafka topic of the backlog's events (`<subjects>.order.OrderPlaced`, where the relay's
    /// routing sends them), with `--broker kafka`.
    pub topic: String,
    /// Whether the relay runs in CDC mode (the `cdc` comparison).
    pub cdc: bool,
}

impl Scope {
    /// The events table, qualified and quoted, for SQL text.
    pub fn events_table(&self) -> String {
        self.tables.render("{schema}.{events}")
    }
}

/// The port of a `scheme://user@host:port/path` URL or a `host:port[,host:port]` list (the
/// first), or `default`.
pub fn port_of(url: &str, default: u16) -> u16 {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.split(['/', ',', '?']).next().unwrap_or("");
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    host.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or(default)
}

/// SQL expression of a ~200-byte JSON order payload for row number `g`.
pub const PAYLOAD_SQL: &str = "format('{\"order_id\":%s,\"customer_id\":\"customer-%s\",\
    \"currency\":\"EUR\",\"total\":\"%s.90\",\"lines\":[{\"sku\":\"SKU-%s\",\"qty\":%s,\
    \"price\":\"19.90\"}],\"note\":\"%s\"}', g, g % 977, g % 500, g % 1000, 1 + g % 5, \
    repeat('x', 60))";

/// The same ~200-byte JSON order payload as the backlogs, for writers.
pub fn payload(g: u64) -> serde_json::Value {
    serde_json::json!({
        "order_id": g,
        "customer_id": format!("customer-{}", g % 977),
        "currency": "EUR",
        "total": format!("{}.90", g % 500),
        "lines": [{ "sku": format!("SKU-{}", g % 1000), "qty": 1 + g % 5, "price": "19.90" }],
        "note": "x".repeat(60),
    })
}

/// Runs `work`, or fails with "interrupted" on SIGINT or SIGTERM, so that the caller can still
/// remove its schema and stream (dropping `work` kills a relay child process).
pub async fn interruptible<T>(work: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        result = work => result,
        _ = tokio::signal::ctrl_c() => Err("interrupted (SIGINT)".into()),
        _ = term.recv() => Err("interrupted (SIGTERM)".into()),
    }
}

/// Polls `probe` every `every` until it returns true or `timeout` passes; returns the time
/// taken, or `None` on timeout.
pub async fn wait_until<F, Fut>(
    every: Duration,
    timeout: Duration,
    mut probe: F,
) -> Result<Option<Duration>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let started = Instant::now();
    loop {
        if probe().await? {
            return Ok(Some(started.elapsed()));
        }
        if started.elapsed() >= timeout {
            return Ok(None);
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ports_of_urls() {
        assert_eq!(port_of("nats://127.0.0.1:4222", 1), 4222);
        assert_eq!(port_of("amqp://guest:guest@127.0.0.1:5673/%2f", 1), 5673);
        assert_eq!(port_of("127.0.0.1:9093,127.0.0.1:9094", 1), 9093);
        assert_eq!(port_of("nats://localhost", 4222), 4222);
    }

    #[test]
    fn payload_is_about_200_bytes() {
        let len = serde_json::to_vec(&payload(123_456)).unwrap().len();
        assert!((180..=230).contains(&len), "{len}");
    }
}
