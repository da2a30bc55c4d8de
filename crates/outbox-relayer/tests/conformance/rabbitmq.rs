//! RabbitMQ (AMQP 0-9-1): publisher confirms, persistent messages, mandatory routing,
//! `message_id` = event id. RabbitMQ has no broker-side dedupe.

use std::{process::Command, sync::Arc};

use outbox_relayer::{
    publishers::rabbitmq::{RabbitMqConfig, RabbitMqPublisher},
    Publisher,
};
use outbox_testkit::{free_port, unique, BrokerProcess, Delivery, RabbitReader, RABBITMQ_URL};

use crate::suite::{Harness, WAIT};

pub struct RabbitMq {
    url: String,
    exchange: String,
    prefix: String,
    reader: Option<RabbitReader>,
}

/// A private RabbitMQ node with its own node name, ports and data folder, so it never meets
/// the shared node.
///
/// It runs RabbitMQ's own start script as the `rabbitmq` user directly (uid/gid set before
/// exec), not through Debian's `/usr/sbin/rabbitmq-server` wrapper: the wrapper switches
/// user with `su`, which starts a new session, so the node escaped `BrokerProcess::stop`
/// (which kills the process group it started) and kept running after the test.
pub fn private_rabbitmq(broker: &BrokerProcess, plugins: &str) -> Command {
    use std::os::unix::process::CommandExt;
    let dir = &broker.dir;
    std::fs::write(dir.join("enabled_plugins"), format!("[{plugins}].")).expect("plugins file");
    let (uid, gid) = rabbitmq_user();
    let mut command = Command::new("/usr/lib/rabbitmq/bin/rabbitmq-server");
    command.current_dir(dir).env("HOME", dir);
    if uid != 0 && nix_is_root() {
        command.uid(uid).gid(gid);
    }
    command
        .env(
            "RABBITMQ_NODENAME",
            format!("{}@localhost", unique("outbox")),
        )
        .env("RABBITMQ_NODE_PORT", broker.port.to_string())
        .env("RABBITMQ_DIST_PORT", free_port().to_string())
        .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
        .env("RABBITMQ_LOG_BASE", dir.join("log"))
        .env("RABBITMQ_FEATURE_FLAGS_FILE", dir.join("feature_flags"))
        .env("RABBITMQ_PLUGINS_EXPAND_DIR", dir.join("plugins"))
        .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
        .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq"));
    command
}

/// The `rabbitmq` user's uid and gid, from `/etc/passwd` (0, 0 if there is none).
fn rabbitmq_user() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|f| f.first() == Some(&"rabbitmq") && f.len() > 3)
        .and_then(|f| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
        .unwrap_or((0, 0))
}

/// Whether the tests run as root (only root may switch to the `rabbitmq` user).
fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next().map(|uid| uid == "0"))
        .unwrap_or(false)
}

impl Harness for RabbitMq {
    const DEDUPES: bool = false;

    fn shared_url() -> String {
        RABBITMQ_URL.into()
    }

    fn private_url(port: u16) -> String {
        format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
    }

    fn private_server(broker: &BrokerProcess) -> Command {
        private_rabbitmq(broker, "")
    }

    fn new(url: String) -> Self {
        Self {
            url,
            exchange: unique("conf"),
            prefix: unique("conf"),
            reader: None,
        }
    }

    async fn prepare(&mut self) -> Result<(), String> {
        if self.reader.is_none() {
            let binding = format!("{}.#", self.prefix);
            self.reader = Some(RabbitReader::try_start(&self.url, &self.exchange, &binding).await?);
        }
        Ok(())
    }

    fn destination(&self, i: usize) -> String {
        format!("{}.d{i}.OrderPlaced", self.prefix)
    }

    fn unroutable(&self) -> Option<String> {
        // Mandatory publishing: no queue is bound for this key.
        Some(format!("{}.nowhere", unique("conf")))
    }

    async fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(
            RabbitMqPublisher::connect(RabbitMqConfig {
                url: self.url.clone(),
                exchange: self.exchange.clone(),
                max_payload_bytes: 1024 * 1024,
                ..Default::default()
            })
            .await
            .expect("rabbitmq publisher"),
        )
    }

    async fn read(&self, n: usize) -> Vec<Delivery> {
        let reader = self.reader.as_ref().expect("prepared");
        reader.wait_for(n, WAIT).await
    }

    async fn cleanup(self) {
        if let Some(reader) = self.reader {
            reader.cleanup().await;
        }
    }
}

crate::conformance_tests!(RabbitMq);
