//! Is a new version of an event type backward compatible with the previous one? The
//! additive-only rule, for CI (`outbox schema check`).
//!
//! Consumers of version N keep reading events of version N+1, and consumers of N+1 keep
//! reading the N events already stored (through an upcaster), only when N+1 *adds* optional
//! fields and changes nothing else. Each of these is a problem, reported with its JSON path:
//!
//! * a field removed (`$.total: removed`);
//! * a type changed (`$.total: type changed from number to string`, the `decimal` → `string`
//!   change of the source documents), including a type dropped from or added to a union
//!   (OpenAPI's `nullable: true` adds `null`), a `type` or `items` removed (anything allowed
//!   now), and a `type` or `items` added where anything was allowed (a `type` only when it
//!   excludes a value the previous `enum` listed);
//! * an optional field made required, a new field added as required, or a required field
//!   made optional (consumers of N expect it), whether or not `properties` describes it;
//! * an `enum` narrowed (values removed), widened (consumers of N meet values they do not
//!   know), removed, or added where any value was allowed;
//! * a `format` changed, added (stored events need not match it) or removed (consumers of N
//!   expect it);
//! * `additionalProperties` turned to `false`, or a field added where it was `false`.
//!
//! Added optional fields (where other properties were allowed) and annotations (`title`,
//! `description`, `x-` extensions, …) are compatible. Every problem is reported, not only the
//! first.
//!
//! Either side is a JSON Schema (draft 4 to 2020-12 or OpenAPI's schema object, the subset
//! `type`, `properties`, `required`, `items`, `enum`, `additionalProperties` (true or false),
//! `format`, `nullable` plus annotations; every other keyword, such as `$ref`, `oneOf` or
//! `minimum`, is refused as bad input rather than ignored) or an example payload, whose shape
//! is inferred (every number is a `number`, `null` says nothing, no field is required, arrays
//! take their first element's shape). [`Format::Auto`] tells them apart by the keys at the
//! root and refuses a document that could be either, and a schema compared with an example.
//!
//! ```
//! use outbox::compat::check;
//! use serde_json::json;
//!
//! let v1 = json!({"order_id": "o-1", "total": 19.9});
//! let added = json!({"order_id": "o-1", "total": 19.9, "region": "eu"});
//! assert!(check(&v1, &added).unwrap().is_compatible());
//!
//! let decimal_to_string = json!({"order_id": "o-1", "total": "19.90"});
//! let report = check(&v1, &decimal_to_string).unwrap();
//! assert_eq!(report.to_string(), "$.total: type changed from number to string");
//! ```

mod detect;
mod shape;

use std::{collections::BTreeSet, fmt};

use serde_json::Value;

use detect::Reading;
use shape::{Kind, Shape};

/// One incompatibility, at a JSON path (`$.customer.email`, `$.lines[*].sku`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Where: `$` is the payload itself.
    pub path: String,
    /// What changed.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every incompatibility found; compatible when there is none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// In document order of the previous version, then new fields.
    pub problems: Vec<Problem>,
}

impl Report {
    /// Whether the next version is backward compatible.
    pub fn is_compatible(&self) -> bool {
        self.problems.is_empty()
    }
}

impl fmt::Display for Report {
    /// One problem a line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

/// A document that cannot be compared: the message names where and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

/// How to read a document.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// A JSON Schema when it declares `$schema`, or when every key at its root is a JSON
    /// Schema keyword (`x-` extensions included) and one of them holds what only a schema holds
    /// there (a JSON type under `type`, schemas under `properties` or `items`, names under
    /// `required`, …); an example payload when no key at its root is a keyword, or the
    /// keyword-named ones are payload fields (`"type": "order"`) beside others. Anything else
    /// is bad input saying why: `{}`, `{"type": "order"}`, `true`, a schema keyword beside a
    /// key that is none. Both documents must read the same way.
    #[default]
    Auto,
    /// A JSON Schema.
    Schema,
    /// An example payload.
    Example,
}

/// Compares two documents read with [`Format::Auto`].
pub fn check(previous: &Value, next: &Value) -> Result<Report, BadInput> {
    check_as(previous, next, Format::Auto)
}

/// Compares the `next` version of an event type with the `previous` one.
pub fn check_as(previous: &Value, next: &Value, format: Format) -> Result<Report, BadInput> {
    let read = |document: &Value, which: &str| {
        let reading = match format {
            Format::Auto => detect::reading(document).map_err(|reason| {
                BadInput(format!(
                    "{which}: $: cannot tell a JSON Schema from an example payload: {reason}; \
                     say which with --format schema or --format example"
                ))
            })?,
            Format::Schema => Reading::Schema,
            Format::Example => Reading::Example,
        };
        let shape = match reading {
            Reading::Schema => Shape::from_schema(document, "$")
                .map_err(|e| BadInput(format!("{which}: {}", e.0)))?,
            Reading::Example => Shape::infer(document),
        };
        Ok((reading, shape))
    };
    let (previous_reading, previous) = read(previous, "previous")?;
    let (next_reading, next) = read(next, "next")?;
    if previous_reading != next_reading {
        return Err(BadInput(format!(
            "previous reads as {} and next as {}: compare like with like, or say how to read \
             both with --format schema or --format example",
            previous_reading.name(),
            next_reading.name()
        )));
    }
    let mut report = Report::default();
    compare("$", &previous, &next, &mut report.problems);
    Ok(report)
}

fn compare(path: &str, previous: &Shape, next: &Shape, problems: &mut Vec<Problem>) {
    let names = |kinds: &BTreeSet<Kind>| {
        let names: Vec<_> = kinds.iter().map(|k| k.name()).collect();
        names.join(" or ")
    };
    match (&previous.types, &next.types) {
        (Some(old), Some(new)) if old != new => {
            let message = format!("type changed from {} to {}", names(old), names(new));
            push(problems, path, message);
        }
        // An example's `null` says nothing; a schema without `type` allows any, unless an
        // `enum` lists what it allows (the enum rules judge that).
        (Some(old), None) if !next.inferred && next.values.is_none() => {
            let message = format!("type removed: any type allowed now (was {})", names(old));
            push(problems, path, message);
        }
        // A type where any was allowed narrows what is accepted; where an `enum` said what
        // was allowed, only when it excludes one of the listed values.
        (None, Some(new)) if !previous.inferred => match &previous.values {
            None => {
                let message = format!("type added: only {} allowed now (any type was)", names(new));
                push(problems, path, message);
            }
            Some(values) => {
                if let Some(excluded) = values.iter().find(|v| !Kind::admits(new, v)) {
                    let message = format!(
                        "type added: only {} allowed now (the enum allowed {excluded})",
                        names(new)
                    );
                    push(problems, path, message);
                }
            }
        },
        _ => {}
    }
    // Any change of `format` breaks one side: values of the previous version need not match
    // an added or changed one, and its consumers rely on one removed.
    match (&previous.format, &next.format) {
        (Some(old), Some(new)) if old != new => {
            push(
                problems,
                path,
                format!("format changed from {old:?} to {new:?}"),
            );
        }
        (None, Some(new)) => {
            let message = format!(
                "format {new:?} added (stored events of the previous version need not match it)"
            );
            push(problems, path, message);
        }
        (Some(old), None) => {
            let message =
                format!("format {old:?} removed (consumers of the previous version expect it)");
            push(problems, path, message);
        }
        _ => {}
    }
    let list = |values: &[&Value]| {
        let texts: Vec<_> = values.iter().map(|v| v.to_string()).collect();
        texts.join(", ")
    };
    match (&previous.values, &next.values) {
        (Some(old), Some(new)) => {
            let removed: Vec<&Value> = old.iter().filter(|v| !new.contains(v)).collect();
            if !removed.is_empty() {
                let message = format!("enum narrowed: {} no longer allowed", list(&removed));
                push(problems, path, message);
            }
            let added: Vec<&Value> = new.iter().filter(|v| !old.contains(v)).collect();
            if !added.is_empty() {
                let message = format!(
                    "enum widened: {} now allowed (consumers of the previous version do not \
                     expect it)",
                    list(&added)
                );
                push(problems, path, message);
            }
        }
        (Some(_), None) => push(problems, path, "enum removed: any value allowed now".into()),
        (None, Some(new)) => {
            let message = format!(
                "enum added: only {} allowed now",
                list(&new.iter().collect::<Vec<_>>())
            );
            push(problems, path, message);
        }
        _ => {}
    }
    if previous.additional && !next.additional {
        push(
            problems,
            path,
            "additionalProperties changed to false".into(),
        );
    }
    for (name, old) in &previous.properties {
        let child = path_of_property(path, name);
        match next.properties.get(name) {
            None => push(problems, &child, "removed".into()),
            Some(new) => {
                if next.required.contains(name) && !previous.required.contains(name) {
                    push(problems, &child, "optional field made required".into());
                }
                if previous.required.contains(name) && !next.required.contains(name) {
                    let message = "required field made optional (consumers of the previous \
                                   version expect it)";
                    push(problems, &child, message.into());
                }
                compare(&child, old, new, problems);
            }
        }
    }
    // A name in `required` without a schema of its own is a field consumers rely on all the
    // same.
    for name in &previous.required {
        if !previous.properties.contains_key(name) && !next.required.contains(name) {
            let message = "required field made optional (consumers of the previous version \
                           expect it)";
            push(problems, &path_of_property(path, name), message.into());
        }
    }
    for (name, _) in next.properties.iter() {
        if !previous.additional && !previous.properties.contains_key(name) {
            let message = "added, but the previous version allowed no other properties (its \
                           consumers reject the event)";
            push(problems, &path_of_property(path, name), message.into());
        }
    }
    for name in &next.required {
        if !previous.properties.contains_key(name) && !previous.required.contains(name) {
            let message = "added as required (stored events of the previous version lack it)";
            push(problems, &path_of_property(path, name), message.into());
        }
    }
    match (&previous.items, &next.items) {
        (Some(old), Some(new)) => compare(&path_of_items(path), old, new, problems),
        (Some(_), None) if !next.inferred => {
            push(problems, path, "items removed: any item allowed now".into())
        }
        (None, Some(new)) if !previous.inferred && **new != Shape::any() => {
            let message = "items added (stored events of the previous version need not match it)";
            push(problems, path, message.into());
        }
        _ => {}
    }
}

fn push(problems: &mut Vec<Problem>, path: &str, message: String) {
    problems.push(Problem {
        path: path.to_owned(),
        message,
    });
}

/// `$.name`, or `$["odd name"]` when the name is not a plain identifier.
fn path_of_property(parent: &str, name: &str) -> String {
    let plain = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain {
        format!("{parent}.{name}")
    } else {
        format!("{parent}[{}]", Value::String(name.to_owned()))
    }
}

/// `$.lines[*]`: any item of the array.
fn path_of_items(parent: &str) -> String {
    format!("{parent}[*]")
}

#[cfg(test)]
mod tests;
