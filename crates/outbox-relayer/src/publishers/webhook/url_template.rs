//! The webhook URL template (`webhook.url`) and how an event's destination goes into it.
//!
//! The destination is event data: any writer chooses it. It is percent-encoded so that it
//! stays one path segment (or one query value): every byte but the unreserved `A-Z a-z 0-9 - .
//! _ ~` is encoded, `/`, `?`, `#`, `%`, `&` and `=` included, so it cannot climb out of its
//! segment, start a query or a fragment, or smuggle an encoded `..`. A destination made of dots
//! only (`.`, `..`) is refused, because servers resolve such a segment even when it is encoded;
//! so is an empty one. `{destination}` may stand in the path or the query only: the scheme, user
//! info, host and port come from the operator's configuration and nowhere else.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use url::{Origin, Url};

use crate::publishers::redact_url;

/// The placeholder an operator writes.
const PLACEHOLDER: &str = "{destination}";

/// What the placeholder becomes while the template is parsed: lowercase letters and digits,
/// which every part of a URL keeps as written (hosts are lowercased).
const MARKER: &str = "0utb0xdest1nat10nmark3r";

/// Bytes left as they are: RFC 3986's unreserved characters.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A parsed `webhook.url`.
#[derive(Clone, Debug)]
pub(crate) struct UrlTemplate {
    /// The normalised URL, split where `{destination}` goes (one part when it has none).
    parts: Vec<String>,
    /// Scheme, host and port, which every request must keep.
    origin: Origin,
}

impl UrlTemplate {
    /// Parses and checks a template. Errors start with `webhook.url` and quote the template
    /// with its password hidden.
    pub(crate) fn parse(template: &str) -> Result<Self, String> {
        let shown = redact_url(template);
        let fail = |why: &str| format!("webhook.url: `{shown}` {why}");
        if template.contains(MARKER) {
            return Err(fail(&format!(
                "contains `{MARKER}`, which the relay reserves"
            )));
        }
        let marked = template.replace(PLACEHOLDER, MARKER);
        if marked.contains(['{', '}']) {
            return Err(fail(
                "has a placeholder other than `{destination}`, the only one a webhook URL takes",
            ));
        }
        let url = Url::parse(&marked).map_err(|e| {
            if marked.contains(MARKER) {
                fail(&format!(
                    "is not a URL once `{{destination}}` is filled in ({e}); `{{destination}}` \
                     may only go in the path or the query, never in the scheme, user info, \
                     host or port"
                ))
            } else {
                fail(&format!("is not a URL ({e})"))
            }
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(fail("must start with http:// or https://"));
        }
        if url.host_str().is_none() {
            return Err(fail("has no host"));
        }
        let misplaced = [
            ("user info", url.username().contains(MARKER)),
            (
                "user info",
                url.password().is_some_and(|p| p.contains(MARKER)),
            ),
            ("host", url.host_str().is_some_and(|h| h.contains(MARKER))),
            (
                "fragment (never sent)",
                url.fragment().is_some_and(|f| f.contains(MARKER)),
            ),
        ];
        if let Some((part, _)) = misplaced.iter().find(|(_, found)| *found) {
            return Err(fail(&format!(
                "puts `{{destination}}` in the {part}; it may only go in the path or the query"
            )));
        }
        if template.contains(PLACEHOLDER) && !url.as_str().contains(MARKER) {
            return Err(fail(
                "loses `{destination}` when parsed (a `..` after it removes its segment)",
            ));
        }
        Ok(Self {
            parts: url.as_str().split(MARKER).map(str::to_owned).collect(),
            origin: url.origin(),
        })
    }

    /// The URL for `destination`, or why it cannot be sent (a permanent condition: the same
    /// destination never becomes sendable).
    pub(crate) fn render(&self, destination: &str) -> Result<Url, String> {
        if self.parts.len() > 1 {
            if destination.is_empty() {
                return Err("the destination is empty".into());
            }
            if destination.bytes().all(|b| b == b'.') {
                return Err(format!(
                    "the destination `{destination}` is a dot-segment, which servers resolve"
                ));
            }
        }
        let encoded = utf8_percent_encode(destination, SEGMENT).to_string();
        let url = Url::parse(&self.parts.join(&encoded))
            .map_err(|e| format!("the destination makes an invalid URL ({e})"))?;
        // Unreachable with the encoding above; kept so that no future change to it can send a
        // request to another host.
        if url.origin() != self.origin {
            return Err("the destination would change the host".into());
        }
        Ok(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(t: &str) -> UrlTemplate {
        UrlTemplate::parse(t).unwrap()
    }

    #[test]
    fn a_destination_is_one_encoded_segment() {
        let t = template("http://127.0.0.1:8080/hooks/{destination}");
        for (destination, path) in [
            ("orders.OrderPlaced", "/hooks/orders.OrderPlaced"),
            (
                "../../admin/delete?all=true&x=",
                "/hooks/..%2F..%2Fadmin%2Fdelete%3Fall%3Dtrue%26x%3D",
            ),
            ("%2e%2e/", "/hooks/%252e%252e%2F"),
            ("a#b", "/hooks/a%23b"),
            ("a/b", "/hooks/a%2Fb"),
            ("a\\b", "/hooks/a%5Cb"),
            ("é ü", "/hooks/%C3%A9%20%C3%BC"),
            ("...x", "/hooks/...x"),
        ] {
            let url = t.render(destination).unwrap();
            assert_eq!(url.path(), path, "{destination}");
            assert_eq!(url.query(), None, "{destination}");
            assert_eq!(url.host_str(), Some("127.0.0.1"));
        }
    }

    #[test]
    fn a_destination_in_the_query_is_one_value() {
        let t = template("https://h.example/in?topic={destination}&v=1");
        let url = t.render("x&v=2#f").unwrap();
        assert_eq!(url.query(), Some("topic=x%26v%3D2%23f&v=1"));
        assert_eq!(url.fragment(), None);
    }

    #[test]
    fn refuses_empty_and_dot_only_destinations() {
        let t = template("http://h/hooks/{destination}");
        for d in ["", ".", "..", "..."] {
            assert!(t.render(d).is_err(), "{d:?}");
        }
        // Without the placeholder every event goes to the one URL.
        assert_eq!(template("http://h/in").render("").unwrap().path(), "/in");
    }

    #[test]
    fn refuses_the_placeholder_outside_the_path_and_query() {
        for (t, part) in [
            ("http://{destination}/x", "host"),
            ("http://{destination}.example.com/x", "host"),
            ("http://a{destination}/x", "host"),
            ("http://{destination}@h/x", "user info"),
            ("http://u:{destination}@h/x", "user info"),
            ("http://h:{destination}/x", "URL"),
            ("{destination}://h/x", "URL"),
            ("http:/{destination}/x", "host"),
            ("http://h/x#{destination}", "fragment"),
            ("http://h/{aggregate_id}", "placeholder"),
            ("http://h/{destination}/..", "loses"),
            ("ftp://h/{destination}", "http"),
        ] {
            let err = UrlTemplate::parse(t).unwrap_err();
            assert!(err.starts_with("webhook.url: `"), "{t}: {err}");
            assert!(err.contains(part), "{t}: {err}");
        }
    }

    #[test]
    fn errors_hide_the_password() {
        let err = UrlTemplate::parse("http://u:s3cret@{destination}/x").unwrap_err();
        assert!(!err.contains("s3cret"), "{err}");
    }
}
