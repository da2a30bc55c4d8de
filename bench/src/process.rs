//! The real relay binary as a child process, and `/proc` sampling of its memory and CPU time
//! and of the machine's CPU use.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use tokio::{process::Child, task::JoinHandle};

use crate::{
    common::{Result, Scope},
    context::Bench,
    machine::field_kb,
};

/// How often the relay's RSS is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// Clock ticks per second of `/proc/<pid>/stat` times (USER_HZ, 100 on Linux).
pub const CLOCK_TICKS: f64 = 100.0;

/// A running `outbox relay` child process.
pub struct RelayProcess {
    child: Child,
    pid: u32,
    log: PathBuf,
    peak_rss_kb: Arc<AtomicU64>,
    sampler: JoinHandle<()>,
}

/// What the relay process used, read when it was stopped.
#[derive(Clone, Debug, Default)]
pub struct RelayStats {
    /// Largest VmRSS sampled every 250 ms, MB.
    pub peak_rss_mb: f64,
    /// VmHWM (the kernel's RSS high-water mark) just before SIGTERM, MB.
    pub hwm_mb: f64,
    /// How it exited after SIGTERM.
    pub exit: String,
    /// Warnings and errors found in its log.
    pub log: LogSummary,
}

/// WARN and ERROR lines of a relay log.
#[derive(Clone, Debug, Default)]
pub struct LogSummary {
    /// The log file.
    pub path: PathBuf,
    /// Number of WARN lines.
    pub warnings: usize,
    /// Number of ERROR lines.
    pub errors: usize,
    /// Distinct WARN/ERROR messages (without timestamps, timings and SQL text), each with its
    /// number of lines, in order of first appearance; at most 8.
    pub samples: Vec<(String, usize)>,
}

impl RelayProcess {
    /// Writes the scenario's relay config and starts `outbox relay` with it; its stdout and
    /// stderr go to `<out>/relay-<scenario>.log`.
    pub async fn start(bench: &Bench, scope: &Scope) -> Result<Self> {
        Self::start_on(bench, scope, &bench.options.database_url).await
    }

    /// The same, on the database at `database_url` (a SQLite file for the `sqlite` scenario).
    pub async fn start_on(bench: &Bench, scope: &Scope, database_url: &str) -> Result<Self> {
        Self::start_with(bench, scope, database_url, &[]).await
    }

    /// The same, with the environment variables `env` set for the relay.
    pub async fn start_with(
        bench: &Bench,
        scope: &Scope,
        database_url: &str,
        env: &[(String, String)],
    ) -> Result<Self> {
        let out = bench.out_dir();
        let config = out.join(format!("relay-{}.toml", scope.scenario));
        std::fs::write(&config, relay_config(bench, scope))?;
        let log = out.join(format!("relay-{}.log", scope.scenario));
        let file = std::fs::File::create(&log)?;
        let mut command = tokio::process::Command::new(bench.relay_bin()?);
        command
            .arg("relay")
            .arg("--database-url")
            .arg(database_url)
            .arg("--schema")
            .arg(scope.tables.schema().as_str())
            .arg("--broker-url")
            .arg(bench.relay_broker_url(scope))
            .arg("--config")
            .arg(&config)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .kill_on_drop(true);
        // The developer's OUTBOX_* variables would override the generated config.
        for (name, _) in std::env::vars_os() {
            let name_text = name.to_string_lossy();
            if name_text.starts_with("OUTBOX_") || name_text.starts_with("OTEL_") {
                command.env_remove(name);
            }
        }
        command.envs(env.iter().map(|(k, v)| (k, v)));
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start the relay: {e}"))?;
        let pid = child.id().ok_or("the relay exited at once")?;
        let peak_rss_kb = Arc::new(AtomicU64::new(0));
        let sampler = tokio::spawn(sample_rss(pid, peak_rss_kb.clone()));
        Ok(Self {
            child,
            pid,
            log,
            peak_rss_kb,
            sampler,
        })
    }

    /// Fails, quoting the end of its log, if the relay has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            return Err(format!(
                "the relay exited early ({status}); end of {}:\n{}",
                self.log.display(),
                tail(&self.log, 20)
            )
            .into());
        }
        Ok(())
    }

    /// The relay's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The relay's resident memory now, MB.
    pub fn rss_mb(&self) -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        field_kb(&status, "VmRSS:").map(|kb| kb as f64 / 1024.0)
    }

    /// CPU seconds (user + system, all threads) the relay has used so far.
    pub fn cpu_seconds(&self) -> f64 {
        process_cpu_seconds(self.pid).unwrap_or(0.0)
    }

    /// Sends SIGTERM, waits up to 30 s for a clean exit (then kills it) and returns its usage.
    pub async fn stop(mut self) -> Result<RelayStats> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok();
        let hwm_kb = status
            .as_deref()
            .and_then(|s| field_kb(s, "VmHWM:"))
            .unwrap_or(0);
        if let Some(rss) = status.as_deref().and_then(|s| field_kb(s, "VmRSS:")) {
            self.peak_rss_kb.fetch_max(rss, Ordering::Relaxed);
        }
        self.sampler.abort();
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .status();
        let exit = match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(Ok(status)) => status.to_string(),
            Ok(Err(e)) => format!("wait failed: {e}"),
            Err(_) => {
                let _ = self.child.kill().await;
                "did not stop within 30 s of SIGTERM; killed".to_owned()
            }
        };
        Ok(RelayStats {
            peak_rss_mb: self.peak_rss_kb.load(Ordering::Relaxed) as f64 / 1024.0,
            hwm_mb: hwm_kb as f64 / 1024.0,
            exit,
            log: summarize_log(&self.log),
        })
    }
}

/// The relay's TOML config for a scenario: its own stream, subjects and relay id, and the
/// batch settings under test.
fn relay_config(bench: &Bench, scope: &Scope) -> String {
    format!(
        "# Generated by outbox-bench for scenario {scenario}.\n\
         [relay]\n\
         relay_id = \"bench-{run}-{scenario}\"\n\
         max_batch_size = {batch}\n\
         max_inflight_batches = {inflight}\n\
         mode = \"{mode}\"\n\
         {extra}\
         \n\
         [relay.routing]\n\
         default = \"{subjects}.{{aggregate_type}}.{{event_type}}\"\n\
         \n\
         [nats]\n\
         stream = \"{stream}\"\n\
         \n\
         [rabbitmq]\n\
         exchange = \"{stream}\"\n\
         \n\
         [kafka]\n\
         client_id = \"bench-{run}-{scenario}\"\n",
        scenario = scope.scenario,
        run = bench.run_id,
        batch = bench.options.batch_size,
        inflight = bench.options.inflight,
        subjects = scope.subjects,
        stream = scope.stream,
        mode = if scope.cdc { "cdc" } else { "poll" },
        extra = bench
            .options
            .relay_settings
            .iter()
            .map(|s| format!("{s}\n"))
            .collect::<String>(),
    )
}

async fn sample_rss(pid: u32, peak_kb: Arc<AtomicU64>) {
    let path = format!("/proc/{pid}/status");
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tick.tick().await;
        let Ok(status) = std::fs::read_to_string(&path) else {
            return;
        };
        if let Some(rss) = field_kb(&status, "VmRSS:") {
            peak_kb.fetch_max(rss, Ordering::Relaxed);
        }
    }
}

/// utime + stime of a process (all its threads), in seconds.
/// CPU seconds (user + system, all threads) process `pid` has used so far.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start at field 3 (state).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / CLOCK_TICKS)
}

/// Busy and total CPU time of the whole machine, from `/proc/stat`.
#[derive(Clone, Copy, Debug, Default)]
pub struct MachineCpu {
    busy: u64,
    total: u64,
}

impl MachineCpu {
    /// Reads the counters now.
    pub fn now() -> Self {
        let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let values: Vec<u64> = text
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal (guest time is counted in user).
        let total: u64 = values.iter().take(8).sum();
        let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
        Self {
            busy: total.saturating_sub(idle),
            total,
        }
    }

    /// Busy clock ticks of all CPUs together since `earlier` (`CLOCK_TICKS` per CPU second).
    pub fn busy_since(&self, earlier: &Self) -> u64 {
        self.busy.saturating_sub(earlier.busy)
    }

    /// Share of all CPUs busy since `earlier`, in percent.
    pub fn busy_percent_since(&self, earlier: &Self) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        if total == 0 {
            return 0.0;
        }
        100.0 * self.busy.saturating_sub(earlier.busy) as f64 / total as f64
    }
}

/// Counts the WARN and ERROR lines of a relay log and keeps a few distinct messages.
fn summarize_log(path: &Path) -> LogSummary {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut summary = LogSummary {
        path: path.to_owned(),
        ..Default::default()
    };
    for line in text.lines().map(strip_ansi) {
        let level = line.split_whitespace().nth(1).unwrap_or("");
        match level {
            "WARN" => summary.warnings += 1,
            "ERROR" => summary.errors += 1,
            _ => continue,
        }
        let message = message_key(&line);
        let samples = &mut summary.samples;
        if let Some(i) = samples.iter().position(|(m, _)| *m == message) {
            samples[i].1 += 1;
        } else if samples.len() < 8 {
            samples.push((message, 1));
        }
    }
    summary
}

/// A log line without its timestamp, and without the fields that differ between occurrences of
/// the same warning (sqlx's slow-statement SQL text and timings).
fn message_key(line: &str) -> String {
    let message = line.split_once(' ').map_or(line, |(_, m)| m.trim());
    let message = message
        .split(" db.statement=")
        .next()
        .unwrap_or(message)
        .split(" elapsed=")
        .next()
        .unwrap_or(message);
    message.chars().take(200).collect()
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_warnings_by_message() {
        let line = "2026-01-01T00:00:00Z  WARN sqlx::query: slow statement: execution time \
                    exceeded alert threshold summary=\"ANALYZE x\" db.statement=\"\" \
                    elapsed=1.2s";
        assert_eq!(
            message_key(line),
            "WARN sqlx::query: slow statement: execution time exceeded alert threshold \
             summary=\"ANALYZE x\""
        );
    }

    #[test]
    fn strips_colours() {
        assert_eq!(strip_ansi("\u{1b}[33m WARN\u{1b}[0m x"), " WARN x");
    }

    #[test]
    fn own_cpu_time_is_readable() {
        assert!(process_cpu_seconds(std::process::id()).is_some());
    }
}
