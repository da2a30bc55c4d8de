//! What the version gate does with an event, from its aggregate's state alone: the rules, in
//! one place, for a delivery (live) and for a held event (the drain).

use std::time::Duration;

use crate::store::State;

/// Where an aggregate's versions start for a gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// At this version: an aggregate's first event applied must carry it.
    At(i64),
    /// At version 1, or at the lowest version seen within `settle` of the aggregate's first
    /// event held.
    FirstSeen { settle: Duration },
}

impl Start {
    /// The version the gate waits for next, if it knows one.
    pub(crate) fn expected(&self, state: &State) -> Option<i64> {
        match (state.version, state.first_version, self) {
            (Some(last), _, _) => Some(last.saturating_add(1)),
            (None, Some(first), _) => Some(first),
            (None, None, Start::At(first)) => Some(*first),
            (None, None, Start::FirstSeen { .. }) => None,
        }
    }

    /// What becomes of version `version`, below the `expected` one: skipped as a duplicate
    /// when its aggregate's versions up to there were applied (by another message of it: a
    /// purged inbox row, another producer's copy) or declared done by an operator; otherwise
    /// it was never this consumer's to apply in order, and is dead-lettered with why.
    fn below(&self, state: &State, version: i64, expected: i64) -> Decision {
        let applied_range =
            state.version.is_some() && state.first_version.is_none_or(|first| version >= first);
        if applied_range || state.seeded {
            return Decision::Stale;
        }
        let why = match (self, state.first_version) {
            (Start::At(first), None) => {
                format!("version {version} is below the first version {first} the gate expects")
            }
            (_, first) => format!(
                "version {version} arrived after the gate started the aggregate at version {} \
                 (version {} expected next): it cannot be applied in order; replay it after \
                 `outbox consumer-versions seed`, or leave it",
                first.unwrap_or(expected),
                expected
            ),
        };
        Decision::BelowStart(why)
    }
}

/// What to do with an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Apply it now.
    Apply,
    /// Hold it: due `due_in` from now (`None`: when an earlier event is applied), for `reason`.
    Hold {
        due_in: Option<Duration>,
        reason: String,
    },
    /// Its version was applied (or declared done): skip it as a duplicate.
    Stale,
    /// Below its aggregate's start: dead-letter it, saying why.
    BelowStart(String),
    /// Held, and its turn has not come: it waits (the drain stops here), for `reason`.
    Wait(String),
}

/// A delivery of version `version` (if the gate orders it: `start` set, a version and an
/// aggregate) whose aggregate has `state`.
pub(crate) fn live(start: Option<&Start>, state: &State, version: Option<i64>) -> Decision {
    let behind = |due_in| Decision::Hold {
        due_in,
        reason: format!("behind {} held event(s) of its aggregate", state.held),
    };
    let (Some(start), Some(version)) = (start, version) else {
        return if state.held > 0 {
            behind(None)
        } else {
            Decision::Apply
        };
    };
    match start.expected(state) {
        Some(expected) if version < expected => start.below(state, version, expected),
        // Held events first: the drain applies them and this one in version order.
        Some(expected) if version == expected && state.held > 0 => behind(Some(Duration::ZERO)),
        Some(expected) if version == expected => Decision::Apply,
        Some(expected) => Decision::Hold {
            due_in: None,
            reason: format!("waiting for version {expected}"),
        },
        None if version == 1 && state.held == 0 => Decision::Apply,
        None if version == 1 => behind(Some(Duration::ZERO)),
        None if state.held > 0 => Decision::Hold {
            due_in: None,
            reason: format!(
                "first seen at a later version than {version}'s predecessors: waiting for \
                 earlier versions"
            ),
        },
        None => {
            let Start::FirstSeen { settle } = start else {
                unreachable!("only a first-seen gate has no expected version")
            };
            Decision::Hold {
                due_in: Some(*settle),
                reason: format!(
                    "first seen at version {version}: waiting {} for earlier versions",
                    humantime::format_duration(*settle)
                ),
            }
        }
    }
}

/// The held event the drain picked for its aggregate: version `version` (`None`: the gate
/// does not order it), `settled` when the aggregate's first hold is older than the settle time.
pub(crate) fn held(
    start: Option<&Start>,
    state: &State,
    version: Option<i64>,
    settled: bool,
) -> Decision {
    let (Some(start), Some(version)) = (start, version) else {
        return Decision::Apply;
    };
    match start.expected(state) {
        Some(expected) if version < expected => start.below(state, version, expected),
        Some(expected) if version == expected => Decision::Apply,
        Some(expected) => Decision::Wait(format!("waiting for version {expected}")),
        None if version == 1 || settled => Decision::Apply,
        None => Decision::Wait(format!(
            "first seen at version {version}: waiting for earlier versions"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTLE: Duration = Duration::from_secs(30);
    const AT_1: Start = Start::At(1);
    const SEEN: Start = Start::FirstSeen { settle: SETTLE };

    fn state(version: Option<i64>, first: Option<i64>, held: i32) -> State {
        State {
            known: version.is_some() || first.is_some() || held > 0,
            version,
            first_version: first,
            seeded: false,
            held,
        }
    }

    fn waits(due_in: Option<Duration>) -> impl Fn(&Decision) -> bool {
        move |d| matches!(d, Decision::Hold { due_in: d, .. } if *d == due_in)
    }

    #[test]
    fn a_gate_starting_at_one_applies_in_order_and_holds_what_comes_early() {
        let fresh = state(None, None, 0);
        assert_eq!(live(Some(&AT_1), &fresh, Some(1)), Decision::Apply);
        assert!(waits(None)(&live(Some(&AT_1), &fresh, Some(2))));
        let at_3 = state(Some(3), Some(1), 0);
        assert_eq!(live(Some(&AT_1), &at_3, Some(4)), Decision::Apply);
        assert_eq!(live(Some(&AT_1), &at_3, Some(2)), Decision::Stale);
        assert!(matches!(
            live(Some(&AT_1), &fresh, Some(0)),
            Decision::BelowStart(why) if why.contains("below the first version 1")
        ));
    }

    /// Held events go first: even the expected version is held behind them (due at once),
    /// so the drain applies the aggregate in version order.
    #[test]
    fn an_aggregate_with_held_events_holds_the_next_too() {
        let held = state(Some(1), Some(1), 2);
        assert!(waits(Some(Duration::ZERO))(&live(
            Some(&AT_1),
            &held,
            Some(2)
        )));
        assert!(waits(None)(&live(Some(&AT_1), &held, Some(5))));
        assert_eq!(live(Some(&AT_1), &held, Some(1)), Decision::Stale);
        // Without a gate (or a version), arrival order: behind the held ones, not due.
        assert!(waits(None)(&live(None, &held, Some(2))));
        assert!(waits(None)(&live(Some(&AT_1), &held, None)));
        assert_eq!(live(None, &state(None, None, 0), None), Decision::Apply);
    }

    /// The reordered first event: a first-seen gate no longer takes version 2 as the start
    /// when version 1 is late; it waits for it.
    #[test]
    fn a_first_seen_gate_starts_at_one_or_waits_before_starting_higher() {
        let fresh = state(None, None, 0);
        assert_eq!(live(Some(&SEEN), &fresh, Some(1)), Decision::Apply);
        assert!(waits(Some(SETTLE))(&live(Some(&SEEN), &fresh, Some(2))));
        let waiting = state(None, None, 1);
        assert!(waits(Some(Duration::ZERO))(&live(
            Some(&SEEN),
            &waiting,
            Some(1)
        )));
        assert!(waits(None)(&live(Some(&SEEN), &waiting, Some(3))));
        // The drain: version 1, or the lowest once settled.
        assert_eq!(held(Some(&SEEN), &waiting, Some(1), false), Decision::Apply);
        assert!(matches!(
            held(Some(&SEEN), &waiting, Some(2), false),
            Decision::Wait(_)
        ));
        assert_eq!(held(Some(&SEEN), &waiting, Some(2), true), Decision::Apply);
    }

    /// After a first-seen start at 5, version 3 is not a duplicate: it was never applied, and
    /// can no longer be in order. It is dead-lettered with why, not acknowledged.
    #[test]
    fn a_version_below_a_first_seen_start_is_dead_lettered_not_skipped() {
        let started = state(Some(6), Some(5), 0);
        assert!(matches!(
            live(Some(&SEEN), &started, Some(3)),
            Decision::BelowStart(why) if why.contains("started the aggregate at version 5")
        ));
        assert_eq!(live(Some(&SEEN), &started, Some(5)), Decision::Stale);
        // Declared done by an operator: skipped.
        let seeded = State {
            seeded: true,
            ..state(Some(9), Some(10), 0)
        };
        assert_eq!(live(Some(&SEEN), &seeded, Some(3)), Decision::Stale);
        // A row from before first versions were recorded: as before, a duplicate.
        assert_eq!(
            live(Some(&AT_1), &state(Some(6), None, 0), Some(3)),
            Decision::Stale
        );
    }

    #[test]
    fn the_drain_applies_the_expected_version_and_waits_at_a_gap() {
        let at_1 = state(Some(1), Some(1), 3);
        assert_eq!(held(Some(&AT_1), &at_1, Some(2), false), Decision::Apply);
        assert!(matches!(
            held(Some(&AT_1), &at_1, Some(4), false),
            Decision::Wait(why) if why == "waiting for version 2"
        ));
        assert_eq!(held(Some(&AT_1), &at_1, Some(1), false), Decision::Stale);
        assert_eq!(
            held(None, &at_1, Some(9), false),
            Decision::Apply,
            "arrival order"
        );
    }
}
