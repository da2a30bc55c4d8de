//! A private MariaDB server a test may crash and restart: its own data directory (a temporary
//! folder), its own port, its own process group. The shared server is never touched.

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use sqlx::{ConnectOptions, Connection};

use crate::{free_port, wait_until, BrokerProcess, ServerTls};

/// How long a (re)started server may take to accept queries (crash recovery included).
const READY: Duration = Duration::from_secs(60);

/// A MariaDB data directory made with `mariadb-install-db` in a temporary folder, served by a
/// foreground `mariadbd` in a process group of its own (through [`BrokerProcess`]) and stopped
/// by SIGKILL: a crash, followed by InnoDB's crash recovery on the next start. Commits are
/// written to the operating system at once (`innodb_flush_log_at_trx_commit = 2`): a crash of
/// the server process keeps every committed transaction, as `fsync = off` does for the private
/// PostgreSQL. The folder and the processes go away on drop, also when the test panics.
pub struct PrivateMariaDb {
    process: BrokerProcess,
    /// Server options added to the defaults.
    extra: Vec<String>,
}

impl PrivateMariaDb {
    /// Creates the data directory (root without a password) and starts the server.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// [`PrivateMariaDb::start`] with these server options too (`--binlog-format=STATEMENT`),
    /// given after the defaults so that they win.
    pub async fn start_with(options: &[&str]) -> Self {
        Self::create(options, None).await
    }

    /// Like [`PrivateMariaDb::start_with`], serving TLS with `tls` and refusing every
    /// connection without it (`--require-secure-transport=ON`).
    pub async fn start_tls_only(options: &[&str], tls: &ServerTls) -> Self {
        Self::create(options, Some(tls)).await
    }

    async fn create(options: &[&str], tls: Option<&ServerTls>) -> Self {
        let mut server = Self {
            process: BrokerProcess::prepare(free_port()),
            extra: options.iter().map(|o| (*o).to_owned()).collect(),
        };
        if let Some(tls) = tls {
            let dir = &server.process.dir;
            let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
            std::fs::write(&cert, &tls.cert_pem).expect("write server.crt");
            std::fs::write(&key, &tls.key_pem).expect("write server.key");
            server.extra.extend([
                format!("--ssl-cert={}", cert.display()),
                format!("--ssl-key={}", key.display()),
                "--require-secure-transport=ON".to_owned(),
            ]);
        }
        let status = Command::new("mariadb-install-db")
            .args([
                "--no-defaults",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ])
            .arg(format!("--datadir={}", server.data_dir()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run mariadb-install-db");
        assert!(status.success(), "mariadb-install-db failed: {status}");
        server.start_server().await;
        let mut conn = server.connect().await;
        sqlx::raw_sql("CREATE DATABASE IF NOT EXISTS test")
            .execute(&mut conn)
            .await
            .expect("create the test database");
        let _ = conn.close().await;
        server
    }

    /// `mysql://root@127.0.0.1:{port}/test`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.process.port)
    }

    /// Crashes the server: SIGKILL to its process group.
    pub fn crash(&mut self) {
        self.process.stop();
    }

    /// Starts the server again after [`PrivateMariaDb::crash`] and waits until it answers
    /// queries (after crash recovery).
    pub async fn start_again(&mut self) {
        self.start_server().await;
    }

    fn data_dir(&self) -> String {
        self.process.dir.join("data").display().to_string()
    }

    async fn connect(&self) -> sqlx::MySqlConnection {
        let options: sqlx::mysql::MySqlConnectOptions =
            format!("mysql://root@127.0.0.1:{}", self.process.port)
                .parse()
                .expect("a MySQL URL");
        options
            .connect()
            .await
            .expect("connect to the private MariaDB")
    }

    async fn start_server(&mut self) {
        let dir = self.process.dir.display().to_string();
        let mut command = Command::new("mariadbd");
        command.current_dir(&self.process.dir).args([
            "--no-defaults".to_owned(),
            "--user=root".into(),
            format!("--datadir={}", self.data_dir()),
            format!("--port={}", self.process.port),
            "--bind-address=127.0.0.1".into(),
            format!("--socket={dir}/mariadbd.sock"),
            format!("--pid-file={dir}/mariadbd.pid"),
            "--innodb-flush-log-at-trx-commit=2".into(),
            "--innodb-buffer-pool-size=64M".into(),
            "--max-connections=300".into(),
            "--skip-log-bin".into(),
        ]);
        command.args(&self.extra);
        self.process.start(command).await;
        let port = self.process.port;
        wait_until("the private MariaDB to answer", READY, || async move {
            let Ok(options) = format!("mysql://root@127.0.0.1:{port}")
                .parse::<sqlx::mysql::MySqlConnectOptions>()
            else {
                return false;
            };
            match options.connect().await {
                Ok(mut conn) => {
                    let ok = sqlx::query("SELECT 1").execute(&mut conn).await.is_ok();
                    let _ = conn.close().await;
                    ok
                }
                Err(_) => false,
            }
        })
        .await;
    }
}
