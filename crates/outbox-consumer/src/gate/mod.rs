//! The version gate: a consumer applies the events of an aggregate in `aggregate_version`
//! order, each once, whatever order the broker delivers them in. Per consumer and aggregate it
//! keeps the last version applied (`consumer_versions`), checked and advanced in the same
//! transaction as the inbox row and the handler's effect; an event that comes before its turn
//! is held in the consumer's database and applied when its turn comes (see
//! [`crate::runner`]). The rules are in [`decide`].

pub(crate) mod decide;

use std::time::Duration;

pub(crate) use decide::Start;

/// How long a first-seen aggregate waits for versions below the first one it saw, by default.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(30);

/// Where the gate expects an aggregate's versions to start.
#[derive(Clone, Debug)]
pub struct VersionGate {
    start: Start,
}

impl VersionGate {
    /// A gate whose aggregates start at version `first` (usually 1): an aggregate's first
    /// event applied must carry `first`, so a later one that overtakes it is held until it
    /// comes. For a consumer that receives every event of its aggregates from the first; one
    /// deployed later seeds where each aggregate starts (`outbox consumer-versions seed`).
    pub fn starting_at(first: i64) -> Self {
        Self {
            start: Start::At(first),
        }
    }

    /// A gate for a consumer deployed after its aggregates' first events, or whose versions
    /// do not all start at 1: an aggregate whose first event seen is version 1 starts there;
    /// one first seen at a later version is held for [`DEFAULT_SETTLE`] (see
    /// [`VersionGate::settle`]) for earlier versions to arrive (a reordered delivery, another
    /// topic), then starts at the lowest version held. A version that arrives below an
    /// aggregate's start after that is never skipped as a duplicate: it is dead-lettered with
    /// the reason.
    pub fn from_first_seen() -> Self {
        Self {
            start: Start::FirstSeen {
                settle: DEFAULT_SETTLE,
            },
        }
    }

    /// How long a first-seen aggregate waits for earlier versions before it starts (no effect
    /// on a gate [`VersionGate::starting_at`] a version).
    pub fn settle(self, settle: Duration) -> Self {
        match self.start {
            Start::FirstSeen { .. } => Self {
                start: Start::FirstSeen { settle },
            },
            Start::At(_) => self,
        }
    }

    pub(crate) fn start(&self) -> Start {
        self.start
    }
}
