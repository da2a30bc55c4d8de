//! The writer's trace context (cargo feature `otel`, on by default): `enqueue` stores the
//! current `tracing` span's OpenTelemetry context as W3C `traceparent`/`tracestate` headers, so
//! the relay's publish span and the consumer's span join the writer's trace. The context is
//! read through `tracing-opentelemetry` (its `OpenTelemetryLayer` in the application's
//! subscriber, from the same major version as this crate's); without one nothing is added.

use opentelemetry::{
    propagation::{Extractor, Injector, TextMapPropagator},
    trace::TraceContextExt,
    Context,
};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::headers::Headers;

/// The header that carries the trace context (W3C Trace Context).
pub const TRACEPARENT: &str = "traceparent";
/// The header that carries vendor trace state beside it.
pub const TRACESTATE: &str = "tracestate";

/// `headers` with the current span's trace context added, or `None` when they carry a
/// `traceparent` already (the writer's own choice wins) or no span is being traced.
pub(crate) fn with_current_trace(headers: &Headers) -> Option<Headers> {
    if headers.contains_key(TRACEPARENT) {
        return None;
    }
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut traced = headers.clone();
    inject(&cx, &mut traced);
    Some(traced)
}

/// The trace context `headers` carry (`traceparent`, `tracestate`); an empty context when
/// they carry none or a malformed one.
pub fn context_of(headers: &Headers) -> Context {
    TraceContextPropagator::new().extract(&Reader(headers))
}

/// Writes `cx`'s span context into `headers` as `traceparent` (and `tracestate` when it has
/// one), replacing the ones there.
pub fn inject(cx: &Context, headers: &mut Headers) {
    headers.remove(TRACESTATE);
    TraceContextPropagator::new().inject_context(cx, &mut Writer(headers));
}

struct Reader<'a>(&'a Headers);

impl Extractor for Reader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

struct Writer<'a>(&'a mut Headers);

impl Injector for Writer<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// Runs `f` under a subscriber with an OpenTelemetry layer; returns its result and the trace
    /// id of the span `f` runs in.
    fn in_a_traced_span<T>(f: impl FnOnce() -> T) -> (T, String) {
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("write");
            let trace = span.context().span().span_context().trace_id().to_string();
            (span.in_scope(f), trace)
        })
    }

    #[test]
    fn the_current_span_is_stored_as_traceparent() {
        let (headers, trace) = in_a_traced_span(|| with_current_trace(&Headers::new()));
        let headers = headers.expect("a traced span adds its context");
        let parts: Vec<&str> = headers[TRACEPARENT].split('-').collect();
        assert_eq!(parts.len(), 4, "{headers:?}");
        assert_eq!((parts[0], parts[1], parts[3]), ("00", trace.as_str(), "01"));
    }

    #[test]
    fn a_writers_own_traceparent_is_kept() {
        let own = Headers::from([(
            TRACEPARENT.to_owned(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        )]);
        let (headers, _) = in_a_traced_span(|| with_current_trace(&own));
        assert_eq!(headers, None);
    }

    #[test]
    fn a_context_read_from_headers_is_written_back_the_same() {
        let sent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let headers = Headers::from([
            (TRACEPARENT.to_owned(), sent.to_owned()),
            (TRACESTATE.to_owned(), "vendor=1".to_owned()),
        ]);
        let cx = context_of(&headers);
        assert!(cx.span().span_context().is_remote());
        let mut out = Headers::from([(TRACESTATE.to_owned(), "stale=1".to_owned())]);
        inject(&cx, &mut out);
        assert_eq!(out, headers);
        let garbage = Headers::from([(TRACEPARENT.to_owned(), "00-zz".to_owned())]);
        assert!(!context_of(&garbage).span().span_context().is_valid());
    }

    #[test]
    fn nothing_is_added_outside_a_traced_span() {
        assert_eq!(with_current_trace(&Headers::new()), None);
        let untraced = tracing_subscriber::registry();
        let headers = tracing::subscriber::with_default(untraced, || {
            tracing::info_span!("write").in_scope(|| with_current_trace(&Headers::new()))
        });
        assert_eq!(headers, None);
    }
}
