//! The relay's TOML configuration (`[relay]` of the config file, read the way `outbox relay`
//! reads it: defaults, then the file, through figment), then `validate`. Neither may panic;
//! a refusal from `validate` names the field.
#![no_main]

use figment::{
    providers::{Format, Serialized, Toml},
    Figment,
};
use libfuzzer_sys::fuzz_target;
use outbox_relayer::RelayConfig;

/// Fields `validate` names (schema and table errors say `… for schema: …`).
const FIELDS: &[&str] = &[
    "schema",
    "table",
    "relay_id",
    "min_batch_size",
    "max_batch_size",
    "max_inflight_batches",
    "lane_concurrency",
    "publish_timeout",
    "poll_interval",
    "rescan_interval",
    "lease_ttl",
    "heartbeat_interval",
    "stats_interval",
    "stall_timeout",
    "purge_retention",
    "purge_interval",
    "max_payload_bytes",
    "retry.",
    "routing.",
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let loaded = Figment::from(Serialized::defaults(RelayConfig::default()))
        .merge(Toml::string(text))
        .extract::<RelayConfig>();
    let config = match loaded {
        Ok(config) => config,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    if let Err(e) = config.validate() {
        let text = e.to_string();
        let detail = text.split_once(": ").map_or("", |(_, d)| d);
        assert!(
            FIELDS
                .iter()
                .any(|f| detail.starts_with(f) || detail.contains(&format!(" for {f}: "))),
            "{text:?} names no field"
        );
    } else {
        // What the relay derives from a valid configuration must not overflow.
        let _ = config.lease_ttl * 3 / 4;
        let _ = config.tables();
        let _ = config.routing.route(None, "order", "Placed", 1);
    }
});
