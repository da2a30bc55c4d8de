//! Exponential backoff, the one every retry loop of the relay, the consumers and the CLI uses.
//!
//! The jitter's randomness is the caller's: the relay draws it from a generator its simulation
//! can seed, so that a seeded run makes the same choices every time.

use std::time::Duration;

/// Delays doubling from `initial` up to `max`: `initial`, `2 × initial`, `4 × initial`, …, `max`,
/// `max`, … until [`Backoff::reset`].
///
/// ```
/// use std::time::Duration;
/// use outbox::backoff::Backoff;
///
/// let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(300));
/// assert_eq!(backoff.next(), Duration::from_millis(100));
/// assert_eq!(backoff.next(), Duration::from_millis(200));
/// assert_eq!(backoff.next(), Duration::from_millis(300));
/// // Equal jitter: between half and all of the step, the fraction placing it.
/// assert_eq!(backoff.next_jittered(0.5), Duration::from_millis(225));
/// backoff.reset();
/// assert_eq!(backoff.next(), Duration::from_millis(100));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// Starts at `initial`, doubles up to `max` (`initial` when `max` is below it).
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            current: initial,
        }
    }

    /// The delay before the next try; the one after it doubles (up to the maximum).
    #[allow(clippy::should_implement_trait)] // an endless sequence, not an iterator to collect
    pub fn next(&mut self) -> Duration {
        let step = self.current;
        self.current = self.current.saturating_mul(2).min(self.max);
        step
    }

    /// [`Backoff::next`] with equal jitter (see [`equal_jitter`]), so that processes that
    /// failed together do not retry in lockstep.
    pub fn next_jittered(&mut self, fraction: f64) -> Duration {
        equal_jitter(self.next(), fraction)
    }

    /// What [`Backoff::next`] returns next, without moving on.
    pub fn peek(&self) -> Duration {
        self.current
    }

    /// Back to the first delay, after a success.
    pub fn reset(&mut self) {
        self.current = self.initial;
    }

    /// The step after `failures` consecutive failures (1 or more): `initial × 2^(failures − 1)`,
    /// capped at `max`. For retries counted in a database rather than held in a loop.
    pub fn step(initial: Duration, max: Duration, failures: u32) -> Duration {
        let exponent = failures.clamp(1, 32) - 1;
        initial
            .checked_mul(2u32.saturating_pow(exponent))
            .unwrap_or(max)
            .min(max)
    }
}

/// Between half of `full` and all of it, `fraction` (in `[0, 1)`, clamped) placing it: "equal
/// jitter", which keeps at least half of the wait while spreading retries apart.
pub fn equal_jitter(full: Duration, fraction: f64) -> Duration {
    let fraction = if fraction.is_nan() {
        0.0
    } else {
        fraction.clamp(0.0, 1.0)
    };
    let half = full / 2;
    half + half.mul_f64(fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn steps_double_up_to_the_cap_whatever_the_count() {
        assert_eq!(Backoff::step(200 * MS, 30_000 * MS, 0), 200 * MS);
        assert_eq!(Backoff::step(200 * MS, 30_000 * MS, 1), 200 * MS);
        assert_eq!(Backoff::step(200 * MS, 30_000 * MS, 3), 800 * MS);
        assert_eq!(Backoff::step(200 * MS, 30_000 * MS, 8), 25_600 * MS);
        assert_eq!(Backoff::step(200 * MS, 30_000 * MS, 9), 30_000 * MS);
        assert_eq!(Backoff::step(200 * MS, 30_000 * MS, u32::MAX), 30_000 * MS);
        let huge = Duration::from_secs(u64::MAX / 4);
        assert_eq!(Backoff::step(huge, Duration::MAX, 40), Duration::MAX);
    }

    #[test]
    fn a_loop_doubles_caps_and_resets() {
        let mut b = Backoff::new(50 * MS, 2_000 * MS);
        let steps: Vec<_> = (0..8).map(|_| b.next()).collect();
        assert_eq!(
            steps,
            [50, 100, 200, 400, 800, 1_600, 2_000, 2_000].map(|n| n * MS)
        );
        b.reset();
        assert_eq!(b.peek(), 50 * MS);
        assert_eq!(b.next(), 50 * MS);
        assert_eq!(b.peek(), 100 * MS);
        // A cap below the start is the start.
        let mut flat = Backoff::new(100 * MS, MS);
        assert_eq!((flat.next(), flat.next()), (100 * MS, 100 * MS));
        // No overflow however long it runs.
        let mut long = Backoff::new(Duration::from_secs(u64::MAX / 2), Duration::MAX);
        for _ in 0..4 {
            long.next();
        }
        assert_eq!(long.next(), Duration::MAX);
    }

    #[test]
    fn equal_jitter_keeps_between_half_and_all() {
        assert_eq!(equal_jitter(1_000 * MS, 0.0), 500 * MS);
        assert_eq!(equal_jitter(1_000 * MS, 0.5), 750 * MS);
        assert_eq!(equal_jitter(1_000 * MS, 2.0), 1_000 * MS);
        assert_eq!(equal_jitter(1_000 * MS, -1.0), 500 * MS);
        assert_eq!(equal_jitter(1_000 * MS, f64::NAN), 500 * MS);
    }
}
