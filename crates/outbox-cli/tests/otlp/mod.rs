//! A real OTLP/HTTP trace receiver for tests: it serves `POST /v1/traces`, decodes each
//! `ExportTraceServiceRequest` (protobuf) and keeps the spans, as a collector would.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use axum::{body::Bytes, extract::State, http::StatusCode, routing::post, Router};
use opentelemetry_proto::tonic::{
    collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse},
    common::v1::{any_value::Value, AnyValue, KeyValue},
};
use prost::Message as _;

/// One span as received.
#[derive(Clone, Debug)]
pub struct Received {
    /// `service.name` of the resource that sent it.
    pub service: String,
    /// The span's name.
    pub name: String,
    /// Its kind (2 server, 3 client, 4 producer, 5 consumer, 1 internal).
    pub kind: i32,
    /// Trace id, hex.
    pub trace_id: String,
    /// Span id, hex.
    pub span_id: String,
    /// Parent span id, hex; empty for a root.
    pub parent_span_id: String,
    /// Start time, Unix nanoseconds.
    pub start: u64,
    /// String and integer attributes, as text.
    pub attributes: BTreeMap<String, String>,
}

/// The receiver, listening on loopback until dropped. It runs on a thread and runtime of its
/// own, so that a test blocked on its spans' export (a provider's flush) cannot block it too.
pub struct Receiver {
    /// `http://127.0.0.1:PORT`: the value of `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: String,
    spans: Arc<Mutex<Vec<Received>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Receiver {
    /// Starts listening on a free port.
    pub fn start() -> Self {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new()
            .route("/v1/traces", post(export))
            .with_state(spans.clone());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        Self {
            endpoint,
            spans,
            stop: Some(stop),
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn export(
    State(spans): State<Arc<Mutex<Vec<Received>>>>,
    body: Bytes,
) -> (StatusCode, Vec<u8>) {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, Vec::new());
    };
    let mut got = Vec::new();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|a| a.key == "service.name")
            .map(text)
            .unwrap_or_default();
        for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
            got.push(Received {
                service: service.clone(),
                name: span.name,
                kind: span.kind,
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent_span_id: hex(&span.parent_span_id),
                start: span.start_time_unix_nano,
                attributes: span
                    .attributes
                    .iter()
                    .map(|a| (a.key.clone(), text(a)))
                    .collect(),
            });
        }
    }
    spans.lock().unwrap().extend(got);
    (
        StatusCode::OK,
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

fn text(attribute: &KeyValue) -> String {
    match attribute
        .value
        .as_ref()
        .and_then(|v: &AnyValue| v.value.as_ref())
    {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
