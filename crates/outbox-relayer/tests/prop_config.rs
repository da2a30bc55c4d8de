//! Properties of `RelayConfig::validate` (configuration input): whatever the values, it never
//! panics, and every refusal starts with the name of a field.

use std::time::Duration;

use outbox_relayer::{config::OnDead, retry::RetryPolicy, routing::RoutingConfig, RelayConfig};
use proptest::prelude::*;

/// Fields `validate` may name, as they appear in the config file.
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

/// Durations as a config file can spell them: zero, sensible, or as large as humantime parses.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        1 => Just(Duration::ZERO),
        4 => (1u64..600_000).prop_map(Duration::from_millis),
        2 => (0u64..=u64::MAX, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        1 => (u64::MAX / 4..=u64::MAX).prop_map(Duration::from_secs),
    ]
}

fn count() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 0usize..2000, 1 => any::<usize>()]
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![4 => "[a-z_][a-z0-9_]{0,10}", 1 => any::<String>()]
}

prop_compose! {
    fn retry()(
        initial_backoff in duration(),
        max_backoff in duration(),
        max_transient_backoff in duration(),
        max_attempts in prop_oneof![3 => 0..10i32, 1 => any::<i32>()],
    ) -> RetryPolicy {
        RetryPolicy { initial_backoff, max_backoff, max_transient_backoff, max_attempts }
    }
}

prop_compose! {
    fn config()(
        (relay_id, schema, table) in (prop::option::of(any::<String>()), name(), name()),
        (min_batch_size, max_batch_size) in (
            prop_oneof![3 => -2..200i64, 1 => any::<i64>()],
            prop_oneof![3 => -2..200_000i64, 1 => any::<i64>()],
        ),
        (max_inflight_batches, lane_concurrency) in (count(), count()),
        durations in prop::collection::vec(duration(), 8),
        purge_retention in prop::option::of(duration()),
        max_payload_bytes in prop::option::of(count()),
        skip in any::<bool>(),
        retry in retry(),
        default in prop_oneof!["\\PC{0,12}", Just("{aggregate_type}.{event_type}".to_owned())],
    ) -> RelayConfig {
        RelayConfig {
            relay_id,
            schema,
            table,
            min_batch_size,
            max_batch_size,
            max_inflight_batches,
            lane_concurrency,
            publish_timeout: durations[0],
            poll_interval: durations[1],
            rescan_interval: durations[2],
            lease_ttl: durations[3],
            heartbeat_interval: durations[4],
            stats_interval: durations[5],
            stall_timeout: durations[6],
            purge_retention,
            purge_interval: durations[7],
            max_payload_bytes,
            on_dead: if skip { OnDead::Skip } else { OnDead::Park },
            retry,
            routing: RoutingConfig { default, rules: vec![] },
            ..RelayConfig::default()
        }
    }
}

/// Durations from 1 ms to the largest a file can spell, one in five over 100 years.
fn long_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        4 => (1u64..1_000_000_000_000).prop_map(Duration::from_millis),
        1 => (3_200_000_000u64..=u64::MAX).prop_map(Duration::from_secs),
    ]
}

prop_compose! {
    /// Configurations that pass validation more often than not: only the long durations vary.
    fn mostly_valid_config()(
        heartbeat in long_duration(),
        extra in long_duration(),
        initial_backoff in (1u64..1000).prop_map(Duration::from_millis),
        backoffs in (long_duration(), long_duration()),
        purge_retention in prop::option::of(long_duration()),
    ) -> RelayConfig {
        RelayConfig {
            heartbeat_interval: heartbeat,
            lease_ttl: heartbeat.saturating_mul(3).saturating_add(extra),
            purge_retention,
            retry: RetryPolicy {
                initial_backoff,
                max_backoff: backoffs.0,
                max_transient_backoff: backoffs.1,
                max_attempts: 5,
            },
            ..Default::default()
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

    #[test]
    fn validate_never_panics_and_names_the_field(config in config()) {
        if let Err(e) = config.validate() {
            let text = e.to_string();
            let detail = text.split_once(": ").map_or("", |(_, d)| d);
            // Schema and table errors come from the identifier check: `… for schema: …`.
            prop_assert!(
                FIELDS.iter().any(|f| detail.starts_with(f) || detail.contains(&format!(" for {f}: "))),
                "{text:?} should name a field"
            );
        } else {
            // What the relay computes from a valid configuration must not overflow either.
            let _ = config.lease_ttl * 3 / 4;
            let _ = config.tables();
        }
    }
}

proptest! {
    // About one generated configuration in four is valid; the others are rejected.
    #![proptest_config(ProptestConfig {
        cases: 1000,
        max_global_rejects: 20_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn validated_durations_leave_room_for_the_relays_arithmetic(config in mostly_valid_config()) {
        prop_assume!(config.validate().is_ok());
        // The relay doubles backoffs up to their cap, multiplies the lease by 3 and adds
        // durations to the current instant; PostgreSQL stores them as intervals.
        for d in [
            config.lease_ttl,
            config.heartbeat_interval,
            config.retry.max_backoff,
            config.retry.max_transient_backoff,
            config.purge_retention.unwrap_or_default(),
        ] {
            prop_assert!(d.checked_mul(4).is_some());
            prop_assert!(std::time::Instant::now().checked_add(d * 4).is_some());
            prop_assert!(chrono::Duration::from_std(d * 4).is_ok());
        }
    }
}

/// What the property found: a huge heartbeat overflowed `3 × heartbeat_interval` inside
/// `validate` (a panic instead of an error), and a huge lease overflowed the relay's
/// `lease_ttl × 3 / 4`.
#[test]
fn huge_durations_are_refused_with_the_field_named() {
    let huge = Duration::from_secs(u64::MAX / 2);
    let cases: Vec<(RelayConfig, &str)> = vec![
        (
            RelayConfig {
                heartbeat_interval: huge,
                ..Default::default()
            },
            "heartbeat_interval",
        ),
        (
            RelayConfig {
                lease_ttl: huge,
                ..Default::default()
            },
            "lease_ttl",
        ),
        (
            RelayConfig {
                retry: RetryPolicy {
                    max_backoff: huge,
                    ..Default::default()
                },
                ..Default::default()
            },
            "retry.max_backoff",
        ),
        (
            RelayConfig {
                purge_retention: Some(huge),
                ..Default::default()
            },
            "purge_retention",
        ),
    ];
    for (config, field) in cases {
        let err = config.validate().unwrap_err().to_string();
        assert!(
            err.contains(&format!("{field}: ")),
            "{err} should name {field}"
        );
    }
}
