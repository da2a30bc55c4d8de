//! Properties of destination routing (configuration input): validation never panics, accepts
//! exactly the templates a reference grammar accepts and names the field and the reason when
//! it refuses one; routing never panics, keeps a row's own destination unchanged and fills each
//! placeholder once, taking the event's values literally.

use outbox_relayer::routing::{RouteRule, RoutingConfig};
use proptest::prelude::*;

const PLACEHOLDERS: [&str; 3] = ["aggregate_type", "event_type", "schema_version"];

/// A piece of template: literal text, known placeholders, unknown ones, lone braces, anything.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z0-9.>*_ -]{0,6}",
        3 => prop::sample::select(PLACEHOLDERS.to_vec()).prop_map(|p| format!("{{{p}}}")),
        1 => "\\{[a-z_{]{0,16}\\}",
        1 => prop::sample::select(vec!["{", "}", "{}", "{{", "}}"]).prop_map(str::to_owned),
        1 => "\\PC{0,4}",
        1 => any::<String>(),
    ]
}

fn template() -> impl Strategy<Value = String> {
    prop::collection::vec(piece(), 0..6).prop_map(|p| p.concat())
}

/// Templates the grammar accepts: text without braces and known placeholders.
fn valid_template() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-z0-9.>*_-]{1,6}",
        prop::sample::select(PLACEHOLDERS.to_vec()).prop_map(|p| format!("{{{p}}}")),
    ];
    prop::collection::vec(piece, 1..5).prop_map(|p| p.concat())
}

/// Event field values, including ones that look like placeholders.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[A-Za-z0-9._-]{1,12}",
        2 => prop::sample::select(PLACEHOLDERS.to_vec()).prop_map(|p| format!("x{{{p}}}y")),
        1 => any::<String>(),
    ]
}

fn rule(template: impl Strategy<Value = String>) -> impl Strategy<Value = RouteRule> {
    (
        prop::option::of(prop::sample::select(vec![
            "Placed",
            "Paid",
            "x{event_type}",
        ])),
        prop::option::of(prop::sample::select(vec!["order", "user"])),
        template,
    )
        .prop_map(|(event_type, aggregate_type, destination)| RouteRule {
            event_type: event_type.map(str::to_owned),
            aggregate_type: aggregate_type.map(str::to_owned),
            destination,
            fan_out: Vec::new(),
        })
}

/// One token of a template under the reference grammar.
#[derive(Debug)]
enum Token<'a> {
    Text(&'a str),
    Placeholder(&'a str),
}

/// The reference grammar: a template is not blank, and every `{` opens one of the known
/// placeholders, closed by the next `}`. Returns the tokens, or the reason it is refused.
fn reference_parse(template: &str) -> Result<Vec<Token<'_>>, String> {
    if template.trim().is_empty() {
        return Err("must not be empty".into());
    }
    let mut tokens = Vec::new();
    let mut rest = template;
    loop {
        let Some(open) = rest.find('{') else {
            tokens.push(Token::Text(rest));
            return Ok(tokens);
        };
        tokens.push(Token::Text(&rest[..open]));
        let Some(close) = rest[open..].find('}') else {
            return Err("unclosed '{'".into());
        };
        let name = &rest[open + 1..open + close];
        if !PLACEHOLDERS.contains(&name) {
            return Err(format!("unknown placeholder {{{name}}}"));
        }
        tokens.push(Token::Placeholder(name));
        rest = &rest[open + close + 1..];
    }
}

fn reference_render(
    tokens: &[Token<'_>],
    aggregate_type: &str,
    event_type: &str,
    v: i32,
) -> String {
    tokens
        .iter()
        .map(|t| match t {
            Token::Text(text) => (*text).to_owned(),
            Token::Placeholder("aggregate_type") => aggregate_type.to_owned(),
            Token::Placeholder("event_type") => event_type.to_owned(),
            Token::Placeholder(_) => v.to_string(),
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn validation_agrees_with_the_grammar_and_names_field_and_reason(
        default in template(),
        rules in prop::collection::vec(rule(template()), 0..4),
    ) {
        let config = RoutingConfig { default: default.clone(), rules: rules.clone() };
        let templates = std::iter::once(("routing.default".to_owned(), default))
            .chain(rules.into_iter().enumerate().map(|(i, r)| {
                (format!("routing.rules[{i}].destination"), r.destination)
            }));
        let first_bad = templates
            .filter_map(|(field, t)| reference_parse(&t).err().map(|reason| (field, reason)))
            .next();
        match (config.validate(), first_bad) {
            (Ok(()), None) => {}
            (Err(message), Some((field, reason))) => {
                prop_assert!(
                    message.starts_with(&format!("{field}: ")),
                    "{message:?} should start with {field:?}"
                );
                prop_assert!(message.contains(&reason), "{message:?} should say {reason:?}");
            }
            (got, expected) => prop_assert!(false, "validate {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn routing_fills_each_placeholder_once_with_literal_values(
        default in valid_template(),
        rules in prop::collection::vec(rule(valid_template()), 0..4),
        aggregate_type in value(),
        event_type in value(),
        schema_version in any::<i32>(),
    ) {
        let config = RoutingConfig { default, rules };
        prop_assert_eq!(config.validate(), Ok(()));
        let routed = config.route(None, &aggregate_type, &event_type, schema_version);
        let template = config
            .rules
            .iter()
            .find(|r| {
                r.event_type.as_deref().is_none_or(|t| t == event_type)
                    && r.aggregate_type.as_deref().is_none_or(|t| t == aggregate_type)
            })
            .map_or(&config.default, |r| &r.destination);
        let tokens = reference_parse(template).expect("valid");
        prop_assert_eq!(
            routed,
            reference_render(&tokens, &aggregate_type, &event_type, schema_version)
        );
    }

    #[test]
    fn routing_never_panics_and_keeps_a_rows_own_destination(
        default in template(),
        rules in prop::collection::vec(rule(template()), 0..4),
        aggregate_type in value(),
        event_type in value(),
        schema_version in any::<i32>(),
        own in prop::option::of(any::<String>()),
    ) {
        // Even on a configuration that validation would refuse.
        let config = RoutingConfig { default, rules };
        let routed = config.route(own.as_deref(), &aggregate_type, &event_type, schema_version);
        if let Some(own) = own {
            prop_assert_eq!(routed, own);
        }
    }
}

/// The bug the property above found: values were substituted one placeholder after the other,
/// so an aggregate type containing `{event_type}` had it replaced in turn.
#[test]
fn a_value_that_looks_like_a_placeholder_is_kept_literally() {
    let config = RoutingConfig::default();
    assert_eq!(
        config.route(None, "x{event_type}", "Placed", 1),
        "x{event_type}.Placed"
    );
    assert_eq!(
        config.route(None, "order", "{schema_version}", 7),
        "order.{schema_version}"
    );
}
