//! The oldest streamed transaction not yet confirmed: written by the stream, read by the
//! slot's lag gauge.

use std::sync::Mutex;

use chrono::{DateTime, Utc};

/// The commit time of the oldest streamed transaction with events not yet confirmed: set by
/// the stream, read by the slot sampler, which measures it against the database's clock on
/// its own schedule (a stream stuck inside one call does not freeze the gauge).
#[derive(Debug, Default)]
pub(crate) struct Unconfirmed(Mutex<Option<DateTime<Utc>>>);

impl Unconfirmed {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<DateTime<Utc>>> {
        self.0.lock().expect("not poisoned")
    }

    /// A transaction committed at `at` has events to confirm: the oldest such time is kept
    /// (a stream started again sends unconfirmed transactions again).
    pub(super) fn streamed(&self, at: Option<DateTime<Utc>>) {
        let mut since = self.lock();
        if since.is_none() {
            *since = at;
        }
    }

    /// Everything streamed is confirmed, or this relay no longer streams the slot.
    pub(super) fn clear(&self) {
        *self.lock() = None;
    }

    /// The commit time of the oldest transaction not yet confirmed.
    pub(super) fn since(&self) -> Option<DateTime<Utc>> {
        *self.lock()
    }
}
