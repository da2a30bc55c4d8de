use std::{
    net::TcpListener,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A private `nats-server -js` on its own port and store directory, for tests that stop and
/// restart the broker. Stopped by process id, never by name; the shared server is untouched.
pub struct NatsServer {
    /// Client port.
    pub port: u16,
    store: PathBuf,
    child: Option<Child>,
}

impl NatsServer {
    /// Starts the server and waits until it accepts connections.
    pub async fn start() -> Self {
        let port = free_port();
        let store = std::env::temp_dir().join(crate::unique("nats-store"));
        let mut server = Self {
            port,
            store,
            child: None,
        };
        server.restart().await;
        server
    }

    /// `nats://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL, by pid) if it runs.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// (Re)starts the server on the same port and store, waiting until it accepts connections.
    pub async fn restart(&mut self) {
        self.stop();
        let child = Command::new("nats-server")
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server (is it installed?)");
        self.child = Some(child);
        let url = self.url();
        crate::wait_until(
            "private nats-server to accept connections",
            Duration::from_secs(20),
            || {
                let url = url.clone();
                async move {
                    match async_nats::connect(&url).await {
                        Ok(client) => {
                            // JetStream must answer too.
                            client.request("$JS.API.INFO", "".into()).await.is_ok()
                        }
                        Err(_) => false,
                    }
                }
            },
        )
        .await;
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.store);
    }
}
