//! Relay settings. Every field has a default, named in its doc; `validate` checks them without
//! I/O and names the offending field.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{retry::RetryPolicy, wire::cloudevents::Envelope, wire::routing::RoutingConfig};

/// Longest duration any setting takes: far above any sensible value, and small enough that
/// what the relay computes from one (three times a heartbeat, an instant that far ahead, a
/// PostgreSQL interval) cannot overflow. A config file can spell up to 2^64 seconds.
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// What happens to an aggregate's later events when its head event is dead-lettered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDead {
    /// Later events wait until an operator replays or skips the dead one (default; keeps G4).
    #[default]
    Park,
    /// Later events go on; the dead one stays in the table for inspection.
    Skip,
}

/// Where the relay finds committed events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Claim pending rows of the events table (default; PostgreSQL and SQLite). Any number of
    /// relays share the partitions.
    #[default]
    Poll,
    /// Stream inserts (and table-less messages) from a PostgreSQL logical replication slot, in
    /// commit order. One relay streams at a time; others wait as standbys. See [`crate::source::cdc`].
    Cdc,
}

/// Settings of the CDC source (`[relay.cdc]`), used when `mode = "cdc"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CdcConfig {
    /// Replication slot (default `{schema}_{table}`, as `outbox migrate --cdc` creates it).
    pub slot: Option<String>,
    /// Publication (default `{schema}_{table}`).
    pub publication: Option<String>,
    /// How often, when nothing is written, the relay writes a heartbeat into the WAL so that
    /// the slot keeps advancing and retains no WAL for other databases' writes (default 10s).
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// Largest WAL the slot should retain (default 1 GiB). At 80% of it the relay logs an
    /// error and sets `outbox_cdc_retained_wal_alarm` to 1; readiness fails past it. Set
    /// PostgreSQL's `max_slot_wal_keep_size` above it to protect the disk.
    pub max_retained_wal_bytes: u64,
    /// Longest wait for more changes before a partial batch is published (default 0: publish
    /// whatever has arrived at once).
    #[serde(with = "humantime_serde")]
    pub batch_linger: Duration,
    /// Events of one transaction held in memory until its commit arrives (default 50,000):
    /// past it (or past 64 MiB), its events are published in chunks before the commit, and its
    /// position confirmed after it.
    pub max_transaction_events: usize,
}

impl Default for CdcConfig {
    fn default() -> Self {
        Self {
            slot: None,
            publication: None,
            heartbeat_interval: Duration::from_secs(10),
            max_retained_wal_bytes: 1 << 30,
            batch_linger: Duration::ZERO,
            max_transaction_events: 50_000,
        }
    }
}

/// The largest `max_batch_size`: MySQL binds a batch's ids one placeholder each, padded to a
/// power of two, and refuses a statement of more than 65,535 placeholders (a batch of 32,769
/// failed every claim and mark, retried for ever).
pub const MAX_BATCH_SIZE: i64 = 16_384;

/// Relay configuration (`[relay]` in the config file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelayConfig {
    /// Where events come from: `poll` (default) or `cdc`.
    pub mode: Mode,
    /// The CDC source's settings (`mode = "cdc"`).
    pub cdc: CdcConfig,
    /// This instance's id in the lease table. Default: `{hostname}-{pid}-{random}`.
    pub relay_id: Option<String>,
    /// Schema holding the outbox (default `outbox`).
    pub schema: String,
    /// Events table in that schema (default `events`).
    pub table: String,
    /// Smallest batch the adaptive claim shrinks to (default 50).
    pub min_batch_size: i64,
    /// Largest batch the adaptive claim grows to (default 1000). The batch doubles while claims
    /// come back full and halves when they come back less than a quarter full. At most
    /// [`MAX_BATCH_SIZE`].
    pub max_batch_size: i64,
    /// Batches in flight at once (default 4): the next claim (in CDC mode, the next batch of the
    /// stream) runs while earlier batches publish.
    pub max_inflight_batches: usize,
    /// Aggregates published concurrently within one batch (default 256). Each publish awaiting
    /// its acknowledgement holds a few KiB (its message's broker headers and futures), and
    /// `max_inflight_batches` batches publish at once: 4 × 256 is a window of 1,024 messages
    /// awaiting acknowledgement, which drains NATS as fast as 4 × 1,024 did (`bench/RESULTS.md`)
    /// in a fraction of the memory.
    pub lane_concurrency: usize,
    /// Longest wait for one broker acknowledgement (default 30s); then the attempt counts as a
    /// transient failure (the message may have been delivered: the retry is a duplicate).
    #[serde(with = "humantime_serde")]
    pub publish_timeout: Duration,
    /// Fallback poll when no notification arrives (default 1s). Busy relays never wait: after
    /// a claim that found events the relay claims again after `claim_linger`, the wait
    /// doubling up to this while claims come back empty.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Shortest time from one claim to the next when the first came back less than full
    /// (default 2ms; 0 claims on every notification). A full claim is followed at once; at a
    /// moderate write rate, the events of a few milliseconds are claimed, published and
    /// marked together instead of one statement pair per commit, for at most this much more
    /// latency.
    #[serde(with = "humantime_serde")]
    pub claim_linger: Duration,
    /// Longest time between full scans of a partition (default 2s). Between them, a claim
    /// starts where the previous one found pending rows, so that it does not walk the index
    /// entries of published rows; a full scan finds rows whose transaction committed after
    /// later ones (and retries whose hold expired). It bounds their extra latency.
    #[serde(with = "humantime_serde")]
    pub rescan_interval: Duration,
    /// Lease duration (default 10s). A crashed relay's partitions are taken over after this.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// Heartbeat and rebalance period (default 2s); must be under a third of `lease_ttl`.
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// How often the lag and backlog gauges are sampled (default 5s).
    #[serde(with = "humantime_serde")]
    pub stats_interval: Duration,
    /// `/readyz` fails (503) when, for this long (default 60s), events were pending and this
    /// relay published nothing, or its claims did not succeed, or its loop did not turn, or
    /// the database did not answer. A relay whose loop has not turned for this long also stops
    /// renewing its leases, so that another relay takes its partitions over.
    #[serde(with = "humantime_serde")]
    pub stall_timeout: Duration,
    /// Delete published rows older than this, from inside the relay (default: off; run
    /// `outbox purge` from a scheduler instead, or set e.g. "7d"). PostgreSQL and SQLite.
    #[serde(with = "humantime_serde")]
    pub purge_retention: Option<Duration>,
    /// How often the relay's purge runs when `purge_retention` is set (default 1m).
    #[serde(with = "humantime_serde")]
    pub purge_interval: Duration,
    /// Largest payload published (default: the broker's own limit). Larger rows are
    /// dead-lettered without being loaded into memory.
    pub max_payload_bytes: Option<usize>,
    /// Bytes of claimed events the relay holds in memory at once, across the batches in flight
    /// (default 64 MiB): payloads, headers and text columns. A claim stops adding rows at the
    /// budget left (it always takes one row, so one event larger than the budget still goes
    /// through, alone), and no claim starts while the budget is used up.
    pub max_inflight_bytes: u64,
    /// `statement_timeout` on the relay's PostgreSQL connections, `max_statement_time` on
    /// MariaDB's, `max_execution_time` on MySQL's (default 30s): a statement
    /// that runs longer fails, is counted in `outbox_database_errors_total` and retried, and
    /// the loop goes on. The relay also gives up waiting for an answer 5 s after it (a
    /// connection that hangs without an error).
    #[serde(with = "humantime_serde")]
    pub statement_timeout: Duration,
    /// `lock_timeout` on the relay's PostgreSQL connections (default 5s): a statement blocked
    /// behind another session's lock on the outbox tables fails after it instead of hanging.
    /// On MySQL and MariaDB, `innodb_lock_wait_timeout`, in whole seconds, and at most half
    /// of `lease_ttl` (see [`RelayConfig::mysql_session`]).
    #[serde(with = "humantime_serde")]
    pub lock_timeout: Duration,
    /// What a dead head event does to its aggregate (default `park`).
    pub on_dead: OnDead,
    /// Retry and dead-letter policy.
    pub retry: RetryPolicy,
    /// Destination routing, and fan-out copies for other schema versions.
    pub routing: RoutingConfig,
    /// How events go on the wire (default `outbox`: the payload and the relay's native
    /// headers; or `cloudevents-binary`, `cloudevents-structured`). See [`crate::wire::cloudevents`].
    pub envelope: Envelope,
    /// The CloudEvents `source` attribute, a URI reference (default `/outbox/{aggregate_type}`;
    /// placeholders as in routing templates). Used by the CloudEvents envelopes only.
    pub cloudevents_source: String,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Poll,
            cdc: CdcConfig::default(),
            relay_id: None,
            schema: "outbox".into(),
            table: "events".into(),
            min_batch_size: 50,
            max_batch_size: 1000,
            max_inflight_batches: 4,
            lane_concurrency: 256,
            publish_timeout: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            claim_linger: Duration::from_millis(2),
            rescan_interval: Duration::from_secs(2),
            lease_ttl: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(2),
            stats_interval: Duration::from_secs(5),
            stall_timeout: Duration::from_secs(60),
            purge_retention: None,
            purge_interval: Duration::from_secs(60),
            max_payload_bytes: None,
            max_inflight_bytes: 64 << 20,
            statement_timeout: Duration::from_secs(30),
            lock_timeout: Duration::from_secs(5),
            on_dead: OnDead::Park,
            retry: RetryPolicy::default(),
            routing: RoutingConfig::default(),
            envelope: Envelope::Outbox,
            cloudevents_source: "/outbox/{aggregate_type}".into(),
        }
    }
}

impl RelayConfig {
    /// The session of the relay's MySQL and MariaDB connections: `lock_timeout` as the lock
    /// wait, but at most half of `lease_ttl` (a relay blocked behind a lock must fail and
    /// report before its leases lapse), and `statement_timeout` as the statement limit.
    #[cfg(feature = "mysql")]
    pub fn mysql_session(&self) -> outbox::mysql::Session {
        outbox::mysql::Session {
            lock_wait: self.lock_timeout.min(self.lease_ttl / 2),
            statement: self.statement_timeout,
        }
    }

    /// Checks every field without I/O.
    pub fn validate(&self) -> Result<(), crate::error::Error> {
        self.check().map_err(crate::error::Error::Config)
    }

    fn check(&self) -> Result<(), String> {
        outbox::Tables::new(&self.schema, &self.table).map_err(|e| e.to_string())?;
        if let Some(id) = &self.relay_id {
            if id.trim().is_empty() || id.len() > 200 || id.chars().any(char::is_control) {
                return Err("relay_id: must be 1-200 printable characters".into());
            }
        }
        if self.min_batch_size < 1 {
            return Err("min_batch_size: must be 1 or more".into());
        }
        if self.max_batch_size < self.min_batch_size || self.max_batch_size > MAX_BATCH_SIZE {
            return Err(format!(
                "max_batch_size: must be between min_batch_size and {MAX_BATCH_SIZE}"
            ));
        }
        if self.max_inflight_batches == 0 {
            return Err("max_inflight_batches: must be 1 or more".into());
        }
        if self.lane_concurrency == 0 {
            return Err("lane_concurrency: must be 1 or more".into());
        }
        // Every duration is capped (the relay's arithmetic must not overflow); the intervals
        // must also be more than zero (the retry policy checks its own).
        for (name, value, positive) in [
            ("poll_interval", self.poll_interval, true),
            ("claim_linger", self.claim_linger, false),
            ("publish_timeout", self.publish_timeout, true),
            ("rescan_interval", self.rescan_interval, true),
            ("lease_ttl", self.lease_ttl, true),
            ("heartbeat_interval", self.heartbeat_interval, true),
            ("stats_interval", self.stats_interval, true),
            ("stall_timeout", self.stall_timeout, true),
            ("purge_interval", self.purge_interval, true),
            ("statement_timeout", self.statement_timeout, true),
            ("lock_timeout", self.lock_timeout, true),
            ("cdc.heartbeat_interval", self.cdc.heartbeat_interval, true),
            ("cdc.batch_linger", self.cdc.batch_linger, false),
            (
                "purge_retention",
                self.purge_retention.unwrap_or_default(),
                false,
            ),
            ("retry.initial_backoff", self.retry.initial_backoff, false),
            ("retry.max_backoff", self.retry.max_backoff, false),
            (
                "retry.max_transient_backoff",
                self.retry.max_transient_backoff,
                false,
            ),
        ] {
            if positive && value.is_zero() {
                return Err(format!("{name}: must be more than 0"));
            }
            if value > MAX_DURATION {
                return Err(format!("{name}: must be at most 100 years"));
            }
        }
        if self.claim_linger > self.poll_interval {
            return Err("claim_linger: must be at most poll_interval".into());
        }
        if self.heartbeat_interval * 3 > self.lease_ttl {
            return Err("heartbeat_interval: must be at most a third of lease_ttl".into());
        }
        if self.purge_retention.is_some_and(|r| r.is_zero()) {
            return Err(
                "purge_retention: must be more than 0 (published rows are kept for it)".into(),
            );
        }
        if self.max_inflight_bytes == 0 {
            return Err("max_inflight_bytes: must be more than 0".into());
        }
        if self.max_payload_bytes == Some(0) {
            return Err("max_payload_bytes: must be more than 0".into());
        }
        if self.cdc.max_retained_wal_bytes == 0 {
            return Err("cdc.max_retained_wal_bytes: must be more than 0".into());
        }
        if self.cdc.max_transaction_events == 0 {
            return Err("cdc.max_transaction_events: must be 1 or more".into());
        }
        #[cfg(feature = "postgres")]
        self.cdc_names()?;
        #[cfg(not(feature = "postgres"))]
        if self.mode == Mode::Cdc {
            return Err(
                "mode = \"cdc\": change data capture needs PostgreSQL (the `postgres` \
                        feature of outbox-relayer)"
                    .into(),
            );
        }
        self.retry.validate()?;
        self.routing.validate()?;
        crate::wire::routing::check_template("cloudevents_source", &self.cloudevents_source)?;
        if self.cloudevents_source.chars().any(char::is_whitespace) {
            return Err("cloudevents_source: a URI reference has no spaces".into());
        }
        Ok(())
    }

    /// The CDC slot and publication these settings name (or their defaults).
    #[cfg(feature = "postgres")]
    pub fn cdc_names(&self) -> Result<outbox::postgres::cdc::CdcNames, String> {
        let tables = outbox::Tables::new(&self.schema, &self.table).map_err(|e| e.to_string())?;
        let defaults = outbox::postgres::cdc::CdcNames::for_tables(&tables);
        outbox::postgres::cdc::CdcNames::new(
            self.cdc.slot.as_deref().unwrap_or(defaults.slot.as_str()),
            self.cdc
                .publication
                .as_deref()
                .unwrap_or(defaults.publication.as_str()),
        )
        .map_err(|e| e.to_string())
    }

    /// The outbox tables these settings point at.
    pub fn tables(&self) -> outbox::Tables {
        outbox::Tables::new(&self.schema, &self.table).expect("validated")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        RelayConfig::default().validate().unwrap();
    }

    #[test]
    fn errors_name_the_field() {
        let cases: Vec<(RelayConfig, &str)> = vec![
            (
                RelayConfig {
                    schema: "Bad-Name".into(),
                    ..Default::default()
                },
                "schema",
            ),
            (
                RelayConfig {
                    max_batch_size: 10,
                    ..Default::default()
                },
                "max_batch_size",
            ),
            (
                RelayConfig {
                    // One over: MySQL could not bind the batch's ids.
                    max_batch_size: MAX_BATCH_SIZE + 1,
                    ..Default::default()
                },
                "max_batch_size",
            ),
            (
                RelayConfig {
                    heartbeat_interval: Duration::from_secs(5),
                    ..Default::default()
                },
                "heartbeat_interval",
            ),
            (
                RelayConfig {
                    poll_interval: Duration::ZERO,
                    ..Default::default()
                },
                "poll_interval",
            ),
            (
                RelayConfig {
                    cloudevents_source: "/orders/{aggregate_id}".into(),
                    ..Default::default()
                },
                "cloudevents_source: unknown placeholder {aggregate_id}",
            ),
        ];
        for (config, field) in cases {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{err} should name {field}");
        }
    }
}
