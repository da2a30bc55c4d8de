//! The `Host` allow-list of the dashboard and its API: a page on another site whose name
//! resolves to this relay (DNS rebinding) sends its own name as `Host`, and is refused.
//!
//! Always allowed: `localhost`, `127.0.0.1`, `[::1]` and the listen address's IP, on any port.
//! Operators add the names a proxy, an ingress or their browser use (`allowed_hosts`): `name`
//! allows it on any port, `name:port` on that port only. Names compare case-insensitively,
//! a trailing dot ignored.

use std::{net::SocketAddr, sync::Arc};

use axum::{
    extract::{Request, State},
    http::{header, StatusCode},
    middleware::Next,
    response::Response,
};

/// The names a request's `Host` may carry.
#[derive(Clone, Debug)]
pub(super) struct HostAllowList {
    allowed: Vec<Allowed>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Allowed {
    /// Lower case, IPv6 addresses in brackets, no trailing dot.
    name: String,
    /// `None`: any port.
    port: Option<u16>,
}

impl HostAllowList {
    /// The defaults for a dashboard served at `listen`, and `extra` (entries checked by
    /// [`check_allowed_hosts`]; one that does not parse is left out).
    pub(super) fn new(listen: SocketAddr, extra: &[String]) -> Self {
        let mut allowed: Vec<Allowed> = ["localhost", "127.0.0.1", "[::1]"]
            .into_iter()
            .map(|name| Allowed {
                name: name.into(),
                port: None,
            })
            .collect();
        if !listen.ip().is_unspecified() {
            let name = match listen {
                SocketAddr::V4(v4) => v4.ip().to_string(),
                SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
            };
            allowed.push(Allowed { name, port: None });
        }
        allowed.extend(extra.iter().filter_map(|entry| split(entry).ok()));
        Self { allowed }
    }

    /// Whether a request with this `Host` (or HTTP/2 authority) may be answered.
    fn allows(&self, host: &str) -> bool {
        let Ok(asked) = split(host) else {
            return false;
        };
        self.allowed
            .iter()
            .any(|a| a.name == asked.name && a.port.is_none_or(|p| Some(p) == asked.port))
    }
}

/// Checks `allowed_hosts` entries: a name or IP, with an optional port, no scheme or path.
/// The error names the entry.
pub fn check_allowed_hosts(entries: &[String]) -> Result<(), String> {
    for entry in entries {
        split(entry).map_err(|why| format!("allowed_hosts: {entry:?} {why}"))?;
    }
    Ok(())
}

/// `host[:port]` as a name and a port.
fn split(host: &str) -> Result<Allowed, &'static str> {
    let host = host.trim();
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let (ip, after) = rest
            .split_once(']')
            .ok_or("is an IPv6 address without its closing bracket")?;
        let ip: std::net::Ipv6Addr = ip
            .parse()
            .map_err(|_| "is not an IPv6 address in brackets")?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("has text after the address")?),
        };
        (format!("[{ip}]"), port)
    } else {
        let (name, port) = match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        };
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_');
        if !valid {
            return Err("is not a host name or IP address (no scheme, path or spaces)");
        }
        (name.trim_end_matches('.').to_ascii_lowercase(), port)
    };
    let port = port
        .map(|p| {
            p.parse::<u16>()
                .map_err(|_| "has a port that is not a number")
        })
        .transpose()?;
    Ok(Allowed { name, port })
}

/// Answers only requests whose `Host` is allowed; others get 421 and what to configure.
pub(super) async fn allowed(
    State(hosts): State<Arc<HostAllowList>>,
    request: Request,
    next: Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    match host {
        Some(host) if hosts.allows(&host) => next.run(request).await,
        Some(host) => super::error(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "Host {host:?} is not allowed: this relay answers localhost, 127.0.0.1, [::1], \
                 its listen address and the names in allowed_hosts (OUTBOX_ALLOWED_HOSTS)"
            ),
        ),
        None => super::error(StatusCode::MISDIRECTED_REQUEST, "a Host header is required"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_and_the_listen_address_are_allowed_on_any_port() {
        let list = HostAllowList::new("10.1.2.3:9187".parse().unwrap(), &[]);
        for host in [
            "localhost",
            "LOCALHOST:9187",
            "localhost.",
            "127.0.0.1:80",
            "[::1]:9187",
            "10.1.2.3",
            "10.1.2.3:9187",
        ] {
            assert!(list.allows(host), "{host}");
        }
        for host in ["evil.example", "evil.example:9187", "10.1.2.4", "", "[::2]"] {
            assert!(!list.allows(host), "{host}");
        }
    }

    #[test]
    fn configured_names_allow_their_port_or_any() {
        let extra = ["relay.internal".to_owned(), "ops.example:443".to_owned()];
        check_allowed_hosts(&extra).unwrap();
        let list = HostAllowList::new("0.0.0.0:9187".parse().unwrap(), &extra);
        assert!(list.allows("Relay.Internal:9187"));
        assert!(list.allows("ops.example:443"));
        assert!(!list.allows("ops.example:8443"));
        assert!(
            !list.allows("0.0.0.0:9187"),
            "the unspecified address is no name"
        );
    }

    #[test]
    fn entries_that_are_not_hosts_are_refused_with_their_name() {
        for bad in [
            "https://relay",
            "relay/path",
            "relay:port",
            "[::1",
            "a b",
            "",
        ] {
            let err = check_allowed_hosts(&[bad.to_owned()]).unwrap_err();
            assert!(err.contains("allowed_hosts"), "{err}");
        }
    }
}
