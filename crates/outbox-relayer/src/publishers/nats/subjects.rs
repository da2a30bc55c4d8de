//! Which subjects an event may be published to. A subject comes from event data (the row's
//! `destination`, or the routing template filled with its aggregate and event types), and
//! publishing to it is sending a request with the relay's credentials: a subject of the
//! server's own (`$JS.API.STREAM.DELETE.X` deletes a stream, `$KV.…` writes a key-value bucket,
//! `$SYS.…` talks to the system account, `_INBOX.…` answers another client's request) is
//! refused before anything is sent, as are wildcards and malformed subjects, and anything
//! outside `nats.subject_prefixes` when that is set.

use crate::{publisher::PublishError, wire::routing::check_prefixes};

/// Refuses, as permanent, a subject an event may not be published to; the error names the
/// subject and the rule.
pub(super) fn check_subject(subject: &str, prefixes: &[String]) -> Result<(), PublishError> {
    if !is_valid_subject(subject) {
        return Err(PublishError::permanent(format!(
            "nats: {subject:?} is not a valid NATS subject (dot-separated non-empty tokens, \
             no spaces, no wildcards)"
        )));
    }
    if let Some(rule) = system_subject_rule(subject) {
        return Err(PublishError::permanent(format!(
            "nats: subject {subject:?} refused: {rule}"
        )));
    }
    check_prefixes("nats.subject_prefixes", subject, prefixes)
}

/// Why `subject` (or a subject prefix) belongs to the server rather than to events, if it
/// does: a first token starting with `$` (JetStream's and the key-value and object stores'
/// APIs, the system account, MQTT's internal subjects), or the `_INBOX` reply subjects.
pub(super) fn system_subject_rule(subject: &str) -> Option<&'static str> {
    let first = subject.split('.').next().unwrap_or_default();
    if first.starts_with('$') {
        return Some(
            "a first token starting with '$' is a server API or system subject ($JS, $KV, $O, \
             $SYS, $MQTT, …)",
        );
    }
    if first == "_INBOX" {
        return Some("_INBOX subjects carry replies to other clients' requests");
    }
    None
}

/// Whether `subject` can be published to: non-empty dot-separated tokens without whitespace,
/// control characters or wildcards. On bytes when the subject is ASCII (every byte above space
/// but DEL), by character otherwise (Unicode whitespace and controls).
pub fn is_valid_subject(subject: &str) -> bool {
    if subject.is_empty() || subject.len() > 1024 {
        return false;
    }
    if !subject.is_ascii() {
        return subject.split('.').all(|token| {
            !token.is_empty()
                && token != "*"
                && token != ">"
                && !token.chars().any(|c| c.is_whitespace() || c.is_control())
        });
    }
    // Printable bytes only (a pass without branches, which the compiler vectorises), then the
    // tokens: none empty, none a lone wildcard.
    let bytes = subject.as_bytes();
    let unprintable = bytes
        .iter()
        .fold(false, |bad, &b| bad | (b <= b' ') | (b == 0x7f));
    !unprintable
        && bytes
            .split(|&b| b == b'.')
            .all(|token| !matches!(token, [] | [b'*'] | [b'>']))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_subjects() {
        assert!(is_valid_subject("order.OrderPlaced"));
        assert!(is_valid_subject("a"));
        assert!(is_valid_subject("commandes.été"));
        for bad in [
            "",
            "a..b",
            ".a",
            "a.",
            "a b",
            "a.*",
            "a.>",
            "a\n",
            "a\x7f",
            "a\tb",
            "é.a b",
            "é.\u{a0}",
            "é.\u{85}",
            "é..a",
            "*",
            ">",
            "a.*.b",
            ">.a",
        ] {
            assert!(!is_valid_subject(bad), "{bad:?}");
        }
    }

    /// The one-pass check agrees with the plain reading of the rule on every subject of up to
    /// five characters over an alphabet of the characters that matter.
    #[test]
    fn the_byte_check_agrees_with_the_rule() {
        let rule = |subject: &str| {
            !subject.is_empty()
                && subject.split('.').all(|token| {
                    !token.is_empty()
                        && token != "*"
                        && token != ">"
                        && !token.chars().any(|c| c.is_whitespace() || c.is_control())
                })
        };
        let alphabet = ['a', '.', '*', '>', ' ', '\t', '\x7f', '\0', '~'];
        let mut subjects = vec![String::new()];
        for _ in 0..5 {
            let longer: Vec<String> = subjects
                .iter()
                .flat_map(|s| alphabet.iter().map(move |c| format!("{s}{c}")))
                .collect();
            for s in &longer {
                assert_eq!(is_valid_subject(s), rule(s), "{s:?}");
            }
            subjects = longer;
        }
    }

    /// System and API subjects are refused whichever way they are spelled, the error naming
    /// the subject and the rule; prefixes then narrow what is left.
    #[test]
    fn system_and_api_subjects_are_refused_naming_subject_and_rule() {
        for system in [
            "$JS.API.STREAM.DELETE.V",
            "$JS.API.STREAM.PURGE.V5",
            "$KV.config.key",
            "$SYS.REQ.SERVER.PING",
            "$O.bucket.C.x",
            "$MQTT.sess.x",
            "$G",
            "_INBOX.abc.1",
            "_INBOX",
        ] {
            let error = check_subject(system, &[]).unwrap_err();
            assert!(!error.is_transient(), "{system}");
            assert!(error.message.contains(&format!("{system:?}")), "{error}");
            assert!(error.message.contains("refused"), "{error}");
        }
        for fine in [
            "order.placed",
            "JS.API.x",
            "x.$JS.API",
            "_INBOXES.x",
            "x._INBOX",
        ] {
            check_subject(fine, &[]).unwrap();
        }
        let prefixes = vec!["orders.".to_owned()];
        check_subject("orders.placed", &prefixes).unwrap();
        let outside = check_subject("billing.paid", &prefixes).unwrap_err();
        assert!(
            outside.message.contains("nats.subject_prefixes"),
            "{outside}"
        );
        assert!(check_subject("a.*", &[])
            .unwrap_err()
            .message
            .contains("not a valid"));
    }
}
