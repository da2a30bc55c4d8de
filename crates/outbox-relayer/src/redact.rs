//! Secrets out of printed text: every URL that reaches a log line, an error message, `/readyz`
//! or the terminal goes through [`url`] (or [`urls_in`] for a third party's message that
//! embeds one), which keeps what an operator needs (scheme, user name, host, port, path) and
//! replaces the secrets with `***`.
//!
//! The user info is found by text, not by a URL parser: a password with a raw `/`, `?` or `#`
//! ends the authority early for a parser, which then either fails or, worse, succeeds with the
//! rest of the password as the path (`postgres://u:5432/SEC@x@host/db` parses as host `u`,
//! port 5432). Here the user info ends at the last `@` of the authority, or, when an `@`
//! follows the authority, at the last `@` of the whole URL: a secret is hidden whole, at the
//! cost of hiding a host when the query itself holds an `@`.

/// `***`, what a secret is replaced with.
const MASK: &str = "***";

/// Schemes whose user info without a password is a user name (`postgres://app@db/shop`),
/// printed as it is. In any other scheme (`https://TOKEN@host`, `nats://TOKEN@host`) a lone
/// user info is a token, and hidden.
const USER_NAME_SCHEMES: &[&str] = &[
    "postgres",
    "postgresql",
    "mysql",
    "mariadb",
    "amqp",
    "amqps",
    "redis",
    "rediss",
    "mqtt",
    "mqtts",
    "kafka",
];

/// `url` with its password, a token in its user info, and query parameters named like a
/// secret (`password=`, `sslpassword=`, `sasl.password=`, `…token=`, `…secret=`) replaced by
/// `***`: `postgres://app:p/SEC@x@db:5432/shop?sslpassword=k` reads
/// `postgres://app:***@db:5432/shop?sslpassword=***`. Text that is not a URL is returned with
/// only such `name=value` pairs hidden.
pub fn url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return secret_parameters(url);
    };
    let Some(at) = userinfo_end(rest) else {
        return format!("{scheme}://{}", secret_parameters(rest));
    };
    let userinfo = &rest[..at];
    let after = &rest[at + 1..];
    let kept = match userinfo.split_once(':') {
        Some((user, _password)) => format!("{user}:{MASK}"),
        None if USER_NAME_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) => {
            userinfo.to_owned()
        }
        None => MASK.to_owned(),
    };
    format!("{scheme}://{kept}@{}", secret_parameters(after))
}

/// `text` with every `scheme://…` in it passed through [`url`]: for messages of other
/// libraries that quote the URL they were given (an HTTP client's "error sending request for
/// url (http://user:password@collector/v1/traces)"). A URL ends at white space or a quote.
pub fn urls_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(found) = rest.find("://") {
        let scheme_start = rest[..found]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |i| i + 1);
        let end = rest[found..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`'))
            .map_or(rest.len(), |i| found + i);
        out.push_str(&rest[..scheme_start]);
        out.push_str(&url(&rest[scheme_start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// What follows the user info of `url` (`host:port/path?query`), or what follows `://` when
/// there is none: where the server is, without the credentials. `None` for text without
/// `://`.
pub fn after_userinfo(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    Some(userinfo_end(rest).map_or(rest, |at| &rest[at + 1..]))
}

/// Whether the user info of `url` holds a raw `/`, `?` or `#` (an `@` follows one of them): a
/// URL parser reads part of such a password as the host, the port or the path, and connects
/// somewhere else or fails with a riddle. Such a URL is best refused, asking for
/// percent-encoding (`%2F`, `%3F`, `%23`).
pub fn userinfo_needs_encoding(url: &str) -> bool {
    url.split_once("://").is_some_and(|(_, rest)| {
        rest.find(['/', '?', '#'])
            .is_some_and(|end| rest[end..].contains('@'))
    })
}

/// Where the `@` that ends the user info is in `rest` (the URL after `://`), if there is one.
fn userinfo_end(rest: &str) -> Option<usize> {
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    if rest[authority_end..].contains('@') {
        // A raw `/`, `?` or `#` in the password: the user info runs to the last `@`.
        rest.rfind('@')
    } else {
        rest[..authority_end].rfind('@')
    }
}

/// `text` with the values of `name=value` pairs (separated by `&`, `;` or white space) whose
/// name reads like a secret replaced by `***`.
fn secret_parameters(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut start = 0;
    for (i, c) in text.char_indices() {
        if matches!(c, '&' | ';' | '?' | '#') || c.is_whitespace() {
            out.push_str(&secret_parameter(&text[start..i]));
            out.push(c);
            start = i + c.len_utf8();
        }
    }
    out.push_str(&secret_parameter(&text[start..]));
    out
}

/// `name=***` when `pair`'s name reads like a secret, else `pair`.
fn secret_parameter(pair: &str) -> String {
    match pair.split_once('=') {
        Some((name, _)) if secret_name(name) => format!("{name}={MASK}"),
        _ => pair.to_owned(),
    }
}

fn secret_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    // The last dotted part: `sasl.password`, `ssl.key.password`.
    let last = name.rsplit('.').next().unwrap_or(&name);
    last.ends_with("password")
        || last.ends_with("passwd")
        || last.ends_with("secret")
        || last.ends_with("token")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_passwords_whatever_they_contain() {
        for (raw, expected) in [
            (
                "postgres://app:p/SEC@x:y@127.0.0.1:1/test",
                "postgres://app:***@127.0.0.1:1/test",
            ),
            (
                "postgres://u:5432/SEC@x@db:5432/shop",
                "postgres://u:***@db:5432/shop",
            ),
            ("postgres://u:a#b?c@db/shop", "postgres://u:***@db/shop"),
            (
                "mysql://root:p%2FSEC%40x@db:3306/t",
                "mysql://root:***@db:3306/t",
            ),
            ("redis://u:p@ss@h:1", "redis://u:***@h:1"),
            ("redis://:only@h:1", "redis://:***@h:1"),
            (
                "amqp://guest:s3cret@host:5672/%2f",
                "amqp://guest:***@host:5672/%2f",
            ),
            (
                "kafka://u:k@h1:9092,h2:9092",
                "kafka://u:***@h1:9092,h2:9092",
            ),
            ("amqp://host", "amqp://host"),
        ] {
            assert_eq!(url(raw), expected, "{raw}");
        }
    }

    #[test]
    fn keeps_user_names_and_hides_tokens() {
        assert_eq!(url("postgres://app@db/shop"), "postgres://app@db/shop");
        assert_eq!(url("https://ghp_SECRET@h/x"), "https://***@h/x");
        assert_eq!(url("nats://SECRET@h:4222"), "nats://***@h:4222");
    }

    #[test]
    fn hides_secret_query_parameters() {
        assert_eq!(
            url("postgres://db/shop?sslmode=verify-full&password=SEC&sslpassword=K"),
            "postgres://db/shop?sslmode=verify-full&password=***&sslpassword=***"
        );
        assert_eq!(
            url("kafka://h:9092?sasl.password=SEC"),
            "kafka://h:9092?sasl.password=***"
        );
    }

    #[test]
    fn hides_the_urls_inside_a_message() {
        assert_eq!(
            urls_in("error sending request for url (http://u:p/SEC@h:4318/v1/traces): refused"),
            "error sending request for url (http://u:***@h:4318/v1/traces): refused"
        );
        assert_eq!(
            urls_in("a \"nats://T@h\" and https://x:y@z"),
            "a \"nats://***@h\" and https://x:***@z"
        );
        assert_eq!(urls_in("no url here"), "no url here");
    }

    #[test]
    fn tells_a_password_that_needs_percent_encoding() {
        assert!(userinfo_needs_encoding("postgres://u:p/SEC@x:y@h:1/db"));
        assert!(userinfo_needs_encoding("postgres://u:a#b@h/db"));
        assert!(!userinfo_needs_encoding("postgres://u:p%2FSEC%40x@h:1/db"));
        assert!(!userinfo_needs_encoding(
            "postgres://u:p@ss:w@h/db?sslmode=require"
        ));
    }

    #[test]
    fn finds_the_server_after_the_credentials() {
        assert_eq!(
            after_userinfo("postgres://app:p/SEC@x:y@127.0.0.1:1/test"),
            Some("127.0.0.1:1/test")
        );
        assert_eq!(after_userinfo("postgres://db:5/x"), Some("db:5/x"));
        assert_eq!(after_userinfo("not a url"), None);
    }
}
