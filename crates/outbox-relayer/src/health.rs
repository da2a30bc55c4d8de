//! Whether the relay is ready: the progress markers its stages update, read by `/readyz`
//! ([`crate::http`]) and exported as `outbox_ready` and `outbox_unready{reason}`.
//!
//! A relay is ready while it makes progress on the work it owns. It is not ready, each after
//! `stall_timeout`, when:
//! - `database`: no relay statement has succeeded for that long;
//! - `loop`: the relay loop has not turned for that long (a statement or publish that never
//!   returns; the lease task then stops renewing, so that another relay takes over);
//! - `claim`: events are pending and this relay's claims have not succeeded for that long
//!   (failing, or blocked behind a lock, until `statement_timeout` / `lock_timeout`);
//! - `stalled`: this relay found work within that time yet published (or dead-lettered)
//!   nothing for that long: broker down, every attempt failing;
//! - `lease`: events are pending and the lease heartbeat has failed for that long: the relay
//!   can neither keep nor take a partition (its reads may still succeed: a server that refuses
//!   its writes).
//!
//! An idle relay, or a standby that owns no partition, is ready.

use std::{sync::Mutex, time::Duration};

use tokio::time::Instant;

/// Progress markers the relay updates and readiness reads.
#[derive(Debug)]
pub struct Health {
    stall_timeout: Duration,
    inner: Mutex<Marks>,
}

#[derive(Debug)]
struct Marks {
    progress: Instant,
    work_seen: Option<Instant>,
    database_ok: Instant,
    loop_turned: Instant,
    /// Since when the relay has wanted a claim answered and has had none (`None`: the last
    /// claim succeeded, or the relay has nothing to claim from).
    claim_waiting: Option<Instant>,
    /// Events pending in the outbox at the last backlog sample.
    pending: i64,
    /// Why the broker cannot be reached, while it cannot (`None`: reachable, or not probed).
    broker_unreachable: Option<String>,
    /// Since when the lease heartbeat has failed (`None`: its last round succeeded).
    lease_failing: Option<Instant>,
}

/// Why a relay is not ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotReady {
    /// One word, the `reason` label of `outbox_unready`: one of
    /// [`crate::telemetry::UNREADY_REASONS`].
    pub reason: &'static str,
    /// What `/readyz` says.
    pub message: String,
}

impl Health {
    /// Fresh markers: ready until proven otherwise.
    pub fn new(stall_timeout: Duration) -> Self {
        let now = Instant::now();
        Self {
            stall_timeout,
            inner: Mutex::new(Marks {
                progress: now,
                work_seen: None,
                database_ok: now,
                loop_turned: now,
                claim_waiting: None,
                pending: 0,
                broker_unreachable: None,
                lease_failing: None,
            }),
        }
    }

    fn marks(&self) -> std::sync::MutexGuard<'_, Marks> {
        self.inner.lock().expect("not poisoned")
    }

    /// Events were published or dead-lettered.
    pub fn progressed(&self) {
        self.marks().progress = Instant::now();
    }

    /// A claim found pending events.
    pub fn saw_work(&self) {
        self.marks().work_seen = Some(Instant::now());
    }

    /// A database statement succeeded.
    pub fn database_ok(&self) {
        self.marks().database_ok = Instant::now();
    }

    /// The relay loop turned (it is not stuck in a call that never returns).
    pub fn loop_turned(&self) {
        self.marks().loop_turned = Instant::now();
    }

    /// The relay is about to claim: it waits for an answer from now, unless it already was.
    pub fn claim_started(&self) {
        self.marks().claim_waiting.get_or_insert_with(Instant::now);
    }

    /// A claim succeeded, or the relay has nothing to claim from (no partition): it is not
    /// waiting for a claim.
    pub fn claim_done(&self) {
        self.marks().claim_waiting = None;
    }

    /// The backlog sample: events pending in the outbox.
    pub fn pending(&self, pending: i64) {
        self.marks().pending = pending;
    }

    /// Whether the broker's server can be reached: `Some(cause)` while it cannot, `None` once
    /// it can. Not ready meanwhile.
    pub fn broker_unreachable(&self, cause: Option<String>) {
        self.marks().broker_unreachable = cause;
    }

    /// A round of the lease heartbeat (renew, acquire) succeeded or failed.
    pub fn lease_round(&self, ok: bool) {
        let mut m = self.marks();
        if ok {
            m.lease_failing = None;
        } else {
            m.lease_failing.get_or_insert_with(Instant::now);
        }
    }

    /// How long the relay loop has gone without turning.
    pub fn loop_silence(&self) -> Duration {
        self.marks().loop_turned.elapsed()
    }

    /// The time after which a missing sign of progress makes the relay not ready.
    pub fn stall_timeout(&self) -> Duration {
        self.stall_timeout
    }

    /// `Ok` when ready, else why not.
    pub fn readiness(&self) -> Result<(), NotReady> {
        let m = self.marks();
        let t = self.stall_timeout;
        let not_ready = |reason, message| Err(NotReady { reason, message });
        // The most specific cause first: a stuck loop also starves the other markers.
        if m.loop_turned.elapsed() > t {
            return not_ready(
                "loop",
                format!(
                    "relay loop stuck for {}s (a call that does not return)",
                    m.loop_turned.elapsed().as_secs()
                ),
            );
        }
        if m.database_ok.elapsed() > t {
            return not_ready(
                "database",
                format!(
                    "database unreachable for {}s (no relay statement succeeded)",
                    m.database_ok.elapsed().as_secs()
                ),
            );
        }
        if let Some(cause) = &m.broker_unreachable {
            return not_ready("broker", format!("broker unreachable: {cause}"));
        }
        if let Some(since) = m.claim_waiting.filter(|s| s.elapsed() > t && m.pending > 0) {
            return not_ready(
                "claim",
                format!(
                    "{} events pending and no claim has succeeded for {}s",
                    m.pending,
                    since.elapsed().as_secs()
                ),
            );
        }
        if let Some(since) = m.lease_failing.filter(|s| s.elapsed() > t && m.pending > 0) {
            return not_ready(
                "lease",
                format!(
                    "{} events pending and the lease heartbeat has failed for {}s (no \
                     partition can be kept or taken)",
                    m.pending,
                    since.elapsed().as_secs()
                ),
            );
        }
        let working = m.work_seen.is_some_and(|w| w.elapsed() < t);
        if working && m.progress.elapsed() > t {
            return not_ready(
                "stalled",
                format!(
                    "stalled: events pending and nothing published for {}s",
                    m.progress.elapsed().as_secs()
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_when_idle_and_not_ready_when_stalled_with_work() {
        let health = Health::new(Duration::from_secs(60));
        let ago = |s| Instant::now() - Duration::from_secs(s);
        // No work seen: an idle relay is ready even after a long time without progress.
        health.marks().progress = ago(600);
        assert!(health.readiness().is_ok());
        health.progressed();
        health.saw_work();
        assert!(health.readiness().is_ok(), "fresh progress marker");
        health.marks().progress = ago(61);
        assert_eq!(health.readiness().unwrap_err().reason, "stalled");
        health.progressed();
        assert!(health.readiness().is_ok());
        health.marks().database_ok = ago(61);
        let not_ready = health.readiness().unwrap_err();
        assert_eq!(not_ready.reason, "database");
        assert!(not_ready.message.contains("database unreachable"));
    }

    #[test]
    fn a_claim_that_gets_no_answer_is_not_ready_only_while_events_are_pending() {
        let health = Health::new(Duration::from_secs(60));
        health.claim_started();
        health.marks().claim_waiting = Some(Instant::now() - Duration::from_secs(61));
        assert!(health.readiness().is_ok(), "nothing pending: no harm done");
        health.pending(7);
        let not_ready = health.readiness().unwrap_err();
        assert_eq!(not_ready.reason, "claim");
        assert!(
            not_ready.message.starts_with("7 events pending"),
            "{not_ready:?}"
        );
        // A later start does not reset the wait; an answer does.
        health.claim_started();
        assert!(health.readiness().is_err());
        health.claim_done();
        assert!(health.readiness().is_ok());
    }

    #[test]
    fn a_lease_heartbeat_failing_with_events_pending_is_not_ready() {
        let health = Health::new(Duration::from_secs(60));
        health.lease_round(false);
        health.marks().lease_failing = Some(Instant::now() - Duration::from_secs(61));
        // Reads still succeed (a server refusing the relay's writes): before, a relay owning no
        // partition was ready as a standby however long its lease writes failed.
        health.database_ok();
        assert!(health.readiness().is_ok(), "nothing pending: a standby");
        health.pending(2);
        let not_ready = health.readiness().unwrap_err();
        assert_eq!(not_ready.reason, "lease");
        assert!(
            not_ready.message.starts_with("2 events pending"),
            "{not_ready:?}"
        );
        // A later failure does not reset the time; a round that succeeds does.
        health.lease_round(false);
        assert!(health.readiness().is_err());
        health.lease_round(true);
        assert!(health.readiness().is_ok());
    }

    #[test]
    fn a_loop_that_does_not_turn_is_not_ready() {
        let health = Health::new(Duration::from_secs(60));
        health.marks().loop_turned = Instant::now() - Duration::from_secs(61);
        assert_eq!(health.readiness().unwrap_err().reason, "loop");
        assert!(health.loop_silence() > Duration::from_secs(60));
        health.loop_turned();
        assert!(health.readiness().is_ok());
    }
}
