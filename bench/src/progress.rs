//! Progress of a draining backlog, from the pending counts polled while it drains.

use std::time::{Duration, Instant};

use crate::{
    common::{Result, Scope},
    context::Bench,
};

/// Throughput at the start and at the end of a drain, from the pending counts polled during it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    total: i64,
    /// First poll at or under three quarters of the backlog: (elapsed, events done).
    early: Option<(Duration, i64)>,
    /// First poll at or under a quarter of the backlog: (elapsed, events left).
    late: Option<(Duration, i64)>,
    /// Pending-count polls made, and the time they took.
    polls: u32,
    poll_time: Duration,
    /// The last pending count.
    last: i64,
}

/// With `--light-poll`, one poll in this many counts; the others only ask whether any event is
/// pending.
const COUNT_EVERY: u32 = 8;

impl Progress {
    /// Tracks the drain of `total` events.
    pub fn new(total: u64) -> Self {
        Self {
            total: total as i64,
            ..Default::default()
        }
    }

    /// Records a poll: `pending` events left `elapsed` after the start.
    pub fn observe(&mut self, elapsed: Duration, pending: i64) {
        if self.early.is_none() && pending * 4 <= self.total * 3 {
            self.early = Some((elapsed, self.total - pending));
        }
        if self.late.is_none() && pending * 4 <= self.total {
            self.late = Some((elapsed, pending));
        }
    }

    /// Polls the pending count, records it `elapsed` after the start and returns it. With
    /// `--light-poll`, only every 8th poll counts; the others ask whether any event is pending
    /// and return the last count (or 0).
    pub async fn poll(&mut self, bench: &Bench, scope: &Scope, elapsed: Duration) -> Result<i64> {
        let started = Instant::now();
        let count = !bench.options.light_poll || self.polls.is_multiple_of(COUNT_EVERY);
        let pending = if count {
            let n = bench.pending(scope).await?;
            self.observe(elapsed, n);
            self.last = n;
            n
        } else if bench.any_pending(scope).await? {
            self.last.max(1)
        } else {
            0
        };
        self.polls += 1;
        self.poll_time += started.elapsed();
        Ok(pending)
    }

    /// Polls made and the time they took in total.
    pub fn polls(&self) -> (u32, Duration) {
        (self.polls, self.poll_time)
    }

    /// Events/s over the first quarter (or a little more) of the backlog.
    pub fn early_rate(&self) -> Option<f64> {
        self.early
            .filter(|(t, _)| !t.is_zero())
            .map(|(t, done)| done as f64 / t.as_secs_f64())
    }

    /// Events/s over the last quarter (or a little less) of the backlog, which ended at `end`.
    pub fn late_rate(&self, end: Duration) -> Option<f64> {
        self.late
            .filter(|(t, left)| *t < end && *left > 0)
            .map(|(t, left)| left as f64 / (end - t).as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_measures_the_first_and_last_quarters() {
        let mut p = Progress::new(1000);
        p.observe(Duration::from_secs(1), 900);
        p.observe(Duration::from_secs(2), 700);
        p.observe(Duration::from_secs(6), 200);
        p.observe(Duration::from_secs(10), 0);
        assert_eq!(p.early_rate(), Some(150.0));
        assert_eq!(p.late_rate(Duration::from_secs(10)), Some(50.0));
        assert_eq!(Progress::new(10).early_rate(), None);
    }
}
