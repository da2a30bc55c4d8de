//! HTTP webhook: one POST per event, 2xx as the ack, metadata in headers, `idempotency-key` =
//! event id (for the receiver; no dedupe on the wire). The receiver is a small Python HTTP
//! server in its own process (the machine's `python3`), which records every POST it accepts
//! and answers 404 under `/events/gone`, so the suite can also stop and start it.

use std::{collections::BTreeMap, path::PathBuf, process::Command, sync::Arc, time::Duration};

use outbox_relayer::{
    publishers::webhook::{WebhookConfig, WebhookPublisher},
    Publisher,
};
use outbox_testkit::{free_port, unique, wait_until, BrokerProcess, Delivery};

use crate::suite::{Harness, WAIT};

/// The receiver: records `{path, headers, body (hex)}` per accepted POST, one JSON line each.
const RECEIVER: &str = r#"
import http.server, json, sys, threading
port, out = int(sys.argv[1]), sys.argv[2]
lock = threading.Lock()
class Receiver(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        status = 404 if self.path.startswith("/events/gone") else 204
        if status == 204:
            record = {"path": self.path, "body": body.hex(),
                      "headers": {k.lower(): v for k, v in self.headers.items()}}
            with lock, open(out, "a") as f:
                f.write(json.dumps(record) + "\n")
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Receiver).serve_forever()
"#;

pub struct Webhook {
    port: u16,
    prefix: String,
    /// The receiver this harness runs itself (the suite's shared tests); the recovery test
    /// starts its own through `private_server`.
    own: Option<BrokerProcess>,
}

fn records(port: u16) -> PathBuf {
    std::env::temp_dir().join(format!("outbox-webhook-{port}.jsonl"))
}

fn receiver(port: u16) -> Command {
    let mut command = Command::new("python3");
    command
        .args(["-c", RECEIVER, &port.to_string()])
        .arg(records(port));
    command
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex body"))
        .collect()
}

impl Webhook {
    fn deliveries(&self) -> Vec<Delivery> {
        let text = std::fs::read_to_string(records(self.port)).unwrap_or_default();
        text.lines()
            .map(|line| {
                let record: serde_json::Value = serde_json::from_str(line).expect("record");
                let headers: BTreeMap<String, String> = record["headers"]
                    .as_object()
                    .expect("headers")
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect();
                Delivery::from_headers(
                    record["path"].as_str().unwrap_or_default().to_owned(),
                    headers,
                    unhex(record["body"].as_str().unwrap_or_default()),
                )
            })
            .collect()
    }
}

impl Harness for Webhook {
    const DEDUPES: bool = false;

    /// Port 0: the harness starts a receiver of its own on a free port.
    fn shared_url() -> String {
        "http://127.0.0.1:0".into()
    }

    fn private_url(port: u16) -> String {
        format!("http://127.0.0.1:{port}")
    }

    fn private_server(broker: &BrokerProcess) -> Command {
        receiver(broker.port)
    }

    fn new(url: String) -> Self {
        let port: u16 = url
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .expect("port in url");
        let (port, own) = if port == 0 {
            let port = free_port();
            (port, Some(BrokerProcess::prepare(port)))
        } else {
            (port, None)
        };
        let _ = std::fs::remove_file(records(port));
        Self {
            port,
            prefix: unique("conf"),
            own,
        }
    }

    async fn prepare(&mut self) -> Result<(), String> {
        if let Some(own) = &mut self.own {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_err()
            {
                own.start(receiver(self.port)).await;
            }
        }
        Ok(())
    }

    fn destination(&self, i: usize) -> String {
        format!("{}.d{i}.OrderPlaced", self.prefix)
    }

    fn unroutable(&self) -> Option<String> {
        // The receiver answers 404 there: a client error no retry can fix.
        Some(format!("gone.{}", unique("conf")))
    }

    async fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(
            WebhookPublisher::new(WebhookConfig {
                url: format!("http://127.0.0.1:{}/events/{{destination}}", self.port),
                timeout: Duration::from_secs(5),
                ..Default::default()
            })
            .expect("webhook publisher"),
        )
    }

    async fn read(&self, n: usize) -> Vec<Delivery> {
        wait_until(&format!("{n} POSTs at the receiver"), WAIT, || {
            let len = self.deliveries().len();
            async move { len >= n }
        })
        .await;
        self.deliveries()
    }

    async fn cleanup(self) {
        let _ = std::fs::remove_file(records(self.port));
        drop(self.own);
    }
}

crate::conformance_tests!(Webhook);
