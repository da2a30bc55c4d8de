use std::fmt;

use crate::error::Error;

/// A validated SQL identifier: lowercase ASCII letters, digits and `_`, starting with a letter or
/// `_`, at most 63 bytes. Only identifiers of this form are ever placed into SQL text, and always
/// quoted; every value goes through bind parameters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ident(String);

impl Ident {
    /// Validates `value` as the identifier of `what` (used in the error message).
    pub fn new(what: &'static str, value: &str) -> Result<Self, Error> {
        let reject = |reason| Error::InvalidIdentifier {
            what,
            value: value.to_owned(),
            reason,
        };
        let first = value.chars().next().ok_or_else(|| reject("it is empty"))?;
        if value.len() > 63 {
            return Err(reject("it is longer than 63 bytes"));
        }
        if !(first.is_ascii_lowercase() || first == '_') {
            return Err(reject("it must start with a lowercase letter or '_'"));
        }
        if !value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(reject("only lowercase letters, digits and '_' are allowed"));
        }
        Ok(Self(value.to_owned()))
    }

    /// The identifier as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Ident {
    /// Formats the identifier quoted, ready for SQL text.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0)
    }
}

/// Where the outbox lives: a schema (default `outbox`) holding the events table (default
/// `events`) and the relay's tables (`leases`, `relays`, `holds`, `meta`, `migrations`).
/// One outbox per schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tables {
    schema: Ident,
    events: Ident,
}

impl Default for Tables {
    fn default() -> Self {
        Self {
            schema: Ident("outbox".into()),
            events: Ident("events".into()),
        }
    }
}

impl Tables {
    /// Validates both names.
    pub fn new(schema: &str, events: &str) -> Result<Self, Error> {
        let events = Ident::new("table", events)?;
        if OWN_TABLES.contains(&events.as_str()) {
            return Err(Error::InvalidIdentifier {
                what: "table",
                value: events.as_str().to_owned(),
                reason: "it is the name of one of the outbox's own tables (inbox, leases, \
                         relays, holds, meta, audit, migrations, cdc_slots, consumer_held, \
                         consumer_versions, sagas, saga_steps)",
            });
        }
        Ok(Self {
            schema: Ident::new("schema", schema)?,
            events,
        })
    }

    /// The schema.
    pub fn schema(&self) -> &Ident {
        &self.schema
    }

    /// The events table name (unqualified).
    pub fn events(&self) -> &Ident {
        &self.events
    }

    /// The LISTEN/NOTIFY channel the writer notifies and the relay listens on.
    pub fn channel(&self) -> String {
        format!("{}_{}", self.schema.as_str(), self.events.as_str())
    }

    /// Replaces `{schema}`, `{events}` in an SQL template with the quoted identifiers, and
    /// `{events_name}` with the bare table name (used to build index and constraint names).
    pub fn render(&self, template: &str) -> String {
        template
            .replace("{schema}", &self.schema.to_string())
            .replace("{events_name}", self.events.as_str())
            .replace("{events}", &self.events.to_string())
    }
}

/// The tables an outbox keeps beside its events table, in its schema (PostgreSQL) or under
/// its prefix (MySQL, SQLite): the events table may not take one of these names.
const OWN_TABLES: [&str; 12] = [
    "inbox",
    "leases",
    "relays",
    "holds",
    "meta",
    "audit",
    "migrations",
    "cdc_slots",
    "consumer_held",
    "consumer_versions",
    "sagas",
    "saga_steps",
];

impl Tables {
    /// Renders a SQLite template: SQLite has no schemas, so each table is named
    /// `{schema}_{name}` (`outbox_events`, `outbox_leases`, …). The names are validated
    /// identifiers and need no quoting.
    pub fn render_sqlite(&self, template: &str) -> String {
        self.render_prefixed(template)
    }

    /// Renders a MySQL / MariaDB statement: tables are named as on SQLite
    /// (`{schema}_events`, …), in the connection's database.
    pub fn render_mysql(&self, template: &str) -> String {
        self.render_prefixed(template)
    }

    fn render_prefixed(&self, template: &str) -> String {
        let prefix = self.schema.as_str();
        let mut out = template.replace("{events}", &format!("{prefix}_{}", self.events.as_str()));
        for table in [
            "leases",
            "relays",
            "holds",
            "meta",
            "inbox",
            "audit",
            "migrations",
        ] {
            out = out.replace(&format!("{{{table}}}"), &format!("{prefix}_{table}"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_identifiers() {
        assert_eq!(
            Ident::new("schema", "outbox_2").unwrap().as_str(),
            "outbox_2"
        );
        assert_eq!(Ident::new("schema", "_x").unwrap().to_string(), "\"_x\"");
    }

    #[test]
    fn rejects_anything_that_could_escape_quoting() {
        for bad in [
            "",
            "Outbox",
            "1abc",
            "out box",
            "a\"b",
            "a;drop table x",
            "é",
            &"a".repeat(64),
        ] {
            let err = Ident::new("schema", bad).unwrap_err().to_string();
            assert!(err.contains("schema"), "{err}");
        }
    }

    #[test]
    fn the_events_table_may_not_take_the_name_of_another_outbox_table() {
        for own in OWN_TABLES {
            let err = Tables::new("s_inbox", own).unwrap_err().to_string();
            assert!(err.contains("one of the outbox's own tables"), "{err}");
        }
        assert!(Tables::new("inbox", "events").is_ok(), "the schema may");
    }

    #[test]
    fn renders_templates() {
        let t = Tables::new("s", "ev").unwrap();
        assert_eq!(
            t.render("CREATE INDEX {events_name}_x ON {schema}.{events}"),
            "CREATE INDEX ev_x ON \"s\".\"ev\""
        );
        assert_eq!(t.channel(), "s_ev");
    }
}
