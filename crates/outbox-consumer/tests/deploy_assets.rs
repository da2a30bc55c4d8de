//! The consumer alert rules in `deploy/` only use metrics a consumer exports.

use std::collections::BTreeSet;

use outbox_consumer::ConsumerMetrics;
use prometheus_client::registry::Registry;

/// The series names a consumer exports, from its `# TYPE` lines.
fn exported() -> BTreeSet<String> {
    let mut registry = Registry::default();
    ConsumerMetrics::new().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        if let (Some("#"), Some("TYPE"), Some(name), Some(kind)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        {
            match kind {
                "counter" => {
                    out.insert(format!("{name}_total"));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        out.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {
                    out.insert(name.to_owned());
                }
            }
        }
    }
    out
}

#[test]
fn consumer_alert_rules_use_exported_metrics() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/prometheus/outbox-consumer-alerts.yml"
    ))
    .unwrap();
    let used: BTreeSet<String> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("outbox_consumer_"))
        .map(str::to_owned)
        .collect();
    assert!(used.len() >= 4, "{used:?}");
    let exported = exported();
    let unknown: Vec<_> = used.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "unknown metrics {unknown:?}; exported {exported:?}"
    );
}
