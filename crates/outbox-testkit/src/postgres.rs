//! A private PostgreSQL server a test may crash and restart: its own data directory (a
//! temporary folder), its own port, its own process group. The shared servers are never
//! touched.

use std::{
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use crate::{free_port, wait_until, BrokerProcess};

/// How long a (re)started server may take to accept queries (crash recovery included).
const READY: Duration = Duration::from_secs(60);

/// A server certificate (PEM, its chain) and its private key (PEM), for a private server that
/// speaks TLS.
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// The certificate chain, leaf first.
    pub cert_pem: String,
    /// The certificate's private key (PKCS#8).
    pub key_pem: String,
}

/// A PostgreSQL cluster created with `initdb` in a temporary folder, run as a foreground
/// `postgres` process in a process group of its own (through the testkit's [`BrokerProcess`]),
/// and stopped by killing that group (SIGKILL): a crash, followed by crash recovery on the next
/// start. The folder and the processes go away on drop, also when the test panics.
pub struct PrivatePostgres {
    process: BrokerProcess,
    bin: PathBuf,
    /// Extra `-c name=value` settings.
    settings: Vec<String>,
    /// `Some((uid, gid))` of the `postgres` user when running as root (PostgreSQL refuses to
    /// run as root).
    user: Option<(u32, u32)>,
}

impl PrivatePostgres {
    /// Creates the cluster (trust authentication, fsync off: a crash of the server process
    /// keeps what the kernel was given, which is what a committed transaction has written)
    /// and starts it.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Like [`PrivatePostgres::start`], with extra server settings (`"wal_level=logical"`).
    pub async fn start_with(settings: &[&str]) -> Self {
        Self::create(settings, None).await
    }

    /// Like [`PrivatePostgres::start_with`], serving TLS with `tls` and refusing every TCP
    /// connection without TLS (`hostssl` lines only in `pg_hba.conf`, `hostnossl … reject`),
    /// replication connections included. The Unix socket stays open without TLS.
    pub async fn start_tls_only(settings: &[&str], tls: &ServerTls) -> Self {
        Self::create(settings, Some(tls)).await
    }

    async fn create(settings: &[&str], tls: Option<&ServerTls>) -> Self {
        let bin = postgres_bin();
        let user = if current_uid() == 0 {
            Some((id_of("-u"), id_of("-g")))
        } else {
            None
        };
        let process = BrokerProcess::prepare(free_port());
        let mut server = Self {
            process,
            bin,
            user,
            settings: settings.iter().map(|s| (*s).to_owned()).collect(),
        };
        let status = server
            .command("initdb")
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(server.data_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run initdb");
        assert!(status.success(), "initdb failed: {status}");
        if let Some(tls) = tls {
            server.require_tls(tls);
        }
        server.start_server().await;
        server
    }

    /// Writes the certificate, its key and a TLS-only `pg_hba.conf` into the data directory,
    /// and turns `ssl` on.
    fn require_tls(&mut self, tls: &ServerTls) {
        let data = self.data_dir();
        let write = |name: &str, text: &str| {
            let path = data.join(name);
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {name}: {e}"));
            // PostgreSQL refuses a key readable by others, and reads it as its own user.
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .expect("chmod");
            if let Some((uid, gid)) = self.user {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).expect("chown");
            }
        };
        write("server.crt", &tls.cert_pem);
        write("server.key", &tls.key_pem);
        write(
            "pg_hba.conf",
            "local all all trust\n\
             hostssl all all 127.0.0.1/32 trust\n\
             hostssl replication all 127.0.0.1/32 trust\n\
             hostnossl all all 0.0.0.0/0 reject\n\
             hostnossl replication all 0.0.0.0/0 reject\n",
        );
        self.settings.extend([
            "ssl=on".to_owned(),
            "ssl_cert_file=server.crt".into(),
            "ssl_key_file=server.key".into(),
        ]);
    }

    /// `postgres://postgres@127.0.0.1:{port}/postgres`.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.process.port
        )
    }

    /// Crashes the server: SIGKILL to its whole process group (postmaster and backends).
    pub fn crash(&mut self) {
        self.process.stop();
    }

    /// Starts the server again after [`PrivatePostgres::crash`] and waits until it answers
    /// queries (after crash recovery).
    pub async fn start_again(&mut self) {
        self.start_server().await;
    }

    fn data_dir(&self) -> PathBuf {
        self.process.dir.join("data")
    }

    async fn start_server(&mut self) {
        // Right after a crash the server can refuse to start (its old backends' shared memory
        // or lock file not yet released): it exits at once, and a later try succeeds.
        let mut tries = 0;
        loop {
            tries += 1;
            let mut command = self.command("postgres");
            command.arg("-D").arg(self.data_dir());
            command.args(["-p", &self.process.port.to_string()]);
            for setting in [
                "listen_addresses=127.0.0.1".to_owned(),
                format!("unix_socket_directories={}", self.process.dir.display()),
                "fsync=off".into(),
                "full_page_writes=off".into(),
                "max_connections=200".into(),
                "shared_buffers=32MB".into(),
            ]
            .into_iter()
            .chain(self.settings.iter().cloned())
            {
                command.args(["-c", &setting]);
            }
            match self.process.try_start(command).await {
                Ok(()) => break,
                Err(e) if tries < 5 && e.contains("exited") => {
                    eprintln!("private PostgreSQL did not start (try {tries}), again: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                Err(e) => panic!("{e}"),
            }
        }
        let url = self.url();
        wait_until("the private PostgreSQL to answer", READY, || {
            let url = url.clone();
            async move {
                match sqlx::PgPool::connect(&url).await {
                    Ok(pool) => {
                        let ok = sqlx::query("SELECT 1").execute(&pool).await.is_ok();
                        pool.close().await;
                        ok
                    }
                    Err(_) => false,
                }
            }
        })
        .await;
    }

    /// A command for one of PostgreSQL's programs, as the `postgres` user when we are root.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command.current_dir(&self.process.dir);
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid).env("HOME", &self.process.dir);
        }
        command
    }
}

/// Where PostgreSQL's programs are: `OUTBOX_CHAOS_PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian's layout), else `pg_config --bindir`.
fn postgres_bin() -> PathBuf {
    if let Ok(dir) = std::env::var("OUTBOX_CHAOS_PG_BIN") {
        return dir.into();
    }
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .max();
    if let Some((_, bin)) = newest {
        return bin;
    }
    let out = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .expect("PostgreSQL server programs not found: set OUTBOX_CHAOS_PG_BIN");
    String::from_utf8_lossy(&out.stdout).trim().into()
}

fn current_uid() -> u32 {
    let out = Command::new("id").arg("-u").output().expect("run id -u");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("numeric uid")
}

/// `id {flag} postgres`.
fn id_of(flag: &str) -> u32 {
    let out = Command::new("id")
        .args([flag, "postgres"])
        .output()
        .expect("run id");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a `postgres` user (PostgreSQL refuses to run as root)")
}
