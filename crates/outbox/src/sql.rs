//! Helpers for SQL kept in `.sql` files: a file holds named statements, each after a
//! `-- name: …` line, rendered with [`crate::ident::Tables::render`] before use.

/// The statement that follows `-- name: {name}` in a file of named statements, without its
/// trailing `;`. Panics when there is none: the files are compiled in, so a missing name is a
/// bug of this build, found by the first test that renders it.
pub fn named<'a>(file: &'a str, name: &str) -> &'a str {
    let marker = format!("-- name: {name}\n");
    let start = file.find(&marker).expect("statement exists") + marker.len();
    let rest = &file[start..];
    let end = rest.find("-- name: ").unwrap_or(rest.len());
    rest[..end].trim().trim_end_matches(';')
}

/// The savepoint a batch of several events is written under where one statement per event
/// is (MySQL, SQLite): rolled back when a statement fails half-way, so that none of the batch
/// stays in the caller's transaction (those databases roll back only the failed statement).
/// Outside a transaction, SQLite's savepoint is one; MySQL's does nothing (each statement
/// commits).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) mod savepoint {
    /// Opens it.
    pub(crate) const OPEN: &str = "SAVEPOINT outbox_batch";
    /// Rolls the batch back (the savepoint stays, to be released).
    pub(crate) const ROLL_BACK: &str = "ROLLBACK TO SAVEPOINT outbox_batch";
    /// Ends it, keeping what was written since it opened.
    pub(crate) const RELEASE: &str = "RELEASE SAVEPOINT outbox_batch";
}

#[cfg(test)]
mod tests {
    use super::named;

    #[test]
    fn finds_each_statement_up_to_the_next_name() {
        let file = "-- name: a\nSELECT 1;\n-- name: b\n-- a comment\nSELECT 2;\n";
        assert_eq!(named(file, "a"), "SELECT 1");
        assert_eq!(named(file, "b"), "-- a comment\nSELECT 2");
    }
}
