//! The shape of a payload, read from a JSON Schema (a subset) or inferred from an example, and
//! the keywords of JSON Schema: judged, ignored or refused.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::{path_of_items, path_of_property, BadInput};

/// A JSON type, as JSON Schema names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Kind {
    Null,
    Boolean,
    Integer,
    Number,
    String,
    Array,
    Object,
}

impl Kind {
    pub(super) fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "null" => Self::Null,
            "boolean" => Self::Boolean,
            "integer" => Self::Integer,
            "number" => Self::Number,
            "string" => Self::String,
            "array" => Self::Array,
            "object" => Self::Object,
            _ => return None,
        })
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Boolean => "boolean",
            Self::Integer => "integer",
            Self::Number => "number",
            Self::String => "string",
            Self::Array => "array",
            Self::Object => "object",
        }
    }

    /// Whether a value of one of `kinds` can be `value` (a whole number is an `integer` as
    /// well as a `number`).
    pub(super) fn admits(kinds: &BTreeSet<Self>, value: &Value) -> bool {
        match value {
            Value::Number(n) => {
                let whole =
                    n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0);
                kinds.contains(&Self::Number) || (whole && kinds.contains(&Self::Integer))
            }
            other => kinds.contains(&Self::of(other).unwrap_or(Self::Null)),
        }
    }

    /// The kind of an example value; every number is `number` (an example cannot tell an
    /// integer field from a decimal one that happens to be whole), and `null` says nothing.
    fn of(value: &Value) -> Option<Self> {
        Some(match value {
            Value::Null => return None,
            Value::Bool(_) => Self::Boolean,
            Value::Number(_) => Self::Number,
            Value::String(_) => Self::String,
            Value::Array(_) => Self::Array,
            Value::Object(_) => Self::Object,
        })
    }
}

/// What the compatibility rules compare.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Shape {
    /// Allowed types; `None` when unconstrained.
    pub types: Option<BTreeSet<Kind>>,
    /// Known properties of an object.
    pub properties: BTreeMap<String, Shape>,
    /// Properties that must be present.
    pub required: BTreeSet<String>,
    /// Whether properties not listed are allowed (JSON Schema's default: yes).
    pub additional: bool,
    /// The shape of array items, when known.
    pub items: Option<Box<Shape>>,
    /// Allowed values, when listed.
    pub values: Option<Vec<Value>>,
    /// The `format` strings must have (`date-time`, `email`, …), when one is named.
    pub format: Option<String>,
    /// Inferred from an example: a missing type or item shape says nothing (a `null`, an empty
    /// array), where in a schema it allows anything.
    pub inferred: bool,
}

/// Keywords [`Shape::from_schema`] reads and the comparison judges.
const JUDGED: &[&str] = &[
    "type",
    "properties",
    "required",
    "items",
    "enum",
    "additionalProperties",
    "format",
    "nullable",
];

/// Keywords that only describe, ignored (as are `x-` extensions): they change nothing a
/// payload must be.
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "title",
    "description",
    "default",
    "examples",
    "example",
    "deprecated",
    "readOnly",
    "writeOnly",
    "externalDocs",
];

/// The other keywords of JSON Schema (draft 4 to 2020-12) and of OpenAPI's schema object:
/// they constrain payloads in ways the comparison does not judge, so a schema using them is
/// refused as bad input, never compared as if they were absent.
const REFUSED: &[&str] = &[
    "$ref",
    "$defs",
    "definitions",
    "$anchor",
    "$dynamicRef",
    "$dynamicAnchor",
    "$recursiveRef",
    "$recursiveAnchor",
    "$vocabulary",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "const",
    "patternProperties",
    "propertyNames",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "unevaluatedProperties",
    "unevaluatedItems",
    "prefixItems",
    "additionalItems",
    "contains",
    "minContains",
    "maxContains",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "contentEncoding",
    "contentMediaType",
    "contentSchema",
    "discriminator",
    "xml",
];

/// Whether `key` is a keyword of JSON Schema or of OpenAPI's schema object (judged, ignored
/// or refused), an `x-` extension included.
pub(super) fn is_keyword(key: &str) -> bool {
    key.starts_with("x-")
        || JUDGED.contains(&key)
        || ANNOTATIONS.contains(&key)
        || REFUSED.contains(&key)
}

impl Shape {
    /// Reads a schema of the supported subset; anything else is bad input naming its path.
    pub(super) fn from_schema(schema: &Value, path: &str) -> Result<Self, BadInput> {
        let bad = |message: String| BadInput(format!("{path}: {message}"));
        let object = match schema {
            Value::Bool(true) => return Ok(Self::any()),
            Value::Object(object) => object,
            other => return Err(bad(format!("a schema must be an object, found {other}"))),
        };
        if let Some(keyword) = object.keys().find(|k| {
            !JUDGED.contains(&k.as_str())
                && !ANNOTATIONS.contains(&k.as_str())
                && !k.starts_with("x-")
        }) {
            return Err(bad(format!(
                "keyword {keyword:?} is not supported (judged: {}; annotations and x- \
                 extensions are ignored)",
                JUDGED.join(", ")
            )));
        }
        let mut shape = Self::any();
        shape.types = match object.get("type") {
            None => None,
            Some(Value::String(t)) => Some(BTreeSet::from([
                Kind::parse(t).ok_or_else(|| bad(format!("unknown type {t:?}")))?
            ])),
            Some(Value::Array(ts)) => Some(
                ts.iter()
                    .map(|t| {
                        t.as_str()
                            .and_then(Kind::parse)
                            .ok_or_else(|| bad(format!("unknown type {t}")))
                    })
                    .collect::<Result<_, _>>()?,
            ),
            Some(other) => {
                return Err(bad(format!(
                    "type must be a string or a list, found {other}"
                )))
            }
        };
        // OpenAPI's `nullable: true` adds `null` to the types (`"type": "string", "nullable":
        // true` is `"type": ["string", "null"]`); without a `type`, any type is allowed already.
        match object.get("nullable") {
            None | Some(Value::Bool(false)) => {}
            Some(Value::Bool(true)) => {
                if let Some(types) = &mut shape.types {
                    types.insert(Kind::Null);
                }
            }
            Some(_) => return Err(bad("nullable must be true or false".into())),
        }
        if let Some(format) = object.get("format") {
            let format = format
                .as_str()
                .ok_or_else(|| bad(format!("format must be a string, found {format}")))?;
            shape.format = Some(format.to_owned());
        }
        if let Some(properties) = object.get("properties") {
            let properties = properties
                .as_object()
                .ok_or_else(|| bad("properties must be an object".into()))?;
            for (name, schema) in properties {
                let child = Self::from_schema(schema, &path_of_property(path, name))?;
                shape.properties.insert(name.clone(), child);
            }
        }
        if let Some(required) = object.get("required") {
            let list = required
                .as_array()
                .ok_or_else(|| bad("required must be a list of names".into()))?;
            for name in list {
                let name = name
                    .as_str()
                    .ok_or_else(|| bad(format!("required lists names, found {name}")))?;
                shape.required.insert(name.to_owned());
            }
        }
        match object.get("additionalProperties") {
            None | Some(Value::Bool(true)) => {}
            Some(Value::Bool(false)) => shape.additional = false,
            Some(_) => {
                return Err(bad(
                    "additionalProperties must be true or false (schemas are not supported)".into(),
                ))
            }
        }
        if let Some(items) = object.get("items") {
            shape.items = Some(Box::new(Self::from_schema(items, &path_of_items(path))?));
        }
        if let Some(values) = object.get("enum") {
            let values = values
                .as_array()
                .ok_or_else(|| bad("enum must be a list".into()))?;
            shape.values = Some(values.clone());
        }
        Ok(shape)
    }

    /// The shape an example payload shows: its types, its fields (none of them required: an
    /// example cannot tell), the items of its arrays' first element.
    pub(super) fn infer(example: &Value) -> Self {
        let mut shape = Self {
            types: Kind::of(example).map(|k| BTreeSet::from([k])),
            inferred: true,
            ..Self::any()
        };
        match example {
            Value::Object(object) => {
                for (name, value) in object {
                    shape.properties.insert(name.clone(), Self::infer(value));
                }
            }
            Value::Array(items) => shape.items = items.first().map(|v| Box::new(Self::infer(v))),
            _ => {}
        }
        shape
    }

    /// The shape of a schema that allows anything (`{}`, `true`).
    pub(super) fn any() -> Self {
        Self {
            additional: true,
            ..Self::default()
        }
    }
}
