//! Where each event goes: the row's own `destination`, else the first matching rule, else the
//! default template.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::publisher::PublishError;

/// Placeholders a destination template may use.
const PLACEHOLDERS: &[&str] = &["aggregate_type", "event_type", "schema_version"];

/// Routing configuration (`[routing]` in the config file).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingConfig {
    /// Template used when no rule matches. Default `{aggregate_type}.{event_type}`: a NATS
    /// subject, RabbitMQ routing key or topic name. Placeholders: `{aggregate_type}`,
    /// `{event_type}`, `{schema_version}`.
    pub default: String,
    /// Rules tried in order; the first whose filters all match wins.
    pub rules: Vec<RouteRule>,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            default: "{aggregate_type}.{event_type}".into(),
            rules: Vec::new(),
        }
    }
}

/// One routing rule (`[[routing.rules]]`). A rule with no filter matches everything.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteRule {
    /// Match this event type exactly.
    pub event_type: Option<String>,
    /// Match this aggregate type exactly.
    pub aggregate_type: Option<String>,
    /// Destination template for matching events.
    pub destination: String,
    /// Extra copies of matching events for other schema versions, during a migration
    /// (default none). See [`crate::wire::fanout`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fan_out: Vec<FanOutCopy>,
}

impl RoutingConfig {
    /// Checks every template; the error names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        check_template("routing.default", &self.default)?;
        for (i, rule) in self.rules.iter().enumerate() {
            check_template(
                &format!("routing.rules[{i}].destination"),
                &rule.destination,
            )?;
            for (j, copy) in rule.fan_out.iter().enumerate() {
                copy.check(&format!("routing.rules[{i}].fan_out[{j}]"))?;
            }
        }
        Ok(())
    }

    /// Whether any rule fans events out.
    pub fn has_fan_out(&self) -> bool {
        self.rules.iter().any(|r| !r.fan_out.is_empty())
    }

    /// The fan-out copies for an event: those of the first rule whose filters match it. They
    /// apply even when the row names its own destination (the copies serve the consumers of
    /// older versions, wherever the event itself goes).
    pub fn fan_out(&self, aggregate_type: &str, event_type: &str) -> &[FanOutCopy] {
        self.matching(aggregate_type, event_type)
            .map_or(&[], |r| r.fan_out.as_slice())
    }

    fn matching(&self, aggregate_type: &str, event_type: &str) -> Option<&RouteRule> {
        self.rules.iter().find(|r| {
            r.event_type.as_deref().is_none_or(|t| t == event_type)
                && r.aggregate_type
                    .as_deref()
                    .is_none_or(|t| t == aggregate_type)
        })
    }

    /// The destination of an event: its own override, else the first matching rule, else the
    /// default.
    pub fn route(
        &self,
        own: Option<&str>,
        aggregate_type: &str,
        event_type: &str,
        schema_version: i32,
    ) -> String {
        if let Some(own) = own {
            return own.to_owned();
        }
        let template = self
            .matching(aggregate_type, event_type)
            .map_or(self.default.as_str(), |r| r.destination.as_str());
        render(template, aggregate_type, event_type, schema_version)
    }
}

/// Fills the placeholders of `template` in one pass: the values are taken literally, so an
/// event type that itself contains `{schema_version}` is not substituted again. Anything that
/// is not a known placeholder is kept as written.
pub(crate) fn render(
    template: &str,
    aggregate_type: &str,
    event_type: &str,
    schema_version: i32,
) -> String {
    let mut out = String::with_capacity(template.len() + aggregate_type.len() + event_type.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let filled = after.find('}').and_then(|close| {
            let value: Cow<'_, str> = match &after[..close] {
                "aggregate_type" => aggregate_type.into(),
                "event_type" => event_type.into(),
                "schema_version" => schema_version.to_string().into(),
                _ => return None,
            };
            Some((value, &after[close + 1..]))
        });
        match filled {
            Some((value, tail)) => {
                out.push_str(&value);
                rest = tail;
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Refuses, as permanent, a destination outside a configured allow-list of prefixes (`field`
/// names the setting, such as `nats.subject_prefixes`). An empty list allows every
/// destination the broker's own rules allow. A prefix is matched as written: `orders.` allows
/// `orders.placed` but not `orders_admin`.
pub(crate) fn check_prefixes(
    field: &str,
    destination: &str,
    prefixes: &[String],
) -> Result<(), PublishError> {
    if prefixes.is_empty() || prefixes.iter().any(|p| destination.starts_with(p.as_str())) {
        return Ok(());
    }
    Err(PublishError::permanent(format!(
        "destination {destination:?} refused: it starts with none of the prefixes {field} \
         allows ({prefixes:?})"
    )))
}

pub(crate) fn check_template(field: &str, template: &str) -> Result<(), String> {
    if template.trim().is_empty() {
        return Err(format!("{field}: must not be empty"));
    }
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        let after = &rest[start + 1..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("{field}: unclosed '{{' in {template:?}"))?;
        let name = &after[..end];
        if !PLACEHOLDERS.contains(&name) {
            return Err(format!(
                "{field}: unknown placeholder {{{name}}} in {template:?} (known: {})",
                PLACEHOLDERS.join(", ")
            ));
        }
        rest = &after[end + 1..];
    }
    Ok(())
}

/// One extra copy of a routed event (`fan_out = [{ … }]` in a routing rule).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FanOutCopy {
    /// Destination template of the copy; `{schema_version}` is the copy's version.
    pub destination: String,
    /// The copy's schema version (1 or more), sent in its `schema-version` header.
    pub schema_version: i32,
    /// Top-level fields to keep (every other one is removed). Exclusive with `drop_fields`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_fields: Option<Vec<String>>,
    /// Top-level fields to remove: those added after `schema_version`. Default none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop_fields: Vec<String>,
}

impl FanOutCopy {
    /// Checks the copy without I/O; `field` is its place in the config, for the error.
    pub(crate) fn check(&self, field: &str) -> Result<(), String> {
        check_template(&format!("{field}.destination"), &self.destination)?;
        if self.schema_version < 1 {
            return Err(format!("{field}.schema_version: must be 1 or more"));
        }
        if self.keep_fields.is_some() && !self.drop_fields.is_empty() {
            return Err(format!("{field}: set keep_fields or drop_fields, not both"));
        }
        let names = self
            .keep_fields
            .iter()
            .flatten()
            .map(|n| ("keep_fields", n));
        let names = names.chain(self.drop_fields.iter().map(|n| ("drop_fields", n)));
        for (list, name) in names {
            if name.trim().is_empty() {
                return Err(format!("{field}.{list}: field names must not be empty"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_destination_then_rules_then_default() {
        let routing = RoutingConfig {
            rules: vec![
                RouteRule {
                    event_type: Some("OrderPaid".into()),
                    aggregate_type: None,
                    destination: "payments.v{schema_version}".into(),
                    fan_out: Vec::new(),
                },
                RouteRule {
                    event_type: None,
                    aggregate_type: Some("user".into()),
                    destination: "users".into(),
                    fan_out: Vec::new(),
                },
            ],
            ..Default::default()
        };
        assert_eq!(routing.route(Some("x.y"), "order", "OrderPaid", 1), "x.y");
        assert_eq!(routing.route(None, "order", "OrderPaid", 3), "payments.v3");
        assert_eq!(routing.route(None, "user", "Renamed", 1), "users");
        assert_eq!(routing.route(None, "order", "Placed", 1), "order.Placed");
    }

    #[test]
    fn prefixes_allow_only_what_they_name_and_none_allow_all() {
        check_prefixes("x.prefixes", "anything", &[]).unwrap();
        let prefixes = vec!["orders.".to_owned(), "users".to_owned()];
        check_prefixes("x.prefixes", "orders.placed", &prefixes).unwrap();
        check_prefixes("x.prefixes", "users-v2", &prefixes).unwrap();
        let refused = check_prefixes("x.prefixes", "orders_admin", &prefixes).unwrap_err();
        assert!(!refused.is_transient());
        assert!(
            refused.message.contains("\"orders_admin\"") && refused.message.contains("x.prefixes"),
            "{refused}"
        );
    }

    #[test]
    fn rejects_unknown_placeholders_naming_the_field() {
        let routing = RoutingConfig {
            rules: vec![RouteRule {
                event_type: None,
                aggregate_type: None,
                destination: "x.{aggregate_id}".into(),
                fan_out: Vec::new(),
            }],
            ..Default::default()
        };
        let err = routing.validate().unwrap_err();
        assert!(err.starts_with("routing.rules[0].destination: unknown placeholder {aggregate_id}"));
        let bad = RoutingConfig {
            default: "a.{event_type".into(),
            rules: vec![],
        };
        assert!(bad.validate().unwrap_err().contains("unclosed"));
    }
}
