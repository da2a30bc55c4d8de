use futures::future::BoxFuture;
use redis::{aio::ConnectionManager, aio::ConnectionManagerConfig, RedisError, Script};

use super::RedisConfig;
use crate::{
    error::Error, publisher::check_payload_size, publisher::PublishError, publisher::Publisher,
    wire::message::Message,
};

/// Adds one entry unless the event id was added within the dedupe window.
///
/// KEYS[1] stream, KEYS[2] dedupe key; ARGV[1] window in ms (0: no dedupe), ARGV[2] maxlen
/// (0: no trimming), ARGV[3] trim operator (`~` or `=`), ARGV[4..] field/value pairs.
/// Returns `{1, id}` for a new entry, `{0, id}` for a duplicate of entry `id`.
const XADD_ONCE: &str = r#"
local window = tonumber(ARGV[1])
if window > 0 then
  local seen = redis.call('GET', KEYS[2])
  if seen then return {0, seen} end
end
local id
if tonumber(ARGV[2]) > 0 then
  id = redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[3], ARGV[2], '*', unpack(ARGV, 4))
else
  id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 4))
end
if window > 0 then redis.call('SET', KEYS[2], id, 'PX', window) end
return {1, id}
"#;

/// The stream field holding the payload; a writer's header of that name travels as
/// `header.payload`.
pub const PAYLOAD_FIELD: &str = "payload";

/// What sets the relay's dedupe keys (`{stream}:outbox-dedupe:<message id>`) apart: a stream
/// key holding it is refused, so that no event can be added to, or collide with, a key the
/// relay keeps for itself.
const DEDUPE_KEY_MARK: &str = ":outbox-dedupe:";

/// Publishes to Redis Streams. The connection is opened lazily and re-opened after a loss;
/// publishes in the meantime fail as transient.
pub struct RedisPublisher {
    config: RedisConfig,
    connection: ConnectionManager,
    script: Script,
}

impl RedisPublisher {
    /// Prepares the client; the server may be down (the first publish connects).
    pub fn connect(config: RedisConfig) -> Result<Self, Error> {
        config.validate().map_err(Error::Config)?;
        let client = redis::Client::open(config.url.as_str()).map_err(|e| Error::Setting {
            field: "redis.url".into(),
            source: Box::new(e),
        })?;
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.response_timeout))
            .set_number_of_retries(1);
        let connection = ConnectionManager::new_lazy_with_config(client, manager)
            .map_err(|e| Error::broker("redis", e))?;
        tracing::info!(url = %config.redacted_url(), "redis streams publisher ready");
        Ok(Self {
            config,
            connection,
            script: Script::new(XADD_ONCE),
        })
    }

    /// The key remembering that `message` was added. The hash tag keeps it in the stream's
    /// cluster slot, as a script touching both keys requires.
    fn dedupe_key(message: &Message) -> String {
        format!(
            "{{{}}}{DEDUPE_KEY_MARK}{}",
            message.destination, message.message_id
        )
    }

    async fn add(&self, message: &Message) -> Result<String, RedisError> {
        let mut invocation = self.script.key(&message.destination);
        invocation
            .key(Self::dedupe_key(message))
            .arg(self.config.dedupe_window.as_millis() as u64)
            .arg(self.config.maxlen.unwrap_or(0))
            .arg(if self.config.exact_trim { "=" } else { "~" });
        message.visit_headers(|name, value| {
            let name = if name == PAYLOAD_FIELD {
                "header.payload"
            } else {
                name
            };
            invocation.arg(name).arg(value);
        });
        invocation.arg(PAYLOAD_FIELD).arg(message.payload.as_ref());
        let mut connection = self.connection.clone();
        let (added, id): (i64, String) = invocation.invoke_async(&mut connection).await?;
        if added == 0 {
            tracing::debug!(event_id = %message.event_id, entry = %id, "duplicate dropped by redis dedupe");
        }
        Ok(id)
    }

    async fn wait_for_replicas(&self, entry: &str) -> Result<(), PublishError> {
        let wanted = self.config.wait_replicas;
        if wanted == 0 {
            return Ok(());
        }
        let mut connection = self.connection.clone();
        let acked: u32 = redis::cmd("WAIT")
            .arg(wanted)
            .arg(self.config.wait_timeout.as_millis() as u64)
            .query_async(&mut connection)
            .await
            .map_err(|e| classify(&e))?;
        if acked < wanted {
            return Err(PublishError::transient(format!(
                "redis: entry {entry} reached {acked} of {wanted} replicas within {:?}",
                self.config.wait_timeout
            )));
        }
        Ok(())
    }
}

/// Classifies a Redis error: the one place Redis outcomes become retry decisions. Failures
/// that would hit every message (connection, auth, failover, memory) are transient so the
/// relay pauses instead of dead-lettering; only what is wrong with this message's
/// destination is permanent.
fn classify(error: &RedisError) -> PublishError {
    let text = format!("redis: {error}");
    if error.is_io_error()
        || error.is_timeout()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
    {
        return PublishError::transient(text);
    }
    match error.code() {
        Some("WRONGTYPE") => PublishError::permanent(format!(
            "{text} (the destination key exists and is not a stream)"
        )),
        Some(
            "OOM" | "BUSY" | "LOADING" | "TRYAGAIN" | "MASTERDOWN" | "READONLY" | "CLUSTERDOWN"
            | "MOVED" | "ASK" | "NOAUTH" | "WRONGPASS" | "NOPERM" | "NOSCRIPT" | "NOREPLICAS",
        ) => PublishError::transient(text),
        Some(_) => PublishError::permanent(text),
        None => PublishError::transient(text),
    }
}

impl Publisher for RedisPublisher {
    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            check_payload_size(message, self.config.max_payload_bytes)?;
            self.check_destination(&message.destination)?;
            let entry = self.add(message).await.map_err(|e| classify(&e))?;
            self.wait_for_replicas(&entry).await
        })
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn max_payload_bytes(&self) -> usize {
        self.config.max_payload_bytes
    }

    fn check_destination(&self, destination: &str) -> Result<(), PublishError> {
        check_stream_key(destination, &self.config.stream_prefixes)
    }
}

/// Refuses, as permanent, a stream key an event may not be added to: empty or over 1024
/// bytes, in the relay's own dedupe namespace, or outside `redis.stream_prefixes` when that
/// is set. The error names the key and the rule.
fn check_stream_key(key: &str, prefixes: &[String]) -> Result<(), PublishError> {
    if key.is_empty() || key.len() > 1024 {
        return Err(PublishError::permanent(format!(
            "redis: {:?} is not a usable stream key (1 to 1024 bytes)",
            key.chars().take(64).collect::<String>()
        )));
    }
    if key.contains(DEDUPE_KEY_MARK) {
        return Err(PublishError::permanent(format!(
            "redis: stream key {key:?} refused: keys holding {DEDUPE_KEY_MARK:?} are the \
             relay's dedupe keys"
        )));
    }
    crate::wire::routing::check_prefixes("redis.stream_prefixes", key, prefixes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(code: &str) -> RedisError {
        // The same parsing path a server reply takes.
        let reply = format!("-{code} some detail\r\n");
        redis::parse_redis_value(reply.as_bytes())
            .and_then(redis::Value::extract_error)
            .unwrap_err()
    }

    #[test]
    fn stream_keys_stay_out_of_the_relays_keys_and_inside_the_prefixes() {
        check_stream_key("orders", &[]).unwrap();
        let relay_key = "{orders}:outbox-dedupe:0190a0a0-0000-7000-8000-000000000000";
        let error = check_stream_key(relay_key, &[]).unwrap_err();
        assert!(!error.is_transient());
        assert!(error.message.contains("dedupe"), "{error}");
        assert!(check_stream_key("", &[]).is_err());
        assert!(check_stream_key(&"k".repeat(1025), &[]).is_err());
        let prefixes = vec!["events:".to_owned()];
        check_stream_key("events:orders", &prefixes).unwrap();
        let error = check_stream_key("jobs:queue", &prefixes).unwrap_err();
        assert!(error.message.contains("redis.stream_prefixes"), "{error}");
    }

    #[test]
    fn classifies_server_errors() {
        assert!(!classify(&server_error("WRONGTYPE")).is_transient());
        assert!(!classify(&server_error("ERR")).is_transient());
        for code in ["OOM", "LOADING", "READONLY", "NOAUTH", "MASTERDOWN"] {
            assert!(classify(&server_error(code)).is_transient(), "{code}");
        }
    }
}
