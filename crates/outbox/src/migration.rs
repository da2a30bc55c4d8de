//! What every backend's migrator shares: which migrations are due, and the checks that an
//! applied migration is the one this build ships.

use crate::error::{Error, SchemaError};

/// Settings fixed when the outbox is created.
#[derive(Clone, Copy, Debug, Default)]
pub struct MigrateOptions {
    /// Number of partitions, the unit of relay ownership: it bounds how many relays can share
    /// the work. Used when the outbox is created (`None`: [`DEFAULT_PARTITIONS`]); on an existing
    /// outbox, `Some(n)` must match the count it was created with and `None` accepts it.
    pub partitions: Option<i32>,
    /// Range-partition the events table by `occurred_at` in slices of this many days, so that
    /// retention drops whole partitions (PostgreSQL's `time_partitions`). Only when the outbox
    /// is created; on an existing one, `Some(n)` must match what it was created with.
    pub time_partition_days: Option<i32>,
}

/// Partition count of a new outbox when none is given.
pub const DEFAULT_PARTITIONS: i32 = 32;

/// A versioned migration template.
pub(crate) type Migration = (i32, &'static str, &'static str);

/// The migrations of `shipped` not yet in `applied` (version, checksum), after checking that the
/// database is not newer than this build and that applied migrations were not edited.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn due(
    applied: &[(i32, String)],
    shipped: &'static [Migration],
) -> Result<Vec<&'static Migration>, Error> {
    due_accepting(applied, shipped, &[])
}

/// [`due`], also accepting as applied a migration recorded with one of the `earlier` checksums
/// of its version: a migration whose text was made re-runnable since, with the same effect.
pub(crate) fn due_accepting(
    applied: &[(i32, String)],
    shipped: &'static [Migration],
    earlier: &[(i32, &str)],
) -> Result<Vec<&'static Migration>, Error> {
    let known = shipped.last().map_or(0, |m| m.0);
    if let Some((latest, _)) = applied.iter().max_by_key(|(v, _)| *v) {
        if *latest > known {
            return Err(Error::Schema(SchemaError::TooNew {
                database: *latest,
                known,
            }));
        }
    }
    let mut out = Vec::new();
    for migration in shipped {
        match applied.iter().find(|(v, _)| *v == migration.0) {
            Some((_, existing))
                if *existing == checksum(migration.2)
                    || earlier.contains(&(migration.0, existing.as_str())) => {}
            Some(_) => {
                return Err(Error::Schema(SchemaError::Modified {
                    version: migration.0,
                }))
            }
            None => out.push(migration),
        }
    }
    Ok(out)
}

/// Checks that a database whose highest applied migration is `applied` (`None`: none) has
/// every migration of `shipped`: a relay or tool of this build reads columns the last ones add,
/// and must not run against an outbox they are missing from.
pub fn require_migrated(
    applied: Option<i32>,
    shipped: &[(i32, &'static str, &'static str)],
) -> Result<(), Error> {
    let needed = shipped.last().map_or(0, |m| m.0);
    match applied {
        None => Err(Error::Schema(SchemaError::Missing)),
        Some(database) if database < needed => {
            Err(Error::Schema(SchemaError::Outdated { database, needed }))
        }
        Some(_) => Ok(()),
    }
}

/// FNV-1a over the template: stable across builds and platforms, enough to notice an edit.
pub(crate) fn checksum(text: &str) -> String {
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIPPED: &[Migration] = &[(1, "a", "CREATE a"), (2, "b", "CREATE b")];

    #[test]
    fn an_outbox_missing_migrations_is_refused_with_what_to_run() {
        assert!(require_migrated(Some(2), SHIPPED).is_ok());
        assert!(
            require_migrated(Some(3), SHIPPED).is_ok(),
            "newer: `due` decides"
        );
        let outdated = require_migrated(Some(1), SHIPPED).unwrap_err().to_string();
        assert!(
            outdated.contains("at migration 1") && outdated.contains("outbox migrate"),
            "{outdated}"
        );
        assert!(matches!(
            require_migrated(None, SHIPPED),
            Err(Error::Schema(SchemaError::Missing))
        ));
    }

    #[test]
    fn due_skips_applied_and_rejects_edits_and_newer_databases() {
        let applied = vec![(1, checksum("CREATE a"))];
        assert_eq!(due(&applied, SHIPPED).unwrap(), vec![&SHIPPED[1]]);
        let edited = vec![(1, checksum("CREATE a2"))];
        assert!(due(&edited, SHIPPED)
            .unwrap_err()
            .to_string()
            .contains("migration 1"));
        let newer = vec![(3, "x".to_owned())];
        assert!(due(&newer, SHIPPED)
            .unwrap_err()
            .to_string()
            .contains("upgrade"));
    }
}
