//! The span a runner handles one delivery in: `process {destination}`, kind `CONSUMER`, with the
//! OpenTelemetry messaging attributes. With cargo feature `otel` (on by default) and an
//! OpenTelemetry layer in the application's `tracing` subscriber, the span continues the trace
//! the message carries (its `traceparent`/`tracestate` headers: the relay's publish span), so the
//! inbox check, the handler and the commit, and every event the handler writes through the
//! outbox (a saga's commands), belong to the writer's trace.

use tracing::Span;

use crate::Envelope;

/// The span of handling `event` for `consumer`, received through `system` (`nats`, `rabbitmq`,
/// `kafka`).
pub(crate) fn delivery_span(system: &'static str, consumer: &str, event: &Envelope) -> Span {
    let span = tracing::info_span!(
        "process",
        otel.name = %format_args!("process {}", event.destination),
        otel.kind = "consumer",
        messaging.system = system,
        messaging.operation.type = "process",
        messaging.destination.name = %event.destination,
        messaging.consumer.group.name = consumer,
        messaging.message.id = %event.message_id,
        outbox.event.type = %event.event_type,
        otel.status_code = tracing::field::Empty,
    );
    #[cfg(feature = "otel")]
    continue_trace(&span, &event.headers);
    span
}

/// Makes `span` a child of the context in `headers`, when they carry one.
#[cfg(feature = "otel")]
fn continue_trace(span: &Span, headers: &outbox::Headers) {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    let parent = outbox::otel::context_of(headers);
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

/// Records on `span` how handling ended: an error status when it failed.
pub(crate) fn record_result<T, E: std::fmt::Display>(span: &Span, result: &Result<T, E>) {
    if result.is_err() {
        span.record("otel.status_code", "ERROR");
    }
}
