//! Decoding of the pgoutput row messages (protocol version 1) that the replication stream
//! carries for the events table: `Relation` (the column layout), `Insert` and `Delete`.
//! Begin, Commit and logical messages are parsed by the replication client; Truncate, Type,
//! Origin and Update are not needed here and are passed over.
//!
//! Rows are decoded into the relay's [`ClaimedRow`] from the values the stream carries, never
//! by reading the table again: a commit can reach the stream before it is visible to queries.

use std::collections::HashMap;

use chrono::{DateTime, TimeZone, Utc};
use uuid::Uuid;

use crate::store::ClaimedRow;

/// What one pgoutput message means to the relay.
#[derive(Debug)]
pub enum Change {
    /// A row inserted into the events table, decoded; or why it could not be (with its id
    /// when that much was readable).
    Inserted(Result<Box<ClaimedRow>, BadRow>),
    /// A row of the events table deleted (its id).
    Deleted(i64),
    /// Anything else (another table, truncate, type or origin message, update).
    Other,
}

/// A row the relay cannot read.
#[derive(Debug, Clone, PartialEq)]
pub struct BadRow {
    /// Its id, if readable.
    pub id: Option<i64>,
    /// Why it cannot be read.
    pub reason: String,
}

#[derive(Debug, Clone)]
struct Relation {
    namespace: String,
    name: String,
    columns: Vec<String>,
}

/// Keeps the relation layouts the stream announced and decodes row messages with them.
#[derive(Debug)]
pub struct Decoder {
    schema: String,
    table: String,
    relations: HashMap<u32, Relation>,
}

impl Decoder {
    /// A decoder for the events table `schema.table`. Payloads are kept whole, whatever
    /// their size: the relay dead-letters oversized events without losing them.
    pub fn new(schema: &str, table: &str) -> Self {
        Self {
            schema: schema.into(),
            table: table.into(),
            relations: HashMap::new(),
        }
    }

    /// Decodes one pgoutput message.
    pub fn decode(&mut self, data: &[u8]) -> Result<Change, String> {
        let mut r = Reader(data);
        match r.u8()? {
            b'R' => {
                let id = r.u32()?;
                let namespace = r.cstr()?;
                let name = r.cstr()?;
                let _identity = r.u8()?;
                let n = r.u16()?;
                let mut columns = Vec::with_capacity(usize::from(n));
                for _ in 0..n {
                    let _flags = r.u8()?;
                    columns.push(r.cstr()?);
                    let _type_oid = r.u32()?;
                    let _typmod = r.u32()?;
                }
                self.relations.insert(
                    id,
                    Relation {
                        namespace,
                        name,
                        columns,
                    },
                );
                Ok(Change::Other)
            }
            b'I' => {
                let Some(relation) = self.ours(r.u32()?)? else {
                    return Ok(Change::Other);
                };
                if r.u8()? != b'N' {
                    return Err("insert without a new tuple".into());
                }
                let tuple = r.tuple()?;
                // Rows inserted as published or dead (by an operator, or the relay's own dead
                // letters) are not events to publish.
                let row = Row::new(&relation.columns, &tuple);
                if row
                    .text("status")
                    .ok()
                    .flatten()
                    .is_some_and(|s| s != "pending")
                {
                    return Ok(Change::Other);
                }
                Ok(Change::Inserted(self.row(&row).map(Box::new)))
            }
            b'D' => {
                let Some(relation) = self.ours(r.u32()?)? else {
                    return Ok(Change::Other);
                };
                let _kind = r.u8()?; // 'K' (key) or 'O' (old row): both carry the id
                let tuple = r.tuple()?;
                let row = Row::new(&relation.columns, &tuple);
                match row.i64("id") {
                    Ok(Some(id)) => Ok(Change::Deleted(id)),
                    _ => Ok(Change::Other),
                }
            }
            _ => Ok(Change::Other),
        }
    }

    /// The relation if it is the events table (or, for a time-partitioned table published via
    /// its root, the root's name).
    fn ours(&self, id: u32) -> Result<Option<Relation>, String> {
        let relation = self
            .relations
            .get(&id)
            .ok_or_else(|| format!("row for relation {id} before its Relation message"))?;
        Ok(
            (relation.namespace == self.schema && relation.name == self.table)
                .then(|| relation.clone()),
        )
    }

    fn row(&self, row: &Row<'_, '_>) -> Result<ClaimedRow, BadRow> {
        let id = row.i64("id").ok().flatten();
        let bad = |reason: String| BadRow { id, reason };
        let required = |name: &str, v: Result<Option<String>, String>| {
            v.map_err(&bad)?
                .ok_or_else(|| bad(format!("{name} is NULL")))
        };
        let id = id.ok_or_else(|| bad("id is NULL or unreadable".into()))?;
        let payload = row.bytes("payload").map_err(&bad)?.unwrap_or_default();
        let payload_size = payload.len() as i64;
        let mut row = ClaimedRow {
            id,
            event_id: row
                .uuid("event_id")
                .map_err(&bad)?
                .ok_or_else(|| bad("event_id is NULL".into()))?,
            aggregate_type: required("aggregate_type", row.text("aggregate_type"))?,
            aggregate_id: required("aggregate_id", row.text("aggregate_id"))?,
            aggregate_version: row.i64("aggregate_version").map_err(&bad)?,
            event_type: required("event_type", row.text("event_type"))?,
            schema_version: row.i32("schema_version").map_err(&bad)?.unwrap_or(1),
            destination: row.text("destination").map_err(&bad)?,
            payload: Some(payload.into()),
            payload_size,
            content_type: required("content_type", row.text("content_type"))?,
            headers: row
                .json_text("headers")
                .map_err(&bad)?
                .unwrap_or_else(|| "null".into()),
            unreadable: None,
            occurred_at: row.timestamp("occurred_at").map_err(&bad)?,
            partition: row.i32("partition").map_err(&bad)?.unwrap_or(0),
            attempts: row.i32("attempts").map_err(&bad)?.unwrap_or(0),
            permanent_failures: row.i32("permanent_failures").map_err(&bad)?.unwrap_or(0),
            row_bytes: payload_size,
        };
        // Over the sizes a claim reads: dead-lettered with the claim's reason.
        row.unreadable = row.over_limits();
        Ok(row)
    }
}

/// One column value of a tuple.
#[derive(Debug, Clone, Copy)]
enum Value<'a> {
    Null,
    /// Unchanged TOAST value (updates only).
    Unchanged,
    Text(&'a [u8]),
    Binary(&'a [u8]),
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!(
                "pgoutput message truncated: wanted {n} more bytes, {} left",
                self.0.len()
            ));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn cstr(&mut self) -> Result<String, String> {
        let end = self
            .0
            .iter()
            .position(|&b| b == 0)
            .ok_or("pgoutput string without its terminator")?;
        let text = String::from_utf8_lossy(&self.0[..end]).into_owned();
        self.0 = &self.0[end + 1..];
        Ok(text)
    }
    fn tuple(&mut self) -> Result<Vec<Value<'a>>, String> {
        let n = self.u16()?;
        let mut values = Vec::with_capacity(usize::from(n));
        for _ in 0..n {
            values.push(match self.u8()? {
                b'n' => Value::Null,
                b'u' => Value::Unchanged,
                kind @ (b't' | b'b') => {
                    let len = self.u32()? as usize;
                    let bytes = self.take(len)?;
                    if kind == b't' {
                        Value::Text(bytes)
                    } else {
                        Value::Binary(bytes)
                    }
                }
                other => return Err(format!("unknown tuple value kind {:?}", other as char)),
            });
        }
        Ok(values)
    }
}

/// A tuple with its column names, read by name and expected type. Binary values are in the
/// types' send format; text values in their output format.
struct Row<'a, 'b> {
    columns: &'b [String],
    values: &'b [Value<'a>],
}

impl<'a, 'b> Row<'a, 'b> {
    fn new(columns: &'b [String], values: &'b [Value<'a>]) -> Self {
        Self { columns, values }
    }

    fn get(&self, name: &str) -> Option<Value<'a>> {
        let i = self.columns.iter().position(|c| c == name)?;
        self.values.get(i).copied()
    }

    fn raw(&self, name: &str) -> Result<Option<(bool, &'a [u8])>, String> {
        match self.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Unchanged) => Err(format!("{name} was not sent (unchanged TOAST value)")),
            Some(Value::Text(b)) => Ok(Some((false, b))),
            Some(Value::Binary(b)) => Ok(Some((true, b))),
        }
    }

    fn text_of(name: &str, bytes: &[u8]) -> Result<String, String> {
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{name} is not valid UTF-8"))
    }

    fn text(&self, name: &str) -> Result<Option<String>, String> {
        self.raw(name)?
            .map(|(_, b)| Self::text_of(name, b))
            .transpose()
    }

    fn int<const N: usize>(&self, name: &str) -> Result<Option<i64>, String> {
        let Some((binary, b)) = self.raw(name)? else {
            return Ok(None);
        };
        if binary {
            let bytes: [u8; N] = b
                .try_into()
                .map_err(|_| format!("{name}: {} bytes, expected {N}", b.len()))?;
            Ok(Some(match N {
                8 => i64::from_be_bytes(bytes[..].try_into().expect("8")),
                _ => i64::from(i32::from_be_bytes(bytes[..].try_into().expect("4"))),
            }))
        } else {
            Self::text_of(name, b)?
                .parse()
                .map(Some)
                .map_err(|e| format!("{name} is not an integer: {e}"))
        }
    }

    fn i64(&self, name: &str) -> Result<Option<i64>, String> {
        self.int::<8>(name)
    }

    fn i32(&self, name: &str) -> Result<Option<i32>, String> {
        self.int::<4>(name)?
            .map(|v| i32::try_from(v).map_err(|_| format!("{name} out of range")))
            .transpose()
    }

    fn uuid(&self, name: &str) -> Result<Option<Uuid>, String> {
        let Some((binary, b)) = self.raw(name)? else {
            return Ok(None);
        };
        if binary {
            Uuid::from_slice(b)
                .map(Some)
                .map_err(|e| format!("{name}: {e}"))
        } else {
            Uuid::parse_str(&Self::text_of(name, b)?)
                .map(Some)
                .map_err(|e| format!("{name}: {e}"))
        }
    }

    fn bytes(&self, name: &str) -> Result<Option<Vec<u8>>, String> {
        let Some((binary, b)) = self.raw(name)? else {
            return Ok(None);
        };
        if binary {
            return Ok(Some(b.to_vec()));
        }
        // bytea's hex output: \x followed by two hex digits per byte.
        let hex = b
            .strip_prefix(b"\\x")
            .ok_or_else(|| format!("{name}: expected bytea hex output (\\x…)"))?;
        if hex.len() % 2 != 0 {
            return Err(format!("{name}: odd number of hex digits"));
        }
        hex.chunks(2)
            .map(|pair| {
                std::str::from_utf8(pair)
                    .ok()
                    .and_then(|s| u8::from_str_radix(s, 16).ok())
                    .ok_or_else(|| format!("{name}: not a hex digit pair"))
            })
            .collect::<Result<Vec<u8>, String>>()
            .map(Some)
    }

    /// A jsonb column as its JSON text (parsed later, by the row's decode: a value the JSON
    /// parser refuses makes that row a dead letter, not an unreadable stream message).
    fn json_text(&self, name: &str) -> Result<Option<String>, String> {
        let Some((binary, b)) = self.raw(name)? else {
            return Ok(None);
        };
        // jsonb's send format is a version byte (1) and the text.
        let text = match (binary, b.split_first()) {
            (true, Some((1, rest))) => rest,
            (true, _) => return Err(format!("{name}: unknown jsonb format version")),
            (false, _) => b,
        };
        Self::text_of(name, text).map(Some)
    }

    /// `None` (and no error) for a time the relay cannot represent: the row is then
    /// dead-lettered naming `occurred_at`, as the polling relay does.
    fn timestamp(&self, name: &str) -> Result<Option<DateTime<Utc>>, String> {
        let Some((binary, b)) = self.raw(name)? else {
            return Ok(None);
        };
        if binary {
            let micros = i64::from_be_bytes(
                b.try_into()
                    .map_err(|_| format!("{name}: {} bytes, expected 8", b.len()))?,
            );
            // Microseconds since 2000-01-01 UTC; ±infinity are i64::MAX / i64::MIN.
            let epoch_2000 = 946_684_800_000_000_i64;
            return Ok(micros
                .checked_add(epoch_2000)
                .and_then(|m| Utc.timestamp_micros(m).single())
                .filter(|t| t.timestamp() < 8_210_266_876_800)); // before 262143-01-01
        }
        let text = Self::text_of(name, b)?;
        Ok(DateTime::parse_from_str(&text, "%Y-%m-%d %H:%M:%S%.f%#z")
            .ok()
            .map(|t| t.with_timezone(&Utc)))
    }
}
