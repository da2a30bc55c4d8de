//! What every backend's migrator shares: which migrations are due, and the checks that an
//! applied migration is the one this build ships.

use crate::{Error, SchemaError};

/// A versioned migration template.
pub(crate) type Migration = (i32, &'static str, &'static str);

/// The migrations of `shipped` not yet in `applied` (version, checksum), after checking that the
/// database is not newer than this build and that applied migrations were not edited.
pub(crate) fn due(
    applied: &[(i32, String)],
    shipped: &'static [Migration],
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
            Some((_, existing)) if *existing == checksum(migration.2) => {}
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
