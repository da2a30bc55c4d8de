//! Properties of config loading (files are input from outside): `load` never panics, a file
//! with one wrong value or unknown key is refused with that key named, and whatever loads can
//! be validated without panicking, broker URLs included.

use proptest::prelude::*;

use super::{load, tests::write, FileConfig};

/// Keys of the file, with a valid TOML value each: (section, key, value).
const KEYS: &[(&str, &str, &str)] = &[
    ("", "database_url", "\"postgres://localhost/db\""),
    ("", "broker_url", "\"nats://localhost:4222\""),
    ("", "listen", "\"127.0.0.1:9999\""),
    ("", "log_format", "\"json\""),
    ("", "admin_token", "\"t0ken\""),
    ("", "read_token", "\"r3ad\""),
    ("", "metrics_listen", "\"127.0.0.1:9998\""),
    ("", "allowed_hosts", "[\"relay.internal\"]"),
    ("relay", "relay_id", "\"relay-1\""),
    ("relay", "schema", "\"outbox\""),
    ("relay", "max_batch_size", "500"),
    ("relay", "max_inflight_batches", "2"),
    ("relay", "poll_interval", "\"250ms\""),
    ("relay", "lease_ttl", "\"10s\""),
    ("relay", "heartbeat_interval", "\"2s\""),
    ("relay", "purge_retention", "\"7days\""),
    ("relay", "max_payload_bytes", "100000"),
    ("relay", "on_dead", "\"skip\""),
    ("relay", "envelope", "\"cloudevents-binary\""),
    ("relay", "cloudevents_source", "\"/orders\""),
    ("relay.retry", "max_attempts", "3"),
    ("relay.retry", "max_backoff", "\"1m\""),
    (
        "relay.routing",
        "default",
        "\"{aggregate_type}.{event_type}\"",
    ),
    ("nats", "stream", "\"EVENTS\""),
    ("nats", "ack_timeout", "\"2s\""),
    ("rabbitmq", "exchange", "\"events\""),
    ("rabbitmq", "channels", "8"),
    ("webhook", "timeout", "\"1s\""),
    ("redis", "maxlen", "1000"),
    ("mqtt", "client_id", "\"relay\""),
    ("mqtt", "keep_alive", "\"30s\""),
    ("sqs", "region", "\"eu-west-1\""),
    ("sqs", "batch_linger", "\"2ms\""),
    ("servicebus", "ack_timeout", "\"3s\""),
    ("kafka", "client_id", "\"relay\""),
    ("kafka", "compression", "\"lz4\""),
    ("kafka", "message_timeout", "\"5s\""),
];

/// Keys whose value is a duration.
const DURATIONS: &[&str] = &[
    "poll_interval",
    "lease_ttl",
    "heartbeat_interval",
    "purge_retention",
    "max_backoff",
    "ack_timeout",
    "timeout",
    "keep_alive",
    "batch_linger",
    "message_timeout",
];

/// Values of any TOML type, including durations and numbers at the edges.
fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        any::<bool>().prop_map(|v| v.to_string()),
        Just("1.5".to_owned()),
        Just("[1, \"a\"]".to_owned()),
        Just("{ a = 1 }".to_owned()),
        prop::sample::select(vec![
            "\"\"",
            "\"0s\"",
            "\"-1s\"",
            "\"5 parsecs\"",
            "\"18446744073709551615s\"",
            "\"584942417355years\"",
            "\"999999999999999999999\"",
            "\"nats://\"",
            "\"{aggregate_id}\"",
        ])
        .prop_map(str::to_owned),
        "[^\"\\\\\\p{C}]{0,12}".prop_map(|s| format!("\"{s}\"")),
    ]
}

/// One change to a valid file: a key's value replaced, or an unknown key added.
#[derive(Clone, Debug)]
enum Change {
    Value(usize, String),
    Unknown(usize, String),
}

/// Durations as humantime spells them, half of them near 2^64 seconds.
fn duration_text() -> impl Strategy<Value = String> {
    let number = prop_oneof![
        0..1000u128,
        (u64::MAX / 4..=u64::MAX).prop_map(u128::from),
        any::<u128>(),
    ];
    let unit = prop_oneof![
        2 => Just("s"),
        1 => prop::sample::select(vec!["ns", "ms", "m", "h", "d", "y"]),
    ];
    (number, unit).prop_map(|(n, unit)| format!("\"{n}{unit}\""))
}

fn change() -> impl Strategy<Value = Change> {
    let durations: Vec<usize> = (0..KEYS.len())
        .filter(|&i| DURATIONS.contains(&KEYS[i].1))
        .collect();
    prop_oneof![
        1 => (0..KEYS.len(), toml_value()).prop_map(|(i, v)| Change::Value(i, v)),
        2 => (prop::sample::select(durations), duration_text())
            .prop_map(|(i, v)| Change::Value(i, v)),
        1 => (0..KEYS.len(), "zz_[a-z_]{1,10}").prop_map(|(i, k)| Change::Unknown(i, k)),
    ]
}

/// Renders the chosen keys as a TOML file, applying `change`; returns the text and the key
/// the change touched.
fn render(chosen: &[bool], change: Option<&Change>) -> (String, Option<String>) {
    let mut sections: Vec<(&str, Vec<String>)> = Vec::new();
    let mut touched = None;
    for (i, (section, key, value)) in KEYS.iter().enumerate() {
        let mut lines = Vec::new();
        match change {
            Some(Change::Value(j, v)) if *j == i => {
                lines.push(format!("{key} = {v}"));
                touched = Some((*key).to_owned());
            }
            _ if chosen[i] => lines.push(format!("{key} = {value}")),
            _ => {}
        }
        if let Some(Change::Unknown(j, k)) = change {
            if *j == i {
                lines.push(format!("{k} = 1"));
                touched = Some(k.clone());
            }
        }
        match sections.iter_mut().find(|(s, _)| s == section) {
            Some((_, existing)) => existing.extend(lines),
            None => sections.push((section, lines)),
        }
    }
    let mut text = String::new();
    for (section, lines) in sections {
        if !section.is_empty() {
            text.push_str(&format!("[{section}]\n"));
        }
        for line in lines {
            text.push_str(&line);
            text.push('\n');
        }
    }
    (text, touched)
}

/// Everything `outbox relay` checks after loading, broker URL included; must not panic.
fn validate_everything(mut config: FileConfig, broker_url: &str) {
    let _ = config.relay.validate();
    let _ = config.nats.validate();
    let _ = config.rabbitmq.validate();
    let _ = config.webhook.validate();
    let _ = config.redis.validate();
    let _ = config.mqtt.validate();
    let _ = config.sqs.validate();
    let _ = config.servicebus.validate();
    let _ = config.kafka.validate();
    let _ = config.sqs.clone().apply_broker_url(broker_url);
    config.servicebus.set_broker_url(broker_url.to_owned());
    let _ = config.servicebus.validate();
    let _ = config.servicebus.redacted();
    config.mqtt.url = broker_url.to_owned();
    let _ = config.mqtt.validate();
    config.kafka.brokers = broker_url.to_owned();
    let _ = config.kafka.validate();
}

fn broker_url() -> impl Strategy<Value = String> {
    let scheme = prop::sample::select(vec![
        "sqs://",
        "sqs+http://",
        "sb://",
        "amqp1://",
        "amqps1://",
        "mqtt://",
        "mqtts://",
        "",
        "Endpoint=sb://",
    ]);
    (scheme, "[\\PC]{0,24}").prop_map(|(s, rest)| format!("{s}{rest}"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn a_wrong_value_or_unknown_key_is_refused_naming_the_key(
        chosen in prop::collection::vec(any::<bool>(), KEYS.len()),
        change in prop::option::weighted(0.8, change()),
        url in broker_url(),
    ) {
        let (text, touched) = render(&chosen, change.as_ref());
        let file = write(&text);
        match (load(Some(&file.0)), touched) {
            (Ok(config), _) => validate_everything(config, &url),
            (Err(e), Some(key)) => prop_assert!(e.contains(&key), "{e:?} should name {key:?}"),
            (Err(e), None) => prop_assert!(false, "a valid file was refused: {e}\n{text}"),
        }
    }

    #[test]
    fn any_text_loads_or_is_refused_without_panicking(text in any::<String>()) {
        let file = write(&text);
        if let Ok(config) = load(Some(&file.0)) {
            validate_everything(config, "");
        }
    }
}
