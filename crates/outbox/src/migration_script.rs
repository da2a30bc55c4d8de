//! Migrations written out as one SQL script (`outbox migrate --print`), for teams whose DBAs
//! apply schema changes with their own tools. A script holds what `migrate` would run, in the
//! same order, with the bookkeeping rows that tell a later `migrate` (and every relay) that
//! the migrations are applied.

use std::fmt::Write;

/// A migration script being written.
pub(crate) struct Script {
    text: String,
    versions: Vec<i32>,
}

impl Script {
    /// A script whose first lines name the database, the outbox and this build.
    pub(crate) fn new(database: &str, outbox: &str) -> Self {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "-- outbox {} migrations for {database}, outbox {outbox}.",
            env!("CARGO_PKG_VERSION")
        );
        Self {
            text,
            versions: Vec::new(),
        }
    }

    /// A `-- ` comment, one per line of `text`.
    pub(crate) fn comment(&mut self, text: &str) {
        for line in text.lines() {
            let _ = writeln!(self.text, "-- {line}");
        }
    }

    /// A line for the database's command-line client (`.bail on`, sqlite3's), as it is.
    #[cfg(feature = "sqlite")]
    pub(crate) fn client_command(&mut self, line: &str) {
        self.text.push_str(line);
        self.text.push('\n');
    }

    /// One statement (or a file of them), ended with `;` and a blank line.
    pub(crate) fn statement(&mut self, sql: &str) {
        let sql = sql.trim_end();
        self.text.push_str(sql);
        if !sql.ends_with(';') {
            self.text.push(';');
        }
        self.text.push_str("\n\n");
    }

    /// The header of migration `version`, before its statements.
    pub(crate) fn migration(&mut self, version: i32, description: &str) {
        self.versions.push(version);
        let _ = writeln!(self.text, "-- Migration {version:04}: {description}");
    }

    /// The script, with a last line saying which migrations it holds (none: the database has
    /// them all).
    pub(crate) fn finish(mut self) -> String {
        match (self.versions.first(), self.versions.last()) {
            (Some(first), Some(last)) => {
                let _ = writeln!(self.text, "-- End of migrations {first} to {last}.");
            }
            _ => {
                let _ = writeln!(
                    self.text,
                    "-- Nothing to apply: the database has every migration of this build."
                );
            }
        }
        self.text
    }
}

/// `text` as an SQL string literal, quotes doubled. The texts quoted here are this build's
/// migration descriptions and checksums and validated identifiers, none with a backslash
/// (which MySQL's default escaping and standard SQL read differently): one is a bug of this
/// build, found by the tests that print every backend's script.
pub(crate) fn literal(text: &str) -> String {
    assert!(
        !text.contains('\\'),
        "no backslash in a script literal: {text}"
    );
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_ends_each_statement_and_names_its_migrations() {
        let mut script = Script::new("PostgreSQL", "\"outbox\".\"events\"");
        script.comment("two\nlines");
        script.migration(1, "create");
        script.statement("CREATE TABLE a (x int)");
        script.statement("CREATE TABLE b (x int);\n");
        let text = script.finish();
        assert!(text.contains("-- two\n-- lines\n"), "{text}");
        assert!(
            text.contains(
                "-- Migration 0001: create\nCREATE TABLE a (x int);\n\nCREATE TABLE b (x int);\n\n"
            ),
            "{text}"
        );
        assert!(text.ends_with("-- End of migrations 1 to 1.\n"), "{text}");
    }

    #[test]
    fn an_empty_script_says_there_is_nothing_to_apply() {
        let script = Script::new("SQLite", "outbox_events");
        assert!(script
            .finish()
            .ends_with("Nothing to apply: the database has every migration of this build.\n"));
    }

    #[test]
    fn literals_double_quotes() {
        assert_eq!(literal("it's"), "'it''s'");
    }
}
