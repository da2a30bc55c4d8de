//! The consumer alert rules and the consumer Grafana dashboard in `deploy/` only use metrics a
//! consumer exports.

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

/// Every metric-like word starting `outbox_` in `text` (a relay metric in a consumer asset is
/// as wrong as a misspelt one).
fn used(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("outbox_"))
        .map(str::to_owned)
        .collect()
}

/// The names in `used` that no consumer exports.
fn unknown(used: &BTreeSet<String>) -> Vec<String> {
    used.difference(&exported()).cloned().collect()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn consumer_alert_rules_use_exported_metrics() {
    let used = used(&read("deploy/prometheus/outbox-consumer-alerts.yml"));
    assert!(used.len() >= 4, "{used:?}");
    let unknown = unknown(&used);
    assert!(
        unknown.is_empty(),
        "unknown metrics {unknown:?}; exported {:?}",
        exported()
    );
}

#[test]
fn consumer_dashboard_uses_exported_metrics_in_every_query() {
    let text = read("deploy/grafana/outbox-consumer-dashboard.json");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    // Every query of the dashboard: each panel's targets and each template variable's.
    let mut queries = Vec::new();
    let panels = doc["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8, "{} panels", panels.len());
    let mut ids = BTreeSet::new();
    for panel in panels {
        assert!(ids.insert(panel["id"].as_i64().expect("an id")), "{panel}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "a panel without a query: {panel}");
        for target in targets {
            queries.push(target["expr"].as_str().expect("an expr").to_owned());
        }
    }
    for variable in doc["templating"]["list"].as_array().expect("templating") {
        if let Some(definition) = variable["definition"].as_str() {
            queries.push(definition.to_owned());
        }
    }
    for query in &queries {
        let names = used(query);
        assert!(!names.is_empty(), "a query on no consumer metric: {query}");
        let unknown = unknown(&names);
        assert!(
            unknown.is_empty(),
            "{query} uses unknown metrics {unknown:?}"
        );
    }
    // And nowhere else in the file (descriptions, legends) a name that is not exported.
    let unknown = unknown(&used(&text));
    assert!(unknown.is_empty(), "the dashboard names {unknown:?}");
    // Each of the held, dead-letter, apply, latency, redelivery and database-error families
    // the dashboard is for has a query.
    let all: BTreeSet<String> = queries.iter().flat_map(|q| used(q)).collect();
    for family in [
        "outbox_consumer_held_oldest_seconds",
        "outbox_consumer_held",
        "outbox_consumer_dead_lettered_total",
        "outbox_consumer_held_dead",
        "outbox_consumer_handled_total",
        "outbox_consumer_handler_seconds_bucket",
        "outbox_consumer_duplicates_total",
        "outbox_consumer_infrastructure_failures_total",
    ] {
        assert!(all.contains(family), "no panel queries {family}");
    }
}

#[test]
fn the_checker_catches_a_misspelt_or_foreign_metric() {
    let names = used(
        "sum(rate(outbox_consumer_handled_total[1m])) / max(outbox_consumer_held_age) \
         + max(outbox_pending_events)",
    );
    assert_eq!(
        unknown(&names),
        vec![
            "outbox_consumer_held_age".to_owned(),
            "outbox_pending_events".to_owned()
        ]
    );
}
