//! Structured logs on stderr: human-readable by default, JSON with `--log-format json`.
//!
//! Field values carry writers' data (aggregate ids, event types, destinations, broker and
//! database error text). The text format writes every field, the message included, with its
//! control characters escaped ([`crate::escape`]): a newline in an aggregate id cannot forge a
//! log line, an escape sequence cannot reach the terminal. (tracing-subscriber escapes ESC in
//! the message only, not newlines, and not fields logged with `%`.) JSON lines are escaped by
//! serde. Colours are on only when stderr is a terminal, so that a log file holds no escape
//! sequence at all.

use std::{fmt::Write as _, io::IsTerminal as _};

use tracing_subscriber::{
    field::MakeExt as _,
    fmt::{self, format::Writer},
    EnvFilter,
};

use crate::escape::Escaping;

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
    let builder = fmt::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .log_internal_errors(false);
    match format {
        LogFormat::Text => builder
            .fmt_fields(fmt::format::debug_fn(escaped_field).delimited(" "))
            .init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// One field of a text line, `name=value` (the message alone), control characters escaped.
fn escaped_field(
    writer: &mut Writer<'_>,
    field: &tracing::field::Field,
    value: &dyn std::fmt::Debug,
) -> std::fmt::Result {
    match field.name() {
        "message" => write!(Escaping(writer), "{value:?}"),
        name => {
            write!(writer, "{}=", name.strip_prefix("r#").unwrap_or(name))?;
            write!(Escaping(writer), "{value:?}")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// The lines a text subscriber writes for one event, as `init` sets it up.
    fn text_of(event: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let written = buffer.clone();
        let subscriber = fmt::fmt()
            .with_writer(move || buffer.clone())
            .with_ansi(false)
            .fmt_fields(fmt::format::debug_fn(escaped_field).delimited(" "))
            .finish();
        tracing::subscriber::with_default(subscriber, event);
        let bytes = written.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn text_lines_escape_control_characters_in_every_field() {
        let id = "a\nFAKE LOG LINE \x1b[31mred";
        let text = text_of(|| tracing::warn!(aggregate_id = %id, other = ?id, "dead: {id}"));
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(!text.contains('\x1b'), "{text}");
        assert!(
            text.contains(r"aggregate_id=a\nFAKE LOG LINE \x1b[31mred"),
            "{text}"
        );
        assert!(text.contains(r"dead: a\nFAKE"), "{text}");
    }
}
