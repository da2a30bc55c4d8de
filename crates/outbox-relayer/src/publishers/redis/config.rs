use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Redis Streams settings (`[redis]` in the config file).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// Server URL (`redis://[user:password@]host:6379[/db]`, `rediss://` for TLS); usually
    /// given as `--broker-url`. The password is never logged.
    pub url: String,
    /// Trim each stream to about this many entries on every `XADD` (`MAXLEN ~ n`; default
    /// none: streams grow until consumers or an operator trim them).
    pub maxlen: Option<u64>,
    /// Trim exactly (`MAXLEN = n`) instead of approximately (default false: `~`, much cheaper).
    pub exact_trim: bool,
    /// How long an event id is remembered to drop a re-publish (default 2m, like JetStream's
    /// duplicate window); `0s` turns dedupe off.
    #[serde(with = "humantime_serde")]
    pub dedupe_window: Duration,
    /// Replicas that must acknowledge each entry (`WAIT`) before it counts as published
    /// (default 0: the primary's reply is the ack).
    pub wait_replicas: u32,
    /// How long `WAIT` may block (default 1s); fewer replicas by then is a transient failure.
    #[serde(with = "humantime_serde")]
    pub wait_timeout: Duration,
    /// Give up connecting after this long (default 5s); the attempt is transient.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Give up waiting for a reply after this long (default 5s); the attempt is transient.
    #[serde(with = "humantime_serde")]
    pub response_timeout: Duration,
    /// Largest payload published (default 1 MiB; Redis itself takes up to 512 MB).
    pub max_payload_bytes: usize,
    /// Stream key prefixes an event may be added to (default none: any key). A prefix matches
    /// as written (`events:` allows `events:orders`). Set it whenever the server holds other
    /// keys than the relay's streams: without it a writer can add entries to any stream on
    /// the server (keys of other types are refused by Redis itself). Keys in the relay's own
    /// dedupe namespace stay refused whatever this allows.
    pub stream_prefixes: Vec<String>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".into(),
            maxlen: None,
            exact_trim: false,
            dedupe_window: Duration::from_secs(120),
            wait_replicas: 0,
            wait_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
            max_payload_bytes: 1024 * 1024,
            stream_prefixes: Vec::new(),
        }
    }
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.redacted_url())
            .field("maxlen", &self.maxlen)
            .field("exact_trim", &self.exact_trim)
            .field("dedupe_window", &self.dedupe_window)
            .field("wait_replicas", &self.wait_replicas)
            .field("wait_timeout", &self.wait_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .field("stream_prefixes", &self.stream_prefixes)
            .finish()
    }
}

impl RedisConfig {
    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.url.starts_with("redis://") || self.url.starts_with("rediss://")) {
            return Err("redis.url: must start with redis:// or rediss://".into());
        }
        if self.maxlen == Some(0) {
            return Err("redis.maxlen: must be more than 0 (leave it out for no trimming)".into());
        }
        if self.wait_replicas > 0 && self.wait_timeout.is_zero() {
            return Err("redis.wait_timeout: must be more than 0 when wait_replicas is set".into());
        }
        if self.connect_timeout.is_zero() {
            return Err("redis.connect_timeout: must be more than 0".into());
        }
        if self.response_timeout.is_zero() {
            return Err("redis.response_timeout: must be more than 0".into());
        }
        if self.max_payload_bytes == 0 || self.max_payload_bytes > 512 * 1024 * 1024 {
            return Err("redis.max_payload_bytes: must be between 1 and 512 MiB".into());
        }
        if self.stream_prefixes.iter().any(String::is_empty) {
            return Err("redis.stream_prefixes: a prefix must not be empty".into());
        }
        Ok(())
    }

    /// The URL with its password hidden, for logs.
    pub fn redacted_url(&self) -> String {
        crate::publishers::redact_url(&self.url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_field() {
        let bad = |c: RedisConfig| c.validate().unwrap_err();
        assert!(bad(RedisConfig {
            url: "http://x".into(),
            ..Default::default()
        })
        .starts_with("redis.url"));
        assert!(bad(RedisConfig {
            maxlen: Some(0),
            ..Default::default()
        })
        .starts_with("redis.maxlen"));
        assert!(bad(RedisConfig {
            wait_replicas: 1,
            wait_timeout: Duration::ZERO,
            ..Default::default()
        })
        .starts_with("redis.wait_timeout"));
        assert!(RedisConfig::default().validate().is_ok());
    }

    #[test]
    fn debug_hides_the_password() {
        let c = RedisConfig {
            url: "redis://app:s3cret@cache:6379/2".into(),
            ..Default::default()
        };
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("cache:6379"), "{shown}");
    }
}
