use std::time::Duration;

use rand::Rng;

/// The longest `max_backoff`: ten years.
const MAX_BACKOFF: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// How a consumer retries, holds and names itself. The name is its key in the inbox: two
/// consumers with different names both apply every event; two instances with one name share
/// the work.
#[derive(Clone, Debug)]
pub struct ConsumerConfig {
    /// Consumer name (inbox key, durable consumer name). Required.
    pub name: String,
    /// Attempts before a failing message is dead-lettered (default 5). The first is made as
    /// it arrives; the others from the consumer's database, where the message is held
    /// meanwhile (acknowledged to the broker).
    pub max_attempts: u32,
    /// Delay before the second attempt (default 500ms); doubles per attempt, with jitter.
    pub initial_backoff: Duration,
    /// Longest delay between attempts (default 30s, at most 10 years).
    pub max_backoff: Duration,
    /// Aggregates handled at once (default 16). Each aggregate's messages still run one after
    /// another, in the order received.
    pub concurrency: usize,
    /// Messages held in memory at once, running or queued behind their aggregate (default
    /// 256): the runner takes no more from the broker beyond it. NATS: the `max_ack_pending`
    /// of a consumer the runner creates; RabbitMQ: caps the prefetch; Kafka: partitions are
    /// paused while this many are in hand.
    pub max_in_hand: usize,
    /// How often the runner looks for held events that are due (default 1s): a retry whose
    /// backoff passed, an aggregate an operator released. Events held behind an earlier one
    /// are applied as soon as it is, without waiting for this.
    pub sweep_interval: Duration,
    /// Inbox retention run by the runner (default 7 days): this consumer's inbox rows older
    /// than this are deleted (never those of held events). It must be longer than any
    /// redelivery window (broker redelivery, relay retries, dead-letter replays): a row purged
    /// before the last redelivery of its event lets that redelivery apply again, unless the
    /// version gate orders the event. `None`: the inbox is purged by other means.
    pub inbox_retention: Option<Duration>,
    /// How often the inbox retention runs (default 10 min).
    pub purge_interval: Duration,
}

impl ConsumerConfig {
    /// A config with the defaults.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            max_attempts: 5,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            concurrency: 16,
            max_in_hand: 256,
            sweep_interval: Duration::from_secs(1),
            inbox_retention: Some(Duration::from_secs(7 * 24 * 3600)),
            purge_interval: Duration::from_secs(600),
        }
    }

    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), crate::Error> {
        let invalid = |why: &str| Err(crate::Error::Config(why.into()));
        let valid_name = !self.name.is_empty()
            && self.name.len() <= 200
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid_name {
            return invalid("name: must be 1-200 ASCII letters, digits, '_' or '-'");
        }
        if self.max_attempts == 0 {
            return invalid("max_attempts: must be 1 or more");
        }
        if self.concurrency == 0 {
            return invalid("concurrency: must be 1 or more");
        }
        if self.max_in_hand == 0 {
            return invalid("max_in_hand: must be 1 or more");
        }
        if self.initial_backoff.is_zero() || self.max_backoff < self.initial_backoff {
            return invalid("initial_backoff/max_backoff: need 0 < initial_backoff <= max_backoff");
        }
        // The next attempt's time is stored in PostgreSQL, whose timestamps end in the year
        // 294276: a backoff past that could not be recorded, and the event would be retried
        // at every sweep instead.
        if self.max_backoff > MAX_BACKOFF {
            return invalid("max_backoff: must be at most 10 years");
        }
        if self.sweep_interval.is_zero() {
            return invalid("sweep_interval: must be more than 0");
        }
        if self.inbox_retention.is_some_and(|r| r.is_zero()) {
            return invalid("inbox_retention: must be more than 0 (or None)");
        }
        if self.purge_interval.is_zero() {
            return invalid("purge_interval: must be more than 0");
        }
        Ok(())
    }

    /// Whether a message that failed `attempts` times (as its held row counts them) has had
    /// all of them. Compared as counts, whatever their width: `u32::MAX` means never.
    pub(crate) fn attempts_spent(&self, attempts: i32) -> bool {
        i64::from(attempts) >= i64::from(self.max_attempts)
    }

    /// Delay before the next attempt after `attempts` failed ones, with equal jitter.
    pub fn backoff(&self, attempts: u32) -> Duration {
        let full = outbox::backoff::Backoff::step(self.initial_backoff, self.max_backoff, attempts);
        outbox::backoff::equal_jitter(full, rand::rng().random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_and_backs_off() {
        assert!(ConsumerConfig::new("inventory").validate().is_ok());
        let err = ConsumerConfig::new("in ventory").validate().unwrap_err();
        assert!(err.to_string().contains("name"));
        let err = ConsumerConfig {
            max_in_hand: 0,
            ..ConsumerConfig::new("x")
        }
        .validate()
        .unwrap_err();
        assert!(err.to_string().contains("max_in_hand"), "{err}");
        let err = ConsumerConfig {
            inbox_retention: Some(Duration::ZERO),
            ..ConsumerConfig::new("x")
        }
        .validate()
        .unwrap_err();
        assert!(err.to_string().contains("inbox_retention"), "{err}");
        let c = ConsumerConfig::new("x");
        let d = c.backoff(3);
        assert!(
            d >= Duration::from_secs(1) && d <= Duration::from_secs(2),
            "{d:?}"
        );
        assert!(c.backoff(40) <= c.max_backoff);
        let err = ConsumerConfig {
            initial_backoff: Duration::from_secs(20_000_000_000_000),
            max_backoff: Duration::from_secs(20_000_000_000_000),
            ..ConsumerConfig::new("x")
        }
        .validate()
        .unwrap_err();
        assert!(err.to_string().contains("max_backoff"), "{err}");
        assert!(ConsumerConfig {
            max_backoff: MAX_BACKOFF,
            ..ConsumerConfig::new("x")
        }
        .validate()
        .is_ok());
    }

    #[test]
    fn attempts_are_spent_at_the_limit_and_never_past_u32() {
        let five = ConsumerConfig::new("x");
        assert!(!five.attempts_spent(4));
        assert!(five.attempts_spent(5));
        assert!(five.attempts_spent(6));
        // A limit past i32::MAX (u32::MAX: retry for ever) is never reached by a held row's
        // count, which is an i32.
        let never = ConsumerConfig {
            max_attempts: u32::MAX,
            ..ConsumerConfig::new("x")
        };
        assert!(!never.attempts_spent(1));
        assert!(!never.attempts_spent(i32::MAX));
        assert!(!never.attempts_spent(-1));
    }
}
