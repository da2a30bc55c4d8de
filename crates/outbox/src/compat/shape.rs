//! The shape of a payload, read from a JSON Schema (a subset) or inferred from an example.

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
    fn parse(name: &str) -> Option<Self> {
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
    /// Inferred from an example: a missing type or item shape says nothing (a `null`, an empty
    /// array), where in a schema it allows anything.
    pub inferred: bool,
}

/// Keywords read by [`Shape::from_schema`].
const READ: &[&str] = &[
    "type",
    "properties",
    "required",
    "items",
    "enum",
    "additionalProperties",
];

/// JSON Schema keywords outside the supported subset: a document using them is a schema (and
/// refused as one), never an example payload whose comparison would pass breaking changes.
const UNSUPPORTED: &[&str] = &[
    "$ref",
    "$defs",
    "definitions",
    "$anchor",
    "$dynamicRef",
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
    "unevaluatedProperties",
    "unevaluatedItems",
    "prefixItems",
    "contains",
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
];

/// Keywords that only annotate (ignored without changing the meaning).
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "format",
];

impl Shape {
    /// Whether `document` reads as a JSON Schema rather than an example payload: it declares
    /// `$schema`, or it is an object of schema keywords with a valid `type`.
    pub(super) fn looks_like_schema(document: &Value) -> bool {
        let Some(object) = document.as_object() else {
            return false;
        };
        if object.contains_key("$schema") {
            return true;
        }
        let valid_type = match object.get("type") {
            Some(Value::String(t)) => Kind::parse(t).is_some(),
            Some(Value::Array(ts)) => {
                !ts.is_empty()
                    && ts
                        .iter()
                        .all(|t| t.as_str().and_then(Kind::parse).is_some())
            }
            _ => false,
        };
        let keyword = |k: &String| {
            READ.contains(&k.as_str())
                || ANNOTATIONS.contains(&k.as_str())
                || UNSUPPORTED.contains(&k.as_str())
        };
        // `$`-keywords of JSON Schema do not name payload fields.
        let dollar = ["$ref", "$defs", "$id", "$anchor", "$dynamicRef"];
        object.keys().any(|k| dollar.contains(&k.as_str()))
            || (valid_type && object.keys().all(keyword))
    }

    /// Reads a schema of the supported subset; anything else is bad input naming its path.
    pub(super) fn from_schema(schema: &Value, path: &str) -> Result<Self, BadInput> {
        let bad = |message: String| BadInput(format!("{path}: {message}"));
        let object = match schema {
            Value::Bool(true) => return Ok(Self::any()),
            Value::Object(object) => object,
            other => return Err(bad(format!("a schema must be an object, found {other}"))),
        };
        if let Some(keyword) = object
            .keys()
            .find(|k| !READ.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()))
        {
            return Err(bad(format!(
                "keyword {keyword:?} is not supported (supported: {})",
                READ.join(", ")
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

    fn any() -> Self {
        Self {
            additional: true,
            ..Self::default()
        }
    }
}
