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

    /// Stops the server (SIGSTOP, by pid) without closing its connections: clients connect
    /// and send, and get no answer, as from a broker that hangs, until [`NatsServer::thaw`].
    pub fn freeze(&self) {
        self.signal("STOP");
    }

    /// Lets a frozen server go on (SIGCONT).
    pub fn thaw(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args([format!("-{name}"), child.id().to_string()])
                .status();
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

/// Any broker a test runs privately: a foreground command on its own port and data folder,
/// started in a process group of its own and killed by that group's id (wrappers such as
/// Debian's `rabbitmq-server` fork the real server under `su`). Never by name: the shared
/// servers are untouched.
pub struct BrokerProcess {
    /// The port the broker listens on.
    pub port: u16,
    /// Its data folder (deleted on drop).
    pub dir: PathBuf,
    child: Option<Child>,
}

impl BrokerProcess {
    /// A data folder for a broker that will listen on `port`; nothing runs yet.
    pub fn prepare(port: u16) -> Self {
        let dir = std::env::temp_dir().join(crate::unique("broker"));
        std::fs::create_dir_all(&dir).expect("broker data folder");
        // Some brokers drop privileges (RabbitMQ runs as its own user).
        let _ = Command::new("chmod").arg("777").arg(&dir).status();
        Self {
            port,
            dir,
            child: None,
        }
    }

    /// Runs `command` (which must stay in the foreground) and waits until the port accepts
    /// connections; panics with the end of its log if it does not within 60 s.
    pub async fn start(&mut self, command: Command) {
        if let Err(e) = self.try_start(command).await {
            panic!("{e}");
        }
    }

    /// [`BrokerProcess::start`], returning an error, with the end of the broker's log, when
    /// the broker exits before its port accepts connections or is not up within 60 s.
    pub async fn try_start(&mut self, mut command: Command) -> Result<(), String> {
        use std::os::unix::process::CommandExt;
        self.stop();
        let log_path = self.dir.join("broker.log");
        let log = std::fs::File::create(&log_path).expect("broker log");
        let child = command
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {command:?}: {e} (is it installed?)"));
        self.child = Some(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let port = self.port;
        let log_tail = || {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(20)..].join("\n")
        };
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                return Err(format!(
                    "the private broker on port {port} exited ({status}) before it listened; \
                     its log:\n{}",
                    log_tail()
                ));
            }
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "timed out after 60s waiting for private broker on port {port}; its log:\n{}",
                    log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the broker's whole process group (SIGKILL), if it runs.
    /// Returns once every process of the group is gone (at most 10 s): a PostgreSQL backend
    /// still exiting keeps the shared memory a restarted server needs.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = child.kill();
            let _ = child.wait();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let alive = || {
                Command::new("kill")
                    .args(["-0", "--", &group])
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            };
            while alive() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
