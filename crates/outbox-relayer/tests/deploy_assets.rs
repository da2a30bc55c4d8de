//! The alert rules and the Grafana dashboard in `deploy/` only use metrics the relay exports.

use std::collections::BTreeSet;

use outbox_relayer::telemetry::Metrics;

/// Every `outbox_…` name in `text`.
fn names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(pos) = text[i..].find("outbox_") {
        let start = i + pos;
        let preceded =
            start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start;
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase()
                || bytes[end] == b'_'
                || bytes[end].is_ascii_digit())
        {
            end += 1;
        }
        if !preceded {
            out.insert(text[start..end].to_owned());
        }
        i = end;
    }
    out
}

/// The series names the registry exposes, from its `# TYPE` lines.
fn exported() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in Metrics::new().encode().lines() {
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

fn check(path: &str) {
    let text = std::fs::read_to_string(format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let used = names(&text);
    assert!(!used.is_empty(), "{path} uses no outbox metric");
    let exported = exported();
    let unknown: Vec<_> = used.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "{path} uses metrics the relay does not export: {unknown:?}"
    );
}

#[test]
fn alert_rules_use_exported_metrics() {
    check("deploy/prometheus/outbox-alerts.yml");
}

#[test]
fn grafana_dashboard_uses_exported_metrics_and_is_valid_json() {
    check("deploy/grafana/outbox-dashboard.json");
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/grafana/outbox-dashboard.json"
    ))
    .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(doc["panels"].as_array().unwrap().len() >= 8);
}

#[test]
fn the_checker_catches_a_misspelt_metric() {
    let used = names("max(outbox_pending_event) and rate(outbox_published_total[1m])");
    let unknown: Vec<_> = used.difference(&exported()).cloned().collect();
    assert_eq!(unknown, vec!["outbox_pending_event".to_owned()]);
}
