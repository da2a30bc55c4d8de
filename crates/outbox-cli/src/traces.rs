//! OpenTelemetry trace export of `outbox relay` (cargo feature `otel`, in the default build),
//! configured only by the standard environment variables:
//!
//! - `OTEL_EXPORTER_OTLP_ENDPOINT` (`/v1/traces` is appended) or
//!   `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is): export is on when either is set, and
//!   off (nothing made, nothing sent) otherwise, or with `OTEL_SDK_DISABLED=true` or
//!   `OTEL_TRACES_EXPORTER=none`;
//! - `OTEL_EXPORTER_OTLP_PROTOCOL`: `http/protobuf` (the default, and the one supported);
//! - `OTEL_SERVICE_NAME` (default `outbox-relay`), `OTEL_RESOURCE_ATTRIBUTES`,
//!   `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_TRACES_SAMPLER`,
//!   `OTEL_BSP_*`.
//!
//! Spans go through [`outbox_relayer::otel::BoundedQueue`]: a full queue drops spans (counted in
//! `outbox_trace_spans_dropped_total`), it never slows publishing; a collector that does not
//! take a batch is logged and counted (`outbox_trace_spans_unexported_total`).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::{trace::SdkTracerProvider, Resource};
use outbox_relayer::telemetry::Metrics;

/// The trace export settings read from the environment: `None` when export is off.
#[derive(Debug)]
pub struct Traces {
    service_name: Option<String>,
}

impl Traces {
    /// Reads and checks the variables; the error names the one that is wrong.
    pub fn from_env() -> Result<Option<Self>, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim() == "none")
        {
            return Ok(None);
        }
        if var("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
            && var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
        {
            return Ok(None);
        }
        for name in [
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        ] {
            if let Some(protocol) = var(name) {
                if protocol.trim() != "http/protobuf" {
                    return Err(format!(
                        "{name}={protocol}: this build exports OTLP over http/protobuf only \
                         (unset it, or set it to http/protobuf)"
                    ));
                }
            }
        }
        if let Some(exporter) = var("OTEL_TRACES_EXPORTER") {
            if exporter.trim() != "otlp" {
                return Err(format!(
                    "OTEL_TRACES_EXPORTER={exporter}: the exporters are otlp and none"
                ));
            }
        }
        Ok(Some(Self {
            service_name: var("OTEL_SERVICE_NAME"),
        }))
    }

    /// Starts exporting: the relay traces every publish from now on, counting in `metrics` the
    /// spans dropped or not exported. The returned guard flushes and stops the export when
    /// dropped.
    pub fn start(self, metrics: &Metrics) -> Result<Exporting, String> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
            .map_err(|e| format!("OpenTelemetry exporter: {e}"))?;
        let resource = Resource::builder()
            .with_service_name(
                self.service_name
                    .unwrap_or_else(|| "outbox-relay".to_owned()),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_resource(resource)
            .with_span_processor(outbox_relayer::otel::BoundedQueue::new(exporter, metrics))
            .build();
        outbox_relayer::otel::enable(provider.tracer("outbox-relay"));
        Ok(Exporting { provider })
    }
}

/// Trace export under way; dropping it exports what is queued and stops.
pub struct Exporting {
    provider: SdkTracerProvider,
}

impl Drop for Exporting {
    fn drop(&mut self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "OpenTelemetry: the last spans could not be exported");
        }
    }
}
