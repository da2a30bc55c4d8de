//! How [`Format::Auto`](super::Format::Auto) tells a JSON Schema from an example payload: by
//! the keys at the root, refusing a document that could be either rather than guessing (a
//! schema read as an example passes breaking changes: `"number"` → `"string"` is one string
//! for another there).

use serde_json::Value;

use super::shape::{is_keyword, Kind};

/// How a document is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reading {
    Schema,
    Example,
}

impl Reading {
    /// `a JSON Schema`, `an example payload`.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Schema => "a JSON Schema",
            Self::Example => "an example payload",
        }
    }
}

/// Reads `document` as a schema when it declares `$schema`, or when every key at its root is a
/// JSON Schema keyword and one of them holds what only a schema holds there (see
/// [`shows_a_schema`]); as an example when no key at its root is a keyword, or when the
/// keyword-named keys are payload fields (`"type": "order"`, `"title": "Dune"`) beside
/// others. Anything else is refused with the reason: keywords only, none of them telling
/// (`{"type": "order"}`, `{}`); a telling keyword beside a key that is none; a bare boolean.
/// Roots that no schema can be (arrays, strings, numbers, `null`) are examples.
pub(super) fn reading(document: &Value) -> Result<Reading, String> {
    let object = match document {
        Value::Object(object) => object,
        Value::Bool(true) => {
            return Err("true allows anything as a schema and is a boolean as an example".into())
        }
        Value::Bool(false) => {
            return Err("false allows nothing as a schema and is a boolean as an example".into())
        }
        _ => return Ok(Reading::Example),
    };
    if object.is_empty() {
        return Err("{} allows anything as a schema and is an empty object as an example".into());
    }
    if object.contains_key("$schema") {
        return Ok(Reading::Schema);
    }
    let telling = object
        .iter()
        .find(|(key, value)| is_keyword(key) && shows_a_schema(key, value))
        .map(|(key, _)| key);
    let other = object.keys().find(|key| !is_keyword(key));
    match (telling, other) {
        (Some(_), None) => Ok(Reading::Schema),
        (None, Some(_)) => Ok(Reading::Example),
        (Some(telling), Some(other)) => Err(format!(
            "{telling:?} reads as a JSON Schema keyword but {other:?} is none"
        )),
        (None, None) => {
            let why = match object.get("type") {
                // Present but not telling: no JSON type.
                Some(kind) => format!("\"type\": {kind} is no JSON type"),
                None => {
                    let keys: Vec<String> = object.keys().map(|k| format!("{k:?}")).collect();
                    format!("as likely payload fields: {}", keys.join(", "))
                }
            };
            Err(format!(
                "every key is a JSON Schema keyword, but none shows it is a schema ({why})"
            ))
        }
    }
}

/// Whether `value` under the keyword `key` is what only a schema holds there: a JSON type or a
/// list of them under `type`, schemas under `properties` or `items`, a list of names under
/// `required`, a list under `enum`, a boolean under `nullable`, anything under a `$` keyword.
/// Annotations (`title`, …), `format`, `x-` extensions and keywords that take a plain value
/// (`minimum`, `pattern`, …) are as likely payload fields, and tell nothing.
fn shows_a_schema(key: &str, value: &Value) -> bool {
    let schemas = |value: &Value| value.as_array().is_some_and(|a| a.iter().all(is_schema));
    match key {
        _ if key.starts_with('$') => true,
        "type" => match value {
            Value::String(kind) => Kind::parse(kind).is_some(),
            Value::Array(kinds) => {
                !kinds.is_empty()
                    && kinds
                        .iter()
                        .all(|k| k.as_str().and_then(Kind::parse).is_some())
            }
            _ => false,
        },
        "properties" | "definitions" | "patternProperties" | "dependentSchemas" => value
            .as_object()
            .is_some_and(|schemas| schemas.values().all(is_schema)),
        "items"
        | "additionalProperties"
        | "additionalItems"
        | "not"
        | "if"
        | "then"
        | "else"
        | "contains"
        | "propertyNames"
        | "unevaluatedItems"
        | "unevaluatedProperties"
        | "contentSchema" => is_schema(value),
        "allOf" | "anyOf" | "oneOf" | "prefixItems" => schemas(value),
        "required" => value
            .as_array()
            .is_some_and(|names| names.iter().all(Value::is_string)),
        "enum" => value.is_array(),
        "nullable" => value.is_boolean(),
        _ => false,
    }
}

/// A boolean, or an object whose keys are all keywords (`{}` included): what a subschema is.
fn is_schema(value: &Value) -> bool {
    match value {
        Value::Bool(_) => true,
        Value::Object(object) => object.keys().all(|key| is_keyword(key)),
        _ => false,
    }
}
