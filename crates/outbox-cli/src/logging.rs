//! Structured logs on stderr: human-readable by default, JSON with `--log-format json`.

use tracing_subscriber::{fmt, EnvFilter};

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber. The level comes from `RUST_LOG` (default `info`).
///
/// A log line that cannot be written (stderr a closed pipe: `outbox relay 2>&1 | head`) is
/// dropped quietly: reporting it would print to that same stderr, and printing to a closed
/// stderr panics the task that logged, such as the one that stops the relay on SIGTERM.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
