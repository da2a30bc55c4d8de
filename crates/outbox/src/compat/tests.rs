use serde_json::{json, Value};

use super::*;

fn problems(previous: Value, next: Value) -> Vec<String> {
    check(&previous, &next)
        .unwrap()
        .problems
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn order_v1() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "OrderCreated v1",
        "type": "object",
        "properties": {
            "order_id": { "type": "string", "format": "uuid" },
            "total": { "type": "number" },
            "status": { "enum": ["placed", "paid", "shipped"] },
            "lines": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": { "sku": { "type": "string" }, "qty": { "type": "integer" } },
                    "required": ["sku", "qty"]
                }
            }
        },
        "required": ["order_id", "total"]
    })
}

fn with(mut schema: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    schema.pointer_mut(parent).unwrap()[key] = value;
    schema
}

#[test]
fn the_sources_decimal_to_string_change_is_rejected() {
    let next = with(order_v1(), "/properties/total", json!({ "type": "string" }));
    assert_eq!(
        problems(order_v1(), next),
        ["$.total: type changed from number to string"]
    );
    // The same change seen in example payloads.
    assert_eq!(
        problems(
            json!({"order_id": "o-1", "total": 19.9}),
            json!({"order_id": "o-1", "total": "19.90"})
        ),
        ["$.total: type changed from number to string"]
    );
}

#[test]
fn an_added_optional_field_is_compatible() {
    let next = with(
        order_v1(),
        "/properties/region",
        json!({ "type": "string" }),
    );
    assert!(check(&order_v1(), &next).unwrap().is_compatible());
    let example = check(
        &json!({"order_id": "o-1", "total": 19.9}),
        &json!({"order_id": "o-1", "total": 19, "region": null, "currency": "EUR"}),
    )
    .unwrap();
    assert!(example.is_compatible(), "{example}");
}

// Consumers of the previous version read events of the next one: anything they may now meet
// that they could not before breaks them, as much as anything stored events lack.

#[test]
fn a_required_field_made_optional_is_a_problem() {
    let next = with(order_v1(), "/required", json!(["order_id"]));
    assert_eq!(
        problems(order_v1(), next),
        ["$.total: required field made optional (consumers of the previous version expect it)"]
    );
}

#[test]
fn a_widened_or_removed_enum_is_a_problem() {
    let widened = with(
        order_v1(),
        "/properties/status",
        json!({ "enum": ["placed", "paid", "shipped", "cancelled"] }),
    );
    assert_eq!(
        problems(order_v1(), widened),
        ["$.status: enum widened: \"cancelled\" now allowed (consumers of the previous version do not expect it)"]
    );
    let removed = with(
        order_v1(),
        "/properties/status",
        json!({ "type": "string" }),
    );
    assert_eq!(
        problems(order_v1(), removed),
        ["$.status: enum removed: any value allowed now"]
    );
}

#[test]
fn a_removed_type_or_items_is_a_problem() {
    let untyped = with(order_v1(), "/properties/total", json!({}));
    assert_eq!(
        problems(order_v1(), untyped),
        ["$.total: type removed: any type allowed now (was number)"]
    );
    let any_items = with(order_v1(), "/properties/lines", json!({ "type": "array" }));
    assert_eq!(
        problems(order_v1(), any_items),
        ["$.lines: items removed: any item allowed now"]
    );
}

#[test]
fn a_new_field_where_no_other_was_allowed_is_a_problem() {
    let closed = with(order_v1(), "/additionalProperties", json!(false));
    let next = with(
        closed.clone(),
        "/properties/region",
        json!({ "type": "string" }),
    );
    assert_eq!(
        problems(closed, next),
        ["$.region: added, but the previous version allowed no other properties (its consumers reject the event)"]
    );
}

#[test]
fn schemas_with_unsupported_keywords_are_not_read_as_examples() {
    // Without `$schema`, with a keyword outside the subset: before, both were read as example
    // payloads and a number -> string change inside `properties` passed.
    for keyword in ["$defs", "definitions", "allOf"] {
        let previous =
            json!({"type": "object", keyword: {}, "properties": {"total": {"type": "number"}}});
        let next =
            json!({"type": "object", keyword: {}, "properties": {"total": {"type": "string"}}});
        let err = check(&previous, &next).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "previous: $: keyword \"{keyword}\" is not supported"
            )),
            "{keyword}: {err}"
        );
    }
}

#[test]
fn examples_do_not_lose_types_to_nulls_or_empty_arrays() {
    let report = check(
        &json!({"total": 1, "lines": [{"sku": "a"}]}),
        &json!({"total": null, "lines": []}),
    )
    .unwrap();
    assert!(report.is_compatible(), "{report}");
}

#[test]
fn every_problem_is_reported_with_its_path() {
    let mut next = order_v1();
    next["properties"]
        .as_object_mut()
        .unwrap()
        .remove("order_id");
    let next = with(
        next,
        "/properties/status",
        json!({ "enum": ["placed", "paid"] }),
    );
    let next = with(
        next,
        "/properties/lines/items/properties/qty",
        json!({ "type": "number" }),
    );
    let next = with(next, "/properties/currency", json!({ "type": "string" }));
    let next = with(
        next,
        "/required",
        json!(["order_id", "total", "status", "currency"]),
    );
    let next = with(next, "/additionalProperties", json!(false));
    assert_eq!(
        problems(order_v1(), next),
        [
            "$: additionalProperties changed to false",
            "$.lines[*].qty: type changed from integer to number",
            "$.order_id: removed",
            "$.status: optional field made required",
            "$.status: enum narrowed: \"shipped\" no longer allowed",
            "$.currency: added as required (stored events of the previous version lack it)",
        ]
    );
}

#[test]
fn nested_objects_and_odd_names_get_readable_paths() {
    let previous = json!({"customer": {"address": {"zip code": "1000"}}});
    let next = json!({"customer": {"address": {"zip code": 1000}}});
    assert_eq!(
        problems(previous, next),
        ["$.customer.address[\"zip code\"]: type changed from string to number"]
    );
}

#[test]
fn adding_an_enum_or_changing_a_union_is_a_problem() {
    let previous = json!({"type": "object", "properties": {"a": {"type": ["string", "null"]}, "b": {"type": "string"}}});
    let next =
        json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"enum": ["x"]}}});
    assert_eq!(
        problems(previous, next),
        [
            "$.a: type changed from null or string to string",
            "$.b: enum added: only \"x\" allowed now"
        ]
    );
}

#[test]
fn unsupported_schemas_are_bad_input_naming_the_place() {
    let cases = [
        (
            json!({"$schema": "x", "properties": {"a": {"$ref": "#/defs/a"}}}),
            "previous: $.a: keyword \"$ref\" is not supported",
        ),
        (
            json!({"$schema": "x", "type": "decimal"}),
            "previous: $: unknown type \"decimal\"",
        ),
        (
            json!({"$schema": "x", "required": "a"}),
            "previous: $: required must be a list of names",
        ),
    ];
    for (schema, expected) in cases {
        let err = check(&schema, &json!({})).unwrap_err().to_string();
        assert!(err.starts_with(expected), "{err} vs {expected}");
    }
}

#[test]
fn documents_are_told_apart_and_the_format_can_be_forced() {
    // A payload with a field called `type` is an example, not a schema.
    let payload = json!({"type": "order", "total": 1});
    assert!(check(&payload, &json!({"type": "order", "id": 7}))
        .unwrap()
        .problems
        .iter()
        .any(|p| p.to_string() == "$.total: removed"));
    // So is one whose keyword-named fields hold what a payload holds.
    let book = json!({"title": "Dune", "format": "paperback", "pages": 412});
    let report = check(&book, &json!({"title": "Dune", "format": 1, "pages": 412})).unwrap();
    assert_eq!(
        report.to_string(),
        "$.format: type changed from string to number"
    );
    // The same text read as an example on purpose.
    let schema_like = json!({"type": "string"});
    let forced = check_as(&schema_like, &json!({"type": 3}), Format::Example).unwrap();
    assert_eq!(
        forced.to_string(),
        "$.type: type changed from string to number"
    );
    let as_schema = check_as(&schema_like, &json!({"type": "number"}), Format::Schema).unwrap();
    assert_eq!(
        as_schema.to_string(),
        "$: type changed from string to number"
    );
}

#[test]
fn a_schema_without_a_root_type_or_with_extension_keywords_is_judged_as_a_schema() {
    // None of these roots declares `$schema` or a `type`, or each adds an extension or
    // `nullable`: read as example payloads, `number` -> `string` would be one string for
    // another and a shorter `required` a shorter array, and both changes would pass.
    let roots = [
        json!({}),
        json!({"type": "object", "x-topic": "orders"}),
        json!({"type": "object", "nullable": false}),
        json!({"description": "an order", "additionalProperties": true}),
    ];
    for root in roots {
        let schema = |total: &str, required: Value| {
            let mut schema = root.clone();
            schema["properties"] = json!({"id": {"type": "string"}, "total": {"type": total}});
            schema["required"] = required;
            schema
        };
        assert_eq!(
            problems(
                schema("number", json!(["id", "total"])),
                schema("string", json!(["id"]))
            ),
            [
                "$.total: required field made optional (consumers of the previous version expect it)",
                "$.total: type changed from number to string",
            ],
            "{root}"
        );
    }
}

#[test]
fn a_type_added_where_any_was_allowed_is_a_problem() {
    let untyped = with(order_v1(), "/properties/total", json!({}));
    assert_eq!(
        problems(untyped, order_v1()),
        ["$.total: type added: only number allowed now (any type was)"]
    );
    // Where an enum already said what is allowed, a type that admits every value narrows
    // nothing; one that excludes a value does.
    let listed = with(
        order_v1(),
        "/properties/status",
        json!({"enum": ["placed", 1]}),
    );
    let typed = with(
        order_v1(),
        "/properties/status",
        json!({"type": ["string", "integer"], "enum": ["placed", 1]}),
    );
    assert!(check(&listed, &typed).unwrap().is_compatible());
    let narrowed = with(
        order_v1(),
        "/properties/status",
        json!({"type": "string", "enum": ["placed", 1]}),
    );
    assert_eq!(
        problems(listed, narrowed),
        ["$.status: type added: only string allowed now (the enum allowed 1)"]
    );
}

#[test]
fn items_added_where_any_item_was_allowed_are_a_problem() {
    let free = with(order_v1(), "/properties/lines", json!({"type": "array"}));
    assert_eq!(
        problems(free.clone(), order_v1()),
        ["$.lines: items added (stored events of the previous version need not match it)"]
    );
    let any = with(
        order_v1(),
        "/properties/lines",
        json!({"type": "array", "items": {"description": "anything"}}),
    );
    assert!(check(&free, &any).unwrap().is_compatible());
}

#[test]
fn a_required_name_without_a_property_made_optional_is_a_problem() {
    // `required` without a matching entry in `properties` still promises the field.
    let previous = json!({"$schema": "x", "type": "object", "required": ["total"]});
    let next = json!({"$schema": "x", "type": "object"});
    assert_eq!(
        problems(previous.clone(), next),
        ["$.total: required field made optional (consumers of the previous version expect it)"]
    );
    // Given a schema of its own, it stays required: nothing is lost.
    let typed = json!({"$schema": "x", "type": "object",
        "properties": {"total": {"type": "number"}}, "required": ["total"]});
    assert!(check(&previous, &typed).unwrap().is_compatible());
}

#[test]
fn a_changed_added_or_removed_format_is_a_problem() {
    let at = |format: Option<&str>| {
        let mut field = json!({"type": "string"});
        if let Some(format) = format {
            field["format"] = json!(format);
        }
        with(order_v1(), "/properties/order_id", field)
    };
    assert_eq!(
        problems(at(Some("date-time")), at(Some("email"))),
        ["$.order_id: format changed from \"date-time\" to \"email\""]
    );
    assert_eq!(
        problems(at(None), at(Some("email"))),
        ["$.order_id: format \"email\" added (stored events of the previous version need not match it)"]
    );
    assert_eq!(
        problems(at(Some("date-time")), at(None)),
        ["$.order_id: format \"date-time\" removed (consumers of the previous version expect it)"]
    );
    assert!(check(&at(Some("uuid")), &at(Some("uuid")))
        .unwrap()
        .is_compatible());
}

#[test]
fn nullable_is_judged_as_null_added_to_the_type() {
    let at = |field: Value| with(order_v1(), "/properties/order_id", field);
    let nullable = at(json!({"type": "string", "nullable": true}));
    let not_nullable = at(json!({"type": "string", "nullable": false}));
    assert_eq!(
        problems(nullable.clone(), not_nullable.clone()),
        ["$.order_id: type changed from null or string to string"]
    );
    // Consumers of the previous version never met a null there.
    assert_eq!(
        problems(not_nullable, nullable.clone()),
        ["$.order_id: type changed from string to null or string"]
    );
    let union = at(json!({"type": ["string", "null"]}));
    assert!(check(&nullable, &union).unwrap().is_compatible());
    let err = check(&at(json!({"type": "string", "nullable": "yes"})), &union)
        .unwrap_err()
        .to_string();
    assert_eq!(err, "previous: $.order_id: nullable must be true or false");
}

#[test]
fn documents_that_could_be_either_are_refused_naming_the_key() {
    let schema = json!({"type": "object", "properties": {"total": {"type": "number"}}});
    let cases = [
        (
            json!({"type": "order"}),
            "previous: $: cannot tell a JSON Schema from an example payload: every key is a JSON \
             Schema keyword, but none shows it is a schema (\"type\": \"order\" is no JSON \
             type); say which with --format schema or --format example",
        ),
        (
            json!({}),
            "previous: $: cannot tell a JSON Schema from an example payload: {} allows anything \
             as a schema and is an empty object as an example; say which with --format schema \
             or --format example",
        ),
        (
            json!({"type": "object", "properties": {"total": {"type": "number"}}, "total": 1}),
            "previous: $: cannot tell a JSON Schema from an example payload: \"properties\" \
             reads as a JSON Schema keyword but \"total\" is none; say which with --format \
             schema or --format example",
        ),
        (
            json!({"title": "Dune", "format": "paperback"}),
            "previous: $: cannot tell a JSON Schema from an example payload: every key is a JSON \
             Schema keyword, but none shows it is a schema (as likely payload fields: \"format\", \
             \"title\"); say which with --format schema or --format example",
        ),
        (
            json!(true),
            "previous: $: cannot tell a JSON Schema from an example payload: true allows \
             anything as a schema and is a boolean as an example; say which with --format \
             schema or --format example",
        ),
    ];
    for (previous, expected) in cases {
        let err = check(&previous, &schema).unwrap_err().to_string();
        assert_eq!(err, expected);
    }
    // Read as the user says, they are compared.
    assert!(check_as(
        &json!({"type": "order"}),
        &json!({"type": "order", "id": 1}),
        Format::Example
    )
    .unwrap()
    .is_compatible());
}

#[test]
fn a_schema_is_not_compared_with_an_example() {
    let schema = json!({"type": "object", "properties": {"total": {"type": "number"}}});
    let example = json!({"total": "19.90"});
    let err = check(&schema, &example).unwrap_err().to_string();
    assert_eq!(
        err,
        "previous reads as a JSON Schema and next as an example payload: compare like with \
         like, or say how to read both with --format schema or --format example"
    );
}
