//! What every inbox backend shares.

/// Whether an event is seen for the first time by a consumer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// First time: apply the effect in this transaction.
    New,
    /// Already applied (by an earlier delivery): skip the effect.
    Duplicate,
}

impl Seen {
    /// True for [`Seen::New`].
    pub fn is_new(self) -> bool {
        self == Seen::New
    }
}

/// Rejects a consumer name (half of the inbox key) that is empty, longer than
/// [`MAX_MESSAGE_ID_CHARS`] or holds a NUL: MySQL's key column would cut a longer one, and two
/// consumers whose names share their first 255 characters would share one inbox.
pub(crate) fn check_consumer(consumer: &str) -> Result<(), crate::error::Error> {
    if consumer.trim().is_empty() {
        return Err(crate::error::Error::invalid(
            "consumer",
            "must not be empty",
        ));
    }
    if consumer.chars().count() > MAX_MESSAGE_ID_CHARS {
        return Err(crate::error::Error::invalid(
            "consumer",
            "must be at most 255 characters",
        ));
    }
    if consumer.contains('\0') {
        return Err(crate::error::Error::invalid(
            "consumer",
            "must not contain NUL",
        ));
    }
    Ok(())
}

/// The longest consumer name, message id or event type an inbox records, in characters
/// (MySQL's key columns).
pub const MAX_MESSAGE_ID_CHARS: usize = 255;

/// Rejects a message id that is empty, longer than [`MAX_MESSAGE_ID_CHARS`] or holds a NUL
/// (no database column keeps it as given), and an event type that is empty or too long: what
/// every inbox checks before it records a message.
pub fn check_message(
    message_id: &str,
    event_type: Option<&str>,
) -> Result<(), crate::error::Error> {
    let bad = |text: &str| {
        if text.is_empty() {
            Some("must not be empty")
        } else if text.chars().count() > MAX_MESSAGE_ID_CHARS {
            Some("must be at most 255 characters")
        } else if text.contains('\0') {
            Some("must not contain NUL")
        } else {
            None
        }
    };
    if let Some(why) = bad(message_id) {
        return Err(crate::error::Error::invalid("message_id", why));
    }
    if let Some(why) = event_type.and_then(bad) {
        return Err(crate::error::Error::invalid("event_type", why));
    }
    Ok(())
}

/// `New` when the insert added the row, `Duplicate` when it was already there.
pub(crate) fn seen(rows_affected: u64) -> Seen {
    if rows_affected == 1 {
        Seen::New
    } else {
        Seen::Duplicate
    }
}

/// Runs one purge statement per batch until a batch deletes fewer rows than `batch`.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) async fn purge_in_batches<F, Fut>(
    batch: i64,
    mut delete: F,
) -> Result<u64, crate::error::Error>
where
    F: FnMut(i64) -> Fut,
    Fut: std::future::Future<Output = Result<u64, crate::error::Error>>,
{
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let deleted = delete(batch).await?;
        total += deleted;
        if deleted < batch as u64 {
            return Ok(total);
        }
    }
}
