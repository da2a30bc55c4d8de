//! Waiting out a database outage with the message in hand: the runner retries the same message
//! until the database answers, so an outage spends none of its attempts and dead-letters nothing.

use std::{future::Future, time::Duration};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{Envelope, HandlerError, Outcome, Processor};

/// The first wait after an infrastructure failure; doubles up to [`LONGEST_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(200);
/// The longest wait between two tries during an outage.
const LONGEST_WAIT: Duration = Duration::from_secs(5);

/// [`Processor::apply`] in the delivery's span ([`crate::trace`]), received through `system`,
/// repeated while it fails on the infrastructure. Between tries it waits (at most
/// `longest_wait`, capped at 5 s) and calls `keep` (a runner extends the message's ack deadline
/// there). Returns the first result that is not an infrastructure failure, or the
/// infrastructure failure itself when `shutdown` fires.
pub(crate) async fn apply<K, F>(
    system: &'static str,
    processor: &Processor,
    event: &Envelope,
    shutdown: &CancellationToken,
    longest_wait: Duration,
    keep: K,
) -> Result<Outcome, HandlerError>
where
    K: FnMut() -> F,
    F: Future<Output = ()>,
{
    let span = crate::trace::delivery_span(system, processor.name(), event);
    let result = retrying(processor, event, shutdown, longest_wait, keep)
        .instrument(span.clone())
        .await;
    crate::trace::record_result(&span, &result);
    result
}

async fn retrying<K, F>(
    processor: &Processor,
    event: &Envelope,
    shutdown: &CancellationToken,
    longest_wait: Duration,
    mut keep: K,
) -> Result<Outcome, HandlerError>
where
    K: FnMut() -> F,
    F: Future<Output = ()>,
{
    let longest = longest_wait.clamp(Duration::from_millis(10), LONGEST_WAIT);
    let mut wait = FIRST_WAIT.min(longest);
    let mut tries = 0u32;
    loop {
        match processor.apply(event).await {
            Err(error) if error.is_infrastructure() => {
                tries += 1;
                // One line when the outage starts, then one every 2^k tries: loud enough to
                // see, quiet enough for a long outage.
                if tries.is_power_of_two() {
                    tracing::warn!(%error, tries, consumer = processor.name(),
                        event_id = %event.event_id,
                        "database unreachable: holding the message and retrying");
                }
                tokio::select! {
                    () = shutdown.cancelled() => return Err(error),
                    () = tokio::time::sleep(wait) => {}
                }
                keep().await;
                wait = (wait * 2).min(longest);
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
