//! What `outbox doctor` reports: one finding per check, each problem with the exact fix.
//! The checks live next to what they check: the broker probes in [`crate::publishers::probe`],
//! the database checks in [`database`] (each backend answering them from its own folder).

pub mod database;

use std::time::Duration;

use serde::Serialize;

/// How long each network step of a broker probe may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// As the relay needs it.
    Ok,
    /// Works, but will hurt (a growing backlog, a setting that costs later).
    Warn,
    /// The relay cannot work, or will lose or hold events, until it is fixed.
    Fail,
}

impl Level {
    /// The mark printed before the line.
    pub fn mark(self) -> &'static str {
        match self {
            Level::Ok => "✓",
            Level::Warn => "⚠",
            Level::Fail => "✗",
        }
    }
}

/// One finding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// `database`, `cdc`, `relays`, `broker` or `config`.
    pub area: &'static str,
    /// What was checked, e.g. `reachable`, `migrations`, `stream OUTBOX`.
    pub name: String,
    /// How it came out.
    pub level: Level,
    /// What was found.
    pub detail: String,
    /// What to do about it (for warnings and failures).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    /// A passed check.
    pub fn ok(area: &'static str, name: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            area,
            name: name.into(),
            level: Level::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    /// A warning with its fix.
    pub fn warn(
        area: &'static str,
        name: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::ok(area, name, detail).needs(Level::Warn, fix)
    }

    /// A failure with its fix.
    pub fn fail(
        area: &'static str,
        name: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::ok(area, name, detail).needs(Level::Fail, fix)
    }

    fn needs(self, level: Level, fix: impl Into<String>) -> Self {
        Self {
            level,
            fix: Some(fix.into()),
            ..self
        }
    }

    /// The line printed for it: mark, area, name and what was found, then the fix indented.
    pub fn line(&self) -> String {
        let mut line = format!(
            "{} {} {}: {}",
            self.level.mark(),
            self.area,
            self.name,
            self.detail
        );
        if let Some(fix) = &self.fix {
            line.push_str("\n    fix: ");
            line.push_str(fix);
        }
        line
    }
}

/// `host:port` of a URL (`scheme://[user[:password]@]host[:port][/…]`), never its credentials;
/// `default_port` when it names none. `None` when there is no host.
pub fn server_address(url: &str, default_port: u16) -> Option<String> {
    // After the credentials, wherever a password with `/`, `@`, `:` or `#` makes them end.
    let server = crate::redact::after_userinfo(url)?;
    let host_port = server.split(['/', '?', '#']).next().unwrap_or("");
    // The first of several `host:port,host:port` (Kafka's bootstrap list).
    let host_port = host_port.split(',').next().unwrap_or("");
    if host_port.is_empty() {
        return None;
    }
    let has_port = match host_port.rsplit_once(':') {
        // `[::1]:5432` has a port, `[::1]` and `::1` do not.
        Some((host, port)) => {
            port.chars().all(|c| c.is_ascii_digit()) && !port.is_empty() && !host.ends_with(':')
        }
        None => false,
    };
    if has_port && !(host_port.starts_with('[') && host_port.ends_with(']')) {
        Some(host_port.to_owned())
    } else {
        Some(format!("{host_port}:{default_port}"))
    }
}

/// Opens a TCP connection to `address` within `timeout`: the cause when the server is not
/// there (refused, unknown host, timed out), in words an operator can act on.
pub async fn reach(address: &str, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(address)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(match error.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                format!("connection refused at {address} (nothing listens there)")
            }
            _ if error.to_string().contains("lookup") || error.raw_os_error().is_none() => {
                format!("cannot resolve or reach {address}: {error}")
            }
            _ => format!("cannot connect to {address}: {error}"),
        }),
        Err(_) => Err(format!(
            "no answer from {address} within {timeout:?} (a firewall, or the wrong host)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_never_carry_credentials() {
        for (url, expected) in [
            ("postgres://u:p@db:5999/x", Some("db:5999")),
            ("postgres://u:p/SEC@x:y@db:5999/x", Some("db:5999")),
            ("postgres://db/x", Some("db:5432")),
            ("amqp://guest:s3cr@t@rabbit:5673/%2f", Some("rabbit:5673")),
            ("kafka://a:9092,b:9093", Some("a:9092")),
            ("nats://[::1]:4222", Some("[::1]:4222")),
            ("nats://[::1]", Some("[::1]:5432")),
            (
                "mysql://root@127.0.0.1/test?ssl-mode=disabled",
                Some("127.0.0.1:5432"),
            ),
            ("sqs://eu-west-1", Some("eu-west-1:5432")),
            ("no-scheme", None),
            ("nats://", None),
        ] {
            assert_eq!(server_address(url, 5432).as_deref(), expected, "{url}");
        }
    }

    #[test]
    fn lines_show_the_mark_and_the_fix() {
        let check = Check::fail("database", "reachable", "refused", "start it");
        assert_eq!(
            check.line(),
            "✗ database reachable: refused\n    fix: start it"
        );
        assert_eq!(Check::ok("broker", "x", "y").line(), "✓ broker x: y");
    }

    #[tokio::test]
    async fn a_closed_port_is_named_refused() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        drop(listener);
        let error = reach(&address, Duration::from_secs(2)).await.unwrap_err();
        assert!(error.contains("connection refused"), "{error}");
        assert!(error.contains(&address), "{error}");
    }
}
