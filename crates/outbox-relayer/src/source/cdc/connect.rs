//! Where the replication connection goes: the database URL the relay was given, read into the
//! replication client's settings (the pool's options cannot give the password back).

use pgwire_replication::{ReplicationConfig, SslMode, TlsConfig};

use crate::error::Error;

/// The server, credentials and TLS mode of a replication connection. `Debug` never shows the
/// password.
#[derive(Clone)]
pub struct ReplicationTarget {
    host: String,
    port: u16,
    user: String,
    password: String,
    database: String,
    tls: TlsConfig,
}

impl std::fmt::Debug for ReplicationTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicationTarget")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

impl ReplicationTarget {
    /// Reads a `postgres://user:password@host:port/database?sslmode=…` URL exactly as the
    /// relay's pool reads it: the server, port, Unix socket (`host=/dir`), user, database and
    /// TLS mode come from sqlx's own parse of the URL (its spellings `sslmode` / `ssl-mode`,
    /// `port=`, `dbname=`, `user=`, and the `PG…` environment variables), so the replication
    /// stream can never go elsewhere, or with weaker TLS, than the pool. The password is the
    /// URL's (or `password=`, or `PGPASSWORD`), and the CA file `sslrootcert=` / `ssl-root-cert=`
    /// / `ssl-ca=` (or `PGSSLROOTCERT`). TLS modes mean what they mean to libpq: `prefer` (the
    /// default) and `allow` try TLS and go on without it when the server refuses TLS, `require`
    /// demands TLS without checking the certificate, `verify-ca` checks it against the CA file
    /// (the Mozilla roots without one), `verify-full` checks the host name too, `disable` never
    /// uses TLS. Client certificates (`sslcert`, `sslkey`) and `hostaddr` are refused: the
    /// replication client cannot honour them.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        use sqlx::postgres::{PgConnectOptions, PgSslMode};
        let bad = |why: &str| Error::Config(format!("database URL for replication: {why}"));
        let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
        if !matches!(parsed.scheme(), "postgres" | "postgresql") {
            return Err(bad("CDC needs a postgres:// URL"));
        }
        let options: PgConnectOptions = url
            .parse()
            .map_err(|e: sqlx::Error| bad(&crate::redact::urls_in(&e.to_string())))?;
        let decode = |s: &str| {
            percent_decode(s).ok_or_else(|| bad("user or password is not valid percent-encoding"))
        };
        let mut password = parsed.password().map(decode).transpose()?;
        let mut root_cert = None;
        for (k, v) in parsed.query_pairs() {
            match k.as_ref() {
                "password" => password = Some(v.into_owned()),
                "sslrootcert" | "ssl-root-cert" | "ssl-ca" => {
                    root_cert = Some(std::path::PathBuf::from(v.as_ref()))
                }
                "sslcert" | "ssl-cert" | "sslkey" | "ssl-key" | "hostaddr" => {
                    return Err(bad(&format!(
                        "`{k}` is not supported by the replication connection"
                    )))
                }
                _ => {}
            }
        }
        let password = password
            .or_else(|| std::env::var("PGPASSWORD").ok())
            .unwrap_or_default();
        let root_cert =
            root_cert.or_else(|| std::env::var_os("PGSSLROOTCERT").map(std::path::PathBuf::from));
        let tls = match options.get_ssl_mode() {
            PgSslMode::Disable => TlsConfig::disabled(),
            // libpq's `allow` tries without TLS first; TLS first is the safer of the two
            // orders and meets every server `allow` meets.
            PgSslMode::Allow | PgSslMode::Prefer => TlsConfig {
                mode: SslMode::Prefer,
                ..TlsConfig::disabled()
            },
            PgSslMode::Require => TlsConfig::require(),
            PgSslMode::VerifyCa => TlsConfig::verify_ca(root_cert),
            PgSslMode::VerifyFull => TlsConfig::verify_full(root_cert),
        };
        let host = match options.get_socket() {
            Some(dir) => dir.to_string_lossy().into_owned(),
            None => options.get_host().to_owned(),
        };
        let user = options.get_username().to_owned();
        Ok(Self {
            host,
            port: options.get_port(),
            database: options
                .get_database()
                .map_or_else(|| user.clone(), str::to_owned),
            password,
            user,
            tls,
        })
    }

    /// The replication client's settings for `slot` and `publication`. The client reads ahead
    /// of the relay by up to [`READ_AHEAD_EVENTS`] decoded changes.
    pub(crate) fn config(&self, slot: &str, publication: &str, app: &str) -> ReplicationConfig {
        ReplicationConfig::new(
            self.host.clone(),
            self.user.clone(),
            self.password.clone(),
            self.database.clone(),
            slot,
            publication,
        )
        .with_port(self.port)
        .with_tls(self.tls.clone())
        .with_binary(true)
        .with_status_interval(std::time::Duration::from_millis(100))
        .with_wakeup_interval(std::time::Duration::from_secs(1))
        .with_buffer_size(READ_AHEAD_EVENTS)
        .with_application_name(app)
    }
}

/// Changes the replication client decodes ahead of the relay. It counts changes, not bytes, so
/// this bounds the read-ahead to this many times the largest payload (256 MiB at the default
/// 1 MiB): at 16,384 a transaction of large payloads was read into memory whole (631 MB of
/// RSS for one transaction of 1.5 GiB, `outbox-bench bigtx`).
pub(crate) const READ_AHEAD_EVENTS: usize = 256;

fn percent_decode(s: &str) -> Option<String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_parts_of_a_url_and_hides_the_password() {
        let t = ReplicationTarget::from_url("postgres://app:s%40cret@db:6543/shop?sslmode=require")
            .unwrap();
        assert_eq!(
            (
                t.host.as_str(),
                t.port,
                t.user.as_str(),
                t.database.as_str()
            ),
            ("db", 6543, "app", "shop")
        );
        assert_eq!(t.password, "s@cret");
        assert!(!format!("{t:?}").contains("s@cret"));
        let t = ReplicationTarget::from_url("postgres://postgres@127.0.0.1/test").unwrap();
        assert_eq!(t.port, 5432);
        assert_eq!(t.tls.mode, SslMode::Prefer, "libpq's default");
        for (mode, expected) in [
            ("disable", SslMode::Disable),
            ("allow", SslMode::Prefer),
            ("prefer", SslMode::Prefer),
            ("require", SslMode::Require),
            ("verify-ca", SslMode::VerifyCa),
            ("verify-full", SslMode::VerifyFull),
        ] {
            let url = format!("postgres://postgres@db/test?sslmode={mode}");
            assert_eq!(
                ReplicationTarget::from_url(&url).unwrap().tls.mode,
                expected
            );
        }
        // Every spelling the pool reads, the replication connection reads alike.
        let t = ReplicationTarget::from_url(
            "postgres://app@db/shop?ssl-mode=verify-full&ssl-root-cert=/ca.pem&port=6000&dbname=other",
        )
        .unwrap();
        assert_eq!(t.tls.mode, SslMode::VerifyFull);
        assert_eq!((t.port, t.database.as_str()), (6000, "other"));
        for (bad, expected) in [
            ("mysql://x@h/db", "postgres://"),
            ("postgres://x@h/db?sslmode=maybe", "maybe"),
            (
                "postgres://x@h/db?sslcert=/c.pem",
                "`sslcert` is not supported",
            ),
            (
                "postgres://x@h/db?hostaddr=10.0.0.1",
                "`hostaddr` is not supported",
            ),
            ("not a url", "database URL for replication"),
        ] {
            let e = ReplicationTarget::from_url(bad).unwrap_err().to_string();
            assert!(e.contains(expected), "{bad}: {e}");
        }
    }
}
