//! OpenTelemetry traces of the relay (cargo feature `otel`).
//!
//! Each published event gets one `PRODUCER` span, `send {destination}`, in the writer's trace:
//! its parent is the row's `traceparent` header (written by `enqueue` inside the writer's span,
//! or by hand in plain SQL). The broker message carries the span's own context in its
//! `traceparent`/`tracestate` headers, so the consumer's span becomes its child. The same code
//! runs for every publisher and for both sources (polling and CDC): it wraps the one publish
//! step they share.
//!
//! Spans are made only once [`enable`] has given the relay a tracer (the `outbox` binary does
//! when `OTEL_EXPORTER_OTLP_ENDPOINT` is set). Until then a publish pays one atomic load.

use std::{
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::Duration,
};

use opentelemetry::{
    trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _},
    Context, KeyValue,
};
use opentelemetry_sdk::{
    error::OTelSdkResult,
    trace::{
        BatchConfigBuilder, BatchSpanProcessor, SpanData, SpanExporter, SpanProcessor, Tracer,
    },
    Resource,
};
use prometheus_client::metrics::counter::Counter;

use crate::{publisher::PublishError, telemetry::Metrics, wire::message::Message};

static TRACER: OnceLock<Tracer> = OnceLock::new();

/// Makes the relays of this process trace every publish with `tracer` (see the module docs).
/// Returns `false`, and changes nothing, when a tracer was given before.
pub fn enable(tracer: Tracer) -> bool {
    TRACER.set(tracer).is_ok()
}

/// Whether publishes are traced.
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

/// The span of one publish, open until [`Publishing::finish`].
pub(crate) struct Publishing {
    cx: Context,
}

/// Starts the span of publishing `message` through the publisher named `publisher`, and returns
/// it with the message to send: `message` with the span's context in its trace headers. `None`
/// when tracing is off, and when the sampler records no span for a message that carries no
/// trace (`OTEL_TRACES_SAMPLER=parentbased_always_off` traces only what the writer traced, at
/// next to no cost for the rest).
pub(crate) fn start(publisher: &'static str, message: &Message) -> Option<(Publishing, Message)> {
    let tracer = TRACER.get()?;
    if Pause::resting_anywhere() {
        // The collector failed: no span is made while exports rest. The message keeps the
        // writer's context, so the consumer's span still joins the writer's trace.
        if let Some(unexported) = UNEXPORTED.get() {
            unexported.inc();
        }
        return None;
    }
    let parent = outbox::otel::context_of(&message.headers);
    let traced_by_writer = parent.span().span_context().is_valid();
    // The attributes are made only for a span that records them.
    let span = tracer
        .span_builder(format!("send {}", message.destination))
        .with_kind(SpanKind::Producer)
        .start_with_context(tracer, &parent);
    if !span.is_recording() && !traced_by_writer {
        return None;
    }
    let cx = parent.with_span(span);
    if cx.span().is_recording() {
        // The event id differs from the message id only on a fan-out copy.
        let fan_out_copy = (message.message_id != message.event_id)
            .then(|| KeyValue::new("outbox.event.id", message.event_id.to_string()));
        cx.span().set_attributes(
            [
                KeyValue::new("messaging.system", system(publisher)),
                KeyValue::new("messaging.operation.type", "send"),
                KeyValue::new("messaging.operation.name", "publish"),
                KeyValue::new("messaging.destination.name", message.destination.clone()),
                KeyValue::new("messaging.message.id", message.message_id.to_string()),
                KeyValue::new("outbox.event.type", message.event_type.clone()),
                KeyValue::new("outbox.aggregate.type", message.aggregate_type.clone()),
                KeyValue::new("outbox.aggregate.id", message.aggregate_id.clone()),
                KeyValue::new("outbox.attempt", i64::from(message.attempts) + 1),
            ]
            .into_iter()
            .chain(fan_out_copy),
        );
    }
    let mut traced = message.clone();
    outbox::otel::inject(&cx, &mut traced.headers);
    Some((Publishing { cx }, traced))
}

impl Publishing {
    /// Ends the span with the publish's result.
    pub(crate) fn finish(self, result: Result<(), &PublishError>) {
        let span = self.cx.span();
        if let Err(error) = result {
            span.set_attribute(KeyValue::new(
                "error.type",
                if error.is_transient() {
                    "transient"
                } else {
                    "permanent"
                },
            ));
            span.set_status(Status::error(error.to_string()));
        }
        span.end();
    }
}

/// The `messaging.system` of a publisher: the semantic conventions' name where they have one.
fn system(publisher: &'static str) -> &'static str {
    match publisher {
        "sqs" => "aws_sqs",
        other => other,
    }
}

/// The span processor the relay exports through: the SDK's batch processor (a thread of its own,
/// batches of `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` every `OTEL_BSP_SCHEDULE_DELAY`), behind a
/// bound of `OTEL_BSP_MAX_QUEUE_SIZE` spans waiting for export (2,048 by default). Past the
/// bound a span is dropped and counted (`outbox_trace_spans_dropped_total`): an exporter that is
/// slow or whose endpoint is dead never holds publishing up, and never grows the relay's memory.
/// Spans of a batch the collector does not take are counted too
/// (`outbox_trace_spans_unexported_total`), and the failure is logged at WARN (the first, then
/// every 2^k-th).
#[derive(Debug)]
pub struct BoundedQueue {
    inner: BatchSpanProcessor,
    waiting: Arc<AtomicUsize>,
    capacity: usize,
    dropped: Counter,
}

impl BoundedQueue {
    /// Exports through `exporter`, counting in `metrics`.
    pub fn new<E: SpanExporter + 'static>(exporter: E, metrics: &Metrics) -> Self {
        let capacity = env_usize("OTEL_BSP_MAX_QUEUE_SIZE", 2_048);
        let batch = env_usize("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512);
        Self::with_capacity(exporter, metrics, capacity, batch)
    }

    /// At most `capacity` spans waiting, exported in batches of up to `batch`.
    pub fn with_capacity<E: SpanExporter + 'static>(
        exporter: E,
        metrics: &Metrics,
        capacity: usize,
        batch: usize,
    ) -> Self {
        let capacity = capacity.max(1);
        let batch = batch.clamp(1, capacity);
        let _ = UNEXPORTED.set(metrics.trace_spans_unexported.clone());
        let waiting = Arc::new(AtomicUsize::new(0));
        // The SDK's own queue has room for every span this bound lets through and the batch
        // being gathered, so that it never drops one itself, uncounted.
        let config = BatchConfigBuilder::default()
            .with_max_queue_size(capacity + batch)
            .with_max_export_batch_size(batch)
            .build();
        let inner = BatchSpanProcessor::builder(Counted {
            inner: exporter,
            waiting: waiting.clone(),
            unexported: metrics.trace_spans_unexported.clone(),
            failures: Arc::default(),
            pause: Arc::default(),
        })
        .with_batch_config(config)
        .build();
        Self {
            inner,
            waiting,
            capacity,
            dropped: metrics.trace_spans_dropped.clone(),
        }
    }
}

impl SpanProcessor for BoundedQueue {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.waiting.fetch_add(1, Ordering::Relaxed) >= self.capacity {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            self.dropped.inc();
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter behind [`BoundedQueue`]: a batch handed to it no longer waits; a batch it
/// could not export is counted and logged.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    waiting: Arc<AtomicUsize>,
    unexported: Counter,
    failures: Arc<AtomicU64>,
    pause: Arc<Mutex<Pause>>,
}

/// How long exports rest after a collector failed: 1 s, doubling to 30 s; a success ends it.
/// While they rest, batches already made are counted, not sent, and no publish makes a span
/// ([`start`] reads the process-wide deadline: the relay has one exporter).
#[derive(Debug)]
struct Pause {
    backoff: outbox::backoff::Backoff,
    until: Option<std::time::Instant>,
}

impl Default for Pause {
    fn default() -> Self {
        Self {
            backoff: outbox::backoff::Backoff::new(Self::FIRST, Self::LONGEST),
            until: None,
        }
    }
}

/// Until when exports rest, in milliseconds since [`CLOCK`]'s start; 0 when they do not.
static RESTING_UNTIL: AtomicU64 = AtomicU64::new(0);
static CLOCK: OnceLock<std::time::Instant> = OnceLock::new();
/// The counter of spans not exported, for the spans [`start`] does not make while exports rest.
static UNEXPORTED: OnceLock<Counter> = OnceLock::new();

impl Pause {
    const FIRST: Duration = Duration::from_secs(1);
    const LONGEST: Duration = Duration::from_secs(30);

    fn now() -> u64 {
        let clock = CLOCK.get_or_init(std::time::Instant::now);
        u64::try_from(clock.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether the exports of any queue in this process rest.
    fn resting_anywhere() -> bool {
        Self::now() < RESTING_UNTIL.load(Ordering::Relaxed)
    }

    /// Whether this queue's exports rest.
    fn resting(&self) -> bool {
        self.until
            .is_some_and(|until| std::time::Instant::now() < until)
    }

    fn failed(&mut self) {
        let rest = self.backoff.next();
        self.until = Some(std::time::Instant::now() + rest);
        let until = Self::now().saturating_add(rest.as_millis() as u64);
        RESTING_UNTIL.store(until, Ordering::Relaxed);
    }

    fn reset(&mut self) {
        *self = Self::default();
        RESTING_UNTIL.store(0, Ordering::Relaxed);
    }
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let spans = batch.len();
        self.waiting.fetch_sub(spans, Ordering::Relaxed);
        // While a collector that failed is given time (1 s, doubling to 30 s), batches are
        // counted, not encoded and sent: a dead endpoint costs the relay next to nothing.
        let pausing = self.pause.lock().expect("not poisoned").resting();
        let export = (!pausing).then(|| self.inner.export(batch));
        let (unexported, failures, pause) = (
            self.unexported.clone(),
            self.failures.clone(),
            self.pause.clone(),
        );
        async move {
            let Some(export) = export else {
                unexported.inc_by(spans as u64);
                return Ok(());
            };
            let result = export.await;
            let mut pause = pause.lock().expect("not poisoned");
            match &result {
                Ok(()) => pause.reset(),
                Err(error) => {
                    pause.failed();
                    unexported.inc_by(spans as u64);
                    let n = failures.fetch_add(1, Ordering::Relaxed) + 1;
                    if n.is_power_of_two() {
                        // The HTTP client's error quotes the endpoint, password and all.
                        let error = crate::redact::urls_in(&error.to_string());
                        tracing::warn!(%error, spans, failures = n,
                            "OpenTelemetry: the collector did not take a batch of spans \
                             (outbox_trace_spans_unexported_total); publishing goes on");
                    }
                }
            }
            result
        }
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// A positive integer from the environment variable `name`, else `default`.
fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use std::sync::{Condvar, Mutex};

    use opentelemetry::trace::{Span as _, TracerProvider as _};
    use opentelemetry_sdk::trace::SdkTracerProvider;

    use super::*;

    /// An exporter whose exports wait until `open`, counting the spans it was given.
    #[derive(Debug, Clone, Default)]
    struct Stuck(Arc<(Mutex<(bool, usize)>, Condvar)>);

    impl Stuck {
        fn open(&self) {
            self.0 .0.lock().unwrap().0 = true;
            self.0 .1.notify_all();
        }
        fn exported(&self) -> usize {
            self.0 .0.lock().unwrap().1
        }
    }

    impl SpanExporter for Stuck {
        fn export(
            &self,
            batch: Vec<SpanData>,
        ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
            let (lock, opened) = &*self.0;
            let mut state = lock.lock().unwrap();
            while !state.0 {
                state = opened.wait(state).unwrap();
            }
            state.1 += batch.len();
            std::future::ready(Ok(()))
        }
    }

    #[test]
    fn a_stuck_exporter_costs_dropped_spans_never_a_wait() {
        let exporter = Stuck::default();
        let metrics = Metrics::new();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BoundedQueue::with_capacity(
                exporter.clone(),
                &metrics,
                8,
                1,
            ))
            .build();
        let tracer = provider.tracer("test");
        // The exporter holds its first batch: 8 more spans wait, every further one is dropped
        // (a span ended while the thread takes the next one may be the ninth to wait).
        for _ in 0..100 {
            tracer.start("send").end();
        }
        let lost = metrics.trace_spans_dropped.get();
        assert!((90..=92).contains(&lost), "dropped {lost}");
        exporter.open();
        provider.force_flush().unwrap();
        assert_eq!(
            exporter.exported() as u64 + lost,
            100,
            "every span exported or counted"
        );
    }

    /// An exporter whose collector refuses every batch.
    #[derive(Debug)]
    struct Refused;

    impl SpanExporter for Refused {
        fn export(
            &self,
            _batch: Vec<SpanData>,
        ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
            std::future::ready(Err(
                opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                    "connection refused".into(),
                ),
            ))
        }
    }

    #[test]
    fn spans_a_collector_refuses_are_counted() {
        let metrics = Metrics::new();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BoundedQueue::with_capacity(Refused, &metrics, 64, 4))
            .build();
        let tracer = provider.tracer("test");
        for _ in 0..10 {
            tracer.start("send").end();
        }
        let _ = provider.force_flush();
        assert_eq!(metrics.trace_spans_unexported.get(), 10);
        assert_eq!(metrics.trace_spans_dropped.get(), 0);
    }
}
