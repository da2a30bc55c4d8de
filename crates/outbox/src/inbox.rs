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
