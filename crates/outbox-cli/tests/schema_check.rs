//! `outbox schema check` for CI, and the versioning keys of the relay's config file.

mod support;

use std::path::PathBuf;

use outbox_testkit::{database_url, unique};
use serde_json::json;
use support::run;

/// A JSON file in the temp directory, removed on drop.
struct File(PathBuf);

impl File {
    fn json(value: serde_json::Value) -> Self {
        Self::text(&value.to_string())
    }

    fn text(text: &str) -> Self {
        let path = std::env::temp_dir().join(format!("{}.json", unique("schema")));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn check(previous: &File, next: &File, extra: &[&str]) -> (Option<i32>, String, String) {
    let mut args = vec![
        "schema",
        "check",
        "--previous",
        previous.arg(),
        "--next",
        next.arg(),
    ];
    args.extend_from_slice(extra);
    let out = run(&args);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn order_schema(total_type: &str, extra: Option<(&str, &str)>) -> serde_json::Value {
    let mut schema = json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {
            "order_id": { "type": "string" },
            "total": { "type": total_type }
        },
        "required": ["order_id", "total"]
    });
    if let Some((name, kind)) = extra {
        schema["properties"][name] = json!({ "type": kind });
    }
    schema
}

#[test]
fn an_added_optional_field_passes_with_exit_code_0() {
    let v1 = File::json(order_schema("number", None));
    let v2 = File::json(order_schema("number", Some(("region", "string"))));
    let (code, stdout, stderr) = check(&v1, &v2, &[]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.starts_with("compatible: "), "{stdout}");
}

#[test]
fn the_decimal_to_string_change_fails_with_exit_code_1_naming_the_path() {
    let v1 = File::json(order_schema("number", None));
    let v2 = File::json(order_schema("string", None));
    let (code, stdout, _) = check(&v1, &v2, &[]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.starts_with("incompatible: "), "{stdout}");
    assert!(
        stdout.contains("(1 problem):\n$.total: type changed from number to string\n"),
        "{stdout}"
    );
}

#[test]
fn every_problem_of_example_payloads_is_listed() {
    let v1 = File::json(json!({"order_id": "o-1", "total": 19.9, "lines": [{"sku": "a"}]}));
    let v2 = File::json(json!({"order_id": 7, "lines": [{"sku": "a", "qty": 1}]}));
    let (code, stdout, _) = check(&v1, &v2, &["--format", "example"]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("(2 problems)"), "{stdout}");
    assert!(stdout.contains("$.order_id: type changed from string to number\n"));
    assert!(stdout.contains("$.total: removed\n"));
}

#[test]
fn breaking_changes_in_a_schema_known_by_its_keywords_fail_with_exit_code_1() {
    // No `$schema`, no root `type`, an extension keyword: a schema all the same.
    let schema = |total: &str, format: &str, required: serde_json::Value| {
        json!({
            "x-event-type": "OrderPlaced",
            "properties": {
                "placed_at": { "type": "string", "format": format },
                "total": { "type": total, "nullable": true }
            },
            "required": required
        })
    };
    let v1 = File::json(schema("number", "date-time", json!(["placed_at", "total"])));
    let v2 = File::json(schema("string", "email", json!(["placed_at"])));
    let (code, stdout, stderr) = check(&v1, &v2, &[]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stdout.contains(
            "(3 problems):\n\
             $.placed_at: format changed from \"date-time\" to \"email\"\n\
             $.total: required field made optional (consumers of the previous version expect it)\n\
             $.total: type changed from null or number to null or string\n"
        ),
        "{stdout}"
    );
}

#[test]
fn a_document_that_could_be_either_exits_2_naming_the_key() {
    let v1 = File::json(json!({"type": "order"}));
    let v2 = File::json(json!({"type": "order", "id": 1}));
    let (code, stdout, stderr) = check(&v1, &v2, &[]);
    assert_eq!(code, Some(2), "{stdout}{stderr}");
    assert!(
        stderr.contains(
            "previous: $: cannot tell a JSON Schema from an example payload: every key is a \
             JSON Schema keyword, but none shows it is a schema (\"type\": \"order\" is no \
             JSON type)"
        ),
        "{stderr}"
    );
    let (code, stdout, stderr) = check(&v1, &v2, &["--format", "example"]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
}

#[test]
fn unreadable_or_unsupported_input_exits_2_saying_why() {
    let good = File::json(order_schema("number", None));
    let broken = File::text("{ not json");
    let (code, _, stderr) = check(&good, &broken, &[]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("is not JSON"), "{stderr}");

    let with_ref = File::json(json!({"$schema": "x", "properties": {"a": {"$ref": "#/a"}}}));
    let (code, _, stderr) = check(&with_ref, &good, &[]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("previous: $.a: keyword \"$ref\" is not supported"),
        "{stderr}"
    );

    let missing = File(std::env::temp_dir().join(unique("missing")));
    let (code, _, stderr) = check(&good, &missing, &[]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("cannot read"), "{stderr}");
}

#[test]
fn bad_versioning_keys_in_the_config_name_the_key() {
    let path = std::env::temp_dir().join(format!("{}.toml", unique("versioning")));
    let rule =
        "[[relay.routing.rules]]\nevent_type = \"OrderPlaced\"\ndestination = \"orders.v2\"\n";
    for (text, expected) in [
        ("[relay]\nenvelope = \"cloudevents\"\n", "envelope"),
        (
            "[relay]\ncloudevents_source = \"/x/{tenant}\"\n",
            "cloudevents_source: unknown placeholder {tenant}",
        ),
        (
            &format!("{rule}fan_out = [{{ destination = \"orders.v1\", schema_version = 0 }}]\n"),
            "routing.rules[0].fan_out[0].schema_version: must be 1 or more",
        ),
        (
            &format!("{rule}fan_out = [{{ destination = \"orders.v1\", schema_version = 1, drop = [\"a\"] }}]\n"),
            "drop",
        ),
        (
            &format!(
                "{rule}fan_out = [{{ destination = \"o\", schema_version = 1, keep_fields = [\"a\"], drop_fields = [\"b\"] }}]\n"
            ),
            "routing.rules[0].fan_out[0]: set keep_fields or drop_fields, not both",
        ),
    ] {
        std::fs::write(&path, text).unwrap();
        let out = run(&[
            "relay",
            "--database-url",
            &database_url(),
            "--broker-url",
            "nats://127.0.0.1:4222",
            "--config",
            path.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {stderr}");
        assert!(stderr.contains(expected), "{text}: {stderr}");
    }
    let _ = std::fs::remove_file(path);
}
