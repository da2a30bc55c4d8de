//! Helpers to run the `outbox` binary as a child process.
#![allow(dead_code)]

use std::{
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
};

use outbox_testkit::TestDb;

/// The binary under test.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_outbox"))
}

/// Runs `outbox args…` to completion.
pub fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run outbox")
}

/// A config file with fast leases and retries, routing under `prefix`, for `db`.
pub fn fast_config(prefix: &str, extra: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("{}.toml", outbox_testkit::unique("relay")));
    std::fs::write(
        &path,
        format!(
            r#"
[relay]
lease_ttl = "2s"
heartbeat_interval = "500ms"
poll_interval = "200ms"
max_batch_size = 200
[relay.retry]
initial_backoff = "20ms"
max_backoff = "200ms"
max_transient_backoff = "200ms"
[relay.routing]
default = "{prefix}.{{aggregate_type}}.{{event_type}}"
{extra}
"#
        ),
    )
    .expect("write config");
    path
}

/// A relay process; killed (SIGKILL) on drop if still running.
pub struct RelayProcess {
    /// The child.
    pub child: Child,
    /// Where its logs go.
    pub log: PathBuf,
}

impl RelayProcess {
    /// Starts `outbox relay` on `db` with `broker` and `config`.
    pub fn start(db: &TestDb, broker: &str, config: &PathBuf, listen: &str) -> Self {
        Self::start_with_env(db, broker, config, listen, &[])
    }

    /// Same, with extra environment variables.
    pub fn start_with_env(
        db: &TestDb,
        broker: &str,
        config: &PathBuf,
        listen: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let database = ["--database-url", &db.url, "--schema", &db.schema];
        Self::start_on(&database, broker, config, listen, env)
    }

    /// Starts `outbox relay` with the database options `database` (`--database-url …`).
    pub fn start_on(
        database: &[&str],
        broker: &str,
        config: &PathBuf,
        listen: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let log = std::env::temp_dir().join(format!("{}.log", outbox_testkit::unique("relay")));
        let child = bin()
            .arg("relay")
            .args(database)
            .args(["--broker-url", broker, "--listen", listen, "--config"])
            .arg(config)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn relay");
        Self { child, log }
    }

    /// SIGKILL: no cleanup, leases left to expire.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit; returns whether it exited successfully.
    pub fn terminate(&mut self) -> bool {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.child.wait().map(|s| s.success()).unwrap_or(false)
    }

    /// The process's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// GET `path` from `addr` with a bare HTTP/1.0 request; returns (status, body).
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    http(addr, "GET", path, &[], "").await
}

/// A bare HTTP/1.0 request; returns (status, body).
pub async fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let mut request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|x| x.1.to_owned())?;
    Some((status, body))
}
