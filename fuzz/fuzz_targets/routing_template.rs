//! Destination templates and rules (configuration) with any event values: validation accepts
//! exactly the reference grammar and names the field when it refuses; routing never panics and
//! fills each placeholder once, with the values taken literally.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use outbox_relayer::routing::{RouteRule, RoutingConfig};

const PLACEHOLDERS: [&str; 3] = ["aggregate_type", "event_type", "schema_version"];

#[derive(Arbitrary, Debug)]
struct Input {
    default: String,
    rules: Vec<(Option<String>, Option<String>, String)>,
    aggregate_type: String,
    event_type: String,
    schema_version: i32,
    own: Option<String>,
}

enum Token<'a> {
    Text(&'a str),
    Placeholder(&'a str),
}

/// The reference grammar: not blank, and every `{` opens a known placeholder closed by the
/// next `}`.
fn parse(template: &str) -> Result<Vec<Token<'_>>, String> {
    if template.trim().is_empty() {
        return Err("must not be empty".into());
    }
    let mut tokens = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        tokens.push(Token::Text(&rest[..open]));
        let close = rest[open..].find('}').ok_or("unclosed '{'")?;
        let name = &rest[open + 1..open + close];
        if !PLACEHOLDERS.contains(&name) {
            return Err(format!("unknown placeholder {{{name}}}"));
        }
        tokens.push(Token::Placeholder(name));
        rest = &rest[open + close + 1..];
    }
    tokens.push(Token::Text(rest));
    Ok(tokens)
}

fuzz_target!(|input: Input| {
    let config = RoutingConfig {
        default: input.default,
        rules: input
            .rules
            .into_iter()
            .map(|(event_type, aggregate_type, destination)| RouteRule {
                event_type,
                aggregate_type,
                destination,
            })
            .collect(),
    };
    let (at, et, v) = (
        &input.aggregate_type,
        &input.event_type,
        input.schema_version,
    );
    let routed = config.route(input.own.as_deref(), at, et, v);
    if let Some(own) = &input.own {
        assert_eq!(&routed, own);
    }
    let fields = std::iter::once(("routing.default".to_owned(), &config.default)).chain(
        config
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| (format!("routing.rules[{i}].destination"), &r.destination)),
    );
    let first_bad = fields
        .filter_map(|(field, t)| parse(t).err().map(|reason| (field, reason)))
        .next();
    match (config.validate(), first_bad) {
        (Ok(()), None) => {}
        (Err(message), Some((field, reason))) => {
            assert!(message.starts_with(&format!("{field}: ")), "{message}");
            assert!(message.contains(&reason), "{message} / {reason}");
            return;
        }
        (got, expected) => panic!("validate {got:?}, reference {expected:?}"),
    }
    if input.own.is_some() {
        return;
    }
    let template = config
        .rules
        .iter()
        .find(|r| {
            r.event_type.as_deref().is_none_or(|t| t == et)
                && r.aggregate_type.as_deref().is_none_or(|t| t == at)
        })
        .map_or(&config.default, |r| &r.destination);
    let expected: String = parse(template)
        .expect("validated")
        .iter()
        .map(|t| match t {
            Token::Text(text) => (*text).to_owned(),
            Token::Placeholder("aggregate_type") => at.clone(),
            Token::Placeholder("event_type") => et.clone(),
            Token::Placeholder(_) => v.to_string(),
        })
        .collect();
    assert_eq!(routed, expected);
});
