//! Claimed rows read from PostgreSQL: by name once per claim, then by position.

use bytes::Bytes;

use crate::store::ClaimedRow;

impl ClaimedRow {
    /// Reads a claimed PostgreSQL row. A column the relay cannot decode (text that is not
    /// UTF-8 in a `SQL_ASCII` database, say) makes that row unreadable, not the claim: the row
    /// is dead-lettered with the decoding error, and the other rows go on. Only a row whose id
    /// or partition cannot be read fails the claim.
    pub fn read(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        Self::read_at(row, &mut Columns::of(row)?)
    }

    /// [`ClaimedRow::read`] with the columns' positions found already (once per claim). The
    /// columns' types are checked against the fields' until one row has been read with the
    /// checks (every row of one result has the same column types); the rest are decoded
    /// without them, which costs a quarter of a claimed row's reading.
    pub(crate) fn read_at(
        row: &sqlx::postgres::PgRow,
        at: &mut Columns,
    ) -> Result<Self, sqlx::Error> {
        use sqlx::Row;
        let [id, event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, destination, payload, payload_size, content_type, headers, unreadable, occurred_at, partition, attempts, permanent_failures, row_bytes] =
            at.positions;
        let checked = at.types_checked;
        macro_rules! get {
            ($column:expr) => {
                if checked {
                    row.try_get_unchecked($column)
                } else {
                    row.try_get($column)
                }
            };
        }
        let read = || {
            Ok::<_, sqlx::Error>(Self {
                id: get!(id)?,
                event_id: get!(event_id)?,
                aggregate_type: get!(aggregate_type)?,
                aggregate_id: get!(aggregate_id)?,
                aggregate_version: get!(aggregate_version)?,
                event_type: get!(event_type)?,
                schema_version: get!(schema_version)?,
                destination: get!(destination)?,
                payload: get!(payload).map(|p: Option<Vec<u8>>| p.map(Bytes::from))?,
                payload_size: get!(payload_size)?,
                content_type: get!(content_type)?,
                headers: get!(headers)?,
                unreadable: get!(unreadable)?,
                occurred_at: get!(occurred_at)?,
                partition: get!(partition)?,
                attempts: get!(attempts)?,
                permanent_failures: get!(permanent_failures)?,
                row_bytes: get!(row_bytes)?,
            })
        };
        match read() {
            Ok(row) => {
                at.types_checked = true;
                Ok(row)
            }
            Err(error) => Self::unreadable_row(row, &error),
        }
    }
}

/// A claimed row from a PostgreSQL row with the claim's columns (`query_as`): as
/// [`ClaimedRow::read`], a column that does not decode makes the row unreadable, not the read.
impl sqlx::FromRow<'_, sqlx::postgres::PgRow> for ClaimedRow {
    fn from_row(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        Self::read(row)
    }
}

/// Where each column of a claimed PostgreSQL row is: found once per claim (by name, on its
/// first row) and then read by position, since a lookup by name for every column of every
/// row costs more than the read itself.
pub(crate) struct Columns {
    positions: [usize; 18],
    /// Whether a row has been read with its columns' types checked.
    types_checked: bool,
}

impl Columns {
    /// The positions of the claim's columns in `row`.
    pub(crate) fn of(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        use sqlx::{Column, Row};
        const NAMES: [&str; 18] = [
            "id",
            "event_id",
            "aggregate_type",
            "aggregate_id",
            "aggregate_version",
            "event_type",
            "schema_version",
            "destination",
            "payload",
            "payload_size",
            "content_type",
            "headers",
            "unreadable",
            "occurred_at",
            "partition",
            "attempts",
            "permanent_failures",
            "row_bytes",
        ];
        let mut at = [0; 18];
        for (slot, name) in at.iter_mut().zip(NAMES) {
            *slot = row.try_column(name)?.ordinal();
        }
        Ok(Self {
            positions: at,
            types_checked: false,
        })
    }
}
