//! (l) `traces`: what OpenTelemetry tracing costs the relay. The same backlog (rows without a
//! trace context) is drained four times by the real relay binary: with trace export off,
//! exporting a span per event over OTLP to a live receiver (in this process: it decodes every
//! request, as a collector would), with `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at a port nobody
//! listens on, and exporting with `OTEL_TRACES_SAMPLER=parentbased_always_off` (only events a
//! writer traced get a span: here none). Reported: events/s, relay CPU per event, each against
//! the untraced drain of the same run, and the spans the receiver decoded.

use std::{
    fmt::Write as _,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use axum::{body::Bytes, extract::State, http::StatusCode, routing::post, Router};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;

use crate::{
    common::{interruptible, Result},
    context::Bench,
    drain::{measure_with, DrainResult},
};

/// One traced or untraced drain.
pub struct Variant {
    /// What the relay was told.
    pub name: &'static str,
    /// Its drain.
    pub drain: DrainResult,
    /// Spans the receiver decoded during it.
    pub spans: u64,
}

/// Runs the four drains, each in its own schema and stream.
pub async fn run(bench: &Bench) -> Result<Vec<Variant>> {
    let received = Arc::new(AtomicU64::new(0));
    let live = serve(received.clone()).await?;
    let dead = {
        // Bound, then closed: connections to it are refused.
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        format!("http://{}", listener.local_addr()?)
    };
    // (name, scenario, endpoint, sampler)
    let variants: [(&'static str, &'static str, Option<&str>, Option<&str>); 4] = [
        ("off", "traces_off", None, None),
        ("exporting", "traces_live", Some(&live), None),
        ("dead endpoint", "traces_dead", Some(&dead), None),
        (
            "exporting, parentbased_always_off",
            "traces_parent",
            Some(&live),
            Some("parentbased_always_off"),
        ),
    ];
    let mut out = Vec::new();
    for (name, scenario, endpoint, sampler) in variants {
        let mut env: Vec<(String, String)> = Vec::new();
        if let Some(endpoint) = endpoint {
            env.push((
                "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
                endpoint.to_owned(),
            ));
            env.push((
                "OTEL_SERVICE_NAME".to_owned(),
                "outbox-bench-relay".to_owned(),
            ));
        }
        if let Some(sampler) = sampler {
            env.push(("OTEL_TRACES_SAMPLER".to_owned(), sampler.to_owned()));
        }
        bench.settle(scenario).await;
        let scope = bench.scope(scenario)?;
        bench.create_outbox(&scope).await?;
        let before = received.load(Ordering::Relaxed);
        let result = interruptible(async {
            bench.create_destination(&scope).await?;
            measure_with(bench, &scope, &env).await
        })
        .await;
        bench.cleanup(&scope).await;
        out.push(Variant {
            name,
            drain: result?,
            spans: received.load(Ordering::Relaxed) - before,
        });
    }
    Ok(out)
}

/// An OTLP/HTTP receiver on loopback counting the spans it decodes; returns its base URL.
async fn serve(received: Arc<AtomicU64>) -> Result<String> {
    let app = Router::new()
        .route("/v1/traces", post(export))
        .with_state(received);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(url)
}

async fn export(State(received): State<Arc<AtomicU64>>, body: Bytes) -> StatusCode {
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) => {
            let spans: usize = request
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .map(|s| s.spans.len())
                .sum();
            received.fetch_add(spans as u64, Ordering::Relaxed);
            StatusCode::OK
        }
        Err(_) => StatusCode::BAD_REQUEST,
    }
}

/// The results as a Markdown table.
pub fn render(variants: &[Variant]) -> String {
    let mut out = String::from(
        "| trace export | events/s | ÷ off | relay CPU µs/event | ÷ off | machine CPU µs/event | spans received | relay peak RSS |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let per_event = |cpu: Option<f64>, events: u64| cpu.map(|s| s * 1e6 / events as f64);
    let off = variants.first();
    let off_rate = off.map(|v| v.drain.rate());
    let off_cpu = off.and_then(|v| per_event(v.drain.cpu.relay, v.drain.events));
    for v in variants {
        let d = &v.drain;
        let relay = per_event(d.cpu.relay, d.events);
        let machine = d.cpu.machine * 1e6 / d.events as f64;
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
            _ => "–".to_owned(),
        };
        let _ = writeln!(
            out,
            "| {} | {:.0} | {} | {} | {} | {:.1} | {} | {:.0} MB |",
            v.name,
            d.rate(),
            ratio(Some(d.rate()), off_rate),
            relay.map_or("–".to_owned(), |r| format!("{r:.1}")),
            ratio(relay, off_cpu),
            machine,
            v.spans,
            d.relay.peak_rss_mb,
        );
    }
    out
}
