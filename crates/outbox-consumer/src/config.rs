use std::time::Duration;

use rand::Rng;

/// How a consumer retries and names itself. The name is its key in the inbox: two consumers
/// with different names both apply every event; two instances with one name share the work.
#[derive(Clone, Debug)]
pub struct ConsumerConfig {
    /// Consumer name (inbox key, durable consumer name). Required.
    pub name: String,
    /// Deliveries before a failing message is dead-lettered (default 5).
    pub max_attempts: u32,
    /// Delay before the second delivery (default 500ms); doubles per attempt, with jitter.
    pub initial_backoff: Duration,
    /// Longest delay between deliveries (default 30s).
    pub max_backoff: Duration,
    /// Aggregates handled at once (default 16). Each aggregate's messages still run one after
    /// another, in the order received. RabbitMQ: also bounded by the source's prefetch.
    pub concurrency: usize,
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
        }
    }

    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), crate::Error> {
        let valid_name = !self.name.is_empty()
            && self.name.len() <= 200
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid_name {
            return Err(crate::Error::Config(
                "name: must be 1-200 ASCII letters, digits, '_' or '-'".into(),
            ));
        }
        if self.max_attempts == 0 {
            return Err(crate::Error::Config(
                "max_attempts: must be 1 or more".into(),
            ));
        }
        if self.concurrency == 0 {
            return Err(crate::Error::Config(
                "concurrency: must be 1 or more".into(),
            ));
        }
        if self.initial_backoff.is_zero() || self.max_backoff < self.initial_backoff {
            return Err(crate::Error::Config(
                "initial_backoff/max_backoff: need 0 < initial_backoff <= max_backoff".into(),
            ));
        }
        Ok(())
    }

    /// Delay before the next delivery after `attempts` failed ones, with equal jitter.
    pub fn backoff(&self, attempts: u32) -> Duration {
        let exponent = attempts.clamp(1, 31) - 1;
        let full = self
            .initial_backoff
            .checked_mul(2u32.saturating_pow(exponent))
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff);
        full / 2 + rand::rng().random_range(Duration::ZERO..=full / 2)
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
        let c = ConsumerConfig::new("x");
        let d = c.backoff(3);
        assert!(
            d >= Duration::from_secs(1) && d <= Duration::from_secs(2),
            "{d:?}"
        );
        assert!(c.backoff(40) <= c.max_backoff);
    }
}
