//! Waiting out a database outage with the message in hand: the runner retries the same step
//! until the database answers, so an outage spends none of the message's attempts and
//! dead-letters nothing.

use std::{future::Future, time::Duration};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{Envelope, HandlerError, Processor};

/// The first wait after an infrastructure failure; doubles up to [`LONGEST_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(200);
/// The longest wait between two tries during an outage.
const LONGEST_WAIT: Duration = Duration::from_secs(5);

/// `step` (applying or holding `event`) in the delivery's span ([`crate::trace`]), received
/// through `system`, repeated while it fails on the infrastructure. Between tries it waits (at
/// most `longest_wait`, capped at 5 s) and calls `keep` (a runner extends the message's ack
/// deadline there). Returns the first result that is not an infrastructure failure, or the
/// infrastructure failure itself when `shutdown` fires or `current` says the message is no
/// longer this runner's.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn retrying<T, S, SF, K, KF>(
    system: &'static str,
    what: &'static str,
    processor: &Processor,
    event: &Envelope,
    shutdown: &CancellationToken,
    longest_wait: Duration,
    current: impl Fn() -> bool,
    mut keep: K,
    mut step: S,
) -> Result<T, HandlerError>
where
    S: FnMut() -> SF,
    SF: Future<Output = Result<T, HandlerError>>,
    K: FnMut() -> KF,
    KF: Future<Output = ()>,
{
    let span = crate::trace::delivery_span(system, processor.name(), event);
    let result = async {
        let longest = longest_wait.clamp(Duration::from_millis(10), LONGEST_WAIT);
        let mut backoff = outbox::backoff::Backoff::new(FIRST_WAIT.min(longest), longest);
        let mut tries = 0u32;
        loop {
            match step().await {
                Err(error) if error.is_infrastructure() => {
                    tries += 1;
                    // One line when the outage starts, then one every 2^k tries: loud enough
                    // to see, quiet enough for a long outage.
                    if tries.is_power_of_two() {
                        tracing::warn!(%error, tries, what, consumer = processor.name(),
                            event_id = %event.event_id,
                            "database unreachable: holding the message and retrying");
                    }
                    tokio::select! {
                        () = shutdown.cancelled() => return Err(error),
                        () = tokio::time::sleep(backoff.next()) => {}
                    }
                    if !current() {
                        return Err(error);
                    }
                    keep().await;
                }
                other => {
                    if tries > 0 {
                        tracing::info!(tries, consumer = processor.name(),
                            event_id = %event.event_id, "database answers again");
                    }
                    return other;
                }
            }
        }
    }
    .instrument(span.clone())
    .await;
    crate::trace::record_result(&span, &result);
    result
}
