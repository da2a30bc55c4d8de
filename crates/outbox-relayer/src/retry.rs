//! Retry policy: exponential backoff with jitter, and when a failure becomes a dead letter.

use std::{cell::RefCell, time::Duration};

use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::publisher::FailureClass;

/// When and how often failed events are retried (`[retry]` in the config file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Delay after the first failure (default 200ms); doubles with each further attempt.
    #[serde(with = "humantime_serde")]
    pub initial_backoff: Duration,
    /// Longest delay after a permanent failure (default 60s).
    #[serde(with = "humantime_serde")]
    pub max_backoff: Duration,
    /// Longest delay after a transient failure (default 5s): a broker that comes back is used
    /// again quickly.
    #[serde(with = "humantime_serde")]
    pub max_transient_backoff: Duration,
    /// Attempts after which a permanently failing event is dead-lettered (default 5). Transient
    /// failures never dead-letter an event.
    pub max_attempts: i32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(60),
            max_transient_backoff: Duration::from_secs(5),
            max_attempts: 5,
        }
    }
}

impl RetryPolicy {
    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_attempts < 1 {
            return Err("retry.max_attempts: must be 1 or more".into());
        }
        if self.initial_backoff.is_zero() {
            return Err("retry.initial_backoff: must be more than 0".into());
        }
        if self.max_backoff < self.initial_backoff {
            return Err("retry.max_backoff: must not be less than retry.initial_backoff".into());
        }
        if self.max_transient_backoff < self.initial_backoff {
            return Err(
                "retry.max_transient_backoff: must not be less than retry.initial_backoff".into(),
            );
        }
        Ok(())
    }

    /// Whether an event whose failures of this `class` number `count` now (this one
    /// included) is dead: only permanent failures count, up to `max_attempts`.
    pub fn is_dead(&self, count: i32, class: FailureClass) -> bool {
        class == FailureClass::Permanent && count >= self.max_attempts
    }

    /// What to record for event row `id` that failed with `error`, after `attempts` attempts
    /// of which `permanent_failures` failed permanently. The two budgets stay apart: a
    /// permanent failure counts towards the dead letter and its backoff grows with the
    /// permanent failures; a transient failure never dead-letters, and its backoff grows
    /// with the attempts. The one decision both sources (polling, CDC) use.
    pub fn failure(
        &self,
        id: i64,
        attempts: i32,
        permanent_failures: i32,
        error: &crate::publisher::PublishError,
    ) -> crate::store::Failure {
        let permanent = error.class == FailureClass::Permanent;
        let count = if permanent {
            permanent_failures.saturating_add(1)
        } else {
            attempts.saturating_add(1)
        };
        crate::store::Failure {
            id,
            error: crate::store::storable_error(&error.to_string()),
            backoff: self.backoff(count, error.class),
            dead: self.is_dead(count, error.class),
            permanent,
        }
    }

    /// Delay before the next attempt of an event that has failed `attempts` times: exponential,
    /// capped, with "equal jitter" (between half and all of the computed delay) so that relays
    /// and aggregates that failed together do not retry in lockstep.
    pub fn backoff(&self, attempts: i32, class: FailureClass) -> Duration {
        let cap = match class {
            FailureClass::Transient => self.max_transient_backoff,
            FailureClass::Permanent => self.max_backoff,
        };
        let full = Backoff::step(self.initial_backoff, cap, attempts.max(1) as u32);
        outbox::backoff::equal_jitter(full, random_fraction())
    }
}

thread_local! {
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Makes the relay's random choices on the calling thread (the jitter of every backoff) follow
/// `seed`, or the system's randomness again with `None`. For deterministic simulation: relays
/// run on a single-threaded runtime make the same choices on every run of a seed.
pub fn seed_thread_rng(seed: Option<u64>) {
    SEEDED.with(|rng| *rng.borrow_mut() = seed.map(StdRng::seed_from_u64));
}

/// A random fraction in `[0, 1)`, from the seeded generator of this thread if there is one.
pub(crate) fn random_fraction() -> f64 {
    SEEDED.with(|rng| match rng.borrow_mut().as_mut() {
        Some(seeded) => seeded.random::<f64>(),
        None => rand::rng().random::<f64>(),
    })
}

/// Exponential backoff for the relay's own retries (database, circuit breaker): the shared
/// helper, jittered with [`random_fraction`] through [`jittered`].
pub(crate) use outbox::backoff::Backoff;

/// `backoff`'s next delay with equal jitter from this thread's (possibly seeded) generator.
pub(crate) fn jittered(backoff: &mut Backoff) -> Duration {
    backoff.next_jittered(random_fraction())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_jitter_and_caps() {
        let p = RetryPolicy::default();
        for attempts in 1..40 {
            let d = p.backoff(attempts, FailureClass::Permanent);
            let full = (Duration::from_millis(200) * 2u32.pow((attempts - 1).min(20) as u32))
                .min(p.max_backoff);
            assert!(
                d >= full / 2 && d <= full,
                "attempt {attempts}: {d:?} vs {full:?}"
            );
        }
        assert!(p.backoff(30, FailureClass::Transient) <= p.max_transient_backoff);
    }

    #[test]
    fn only_permanent_failures_dead_letter() {
        let p = RetryPolicy::default();
        assert!(!p.is_dead(4, FailureClass::Permanent));
        assert!(p.is_dead(5, FailureClass::Permanent));
        assert!(!p.is_dead(1_000, FailureClass::Transient));
    }

    #[test]
    fn transient_failures_do_not_use_up_the_permanent_budget() {
        let p = RetryPolicy::default();
        let outage = crate::publisher::PublishError::transient("broker down");
        let rejected = crate::publisher::PublishError::permanent("rejected");
        // Ten transient attempts, then the first permanent failure: retried, not dead.
        let f = p.failure(1, 10, 0, &rejected);
        assert!(!f.dead && f.permanent);
        assert!(
            f.backoff <= p.initial_backoff,
            "first permanent backoff: {f:?}"
        );
        assert!(p.failure(1, 14, 4, &rejected).dead);
        let f = p.failure(1, 1_000, 4, &outage);
        assert!(!f.dead && !f.permanent);
        assert!(f.backoff >= p.max_transient_backoff / 2);
    }

    #[test]
    fn validation_names_the_field() {
        let p = RetryPolicy {
            max_attempts: 0,
            ..Default::default()
        };
        assert!(p.validate().unwrap_err().starts_with("retry.max_attempts"));
    }
}
