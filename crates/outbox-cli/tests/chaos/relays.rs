//! The relay fleet: `outbox relay` processes (the binary under test) that the chaos loop kills
//! (SIGKILL), pauses (SIGSTOP, then SIGCONT) and restarts, plus a supervisor that restarts a
//! relay which exited by itself (as systemd or Kubernetes would).

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// How soon the supervisor restarts a relay that exited by itself.
const SUPERVISOR_DELAY: Duration = Duration::from_millis(500);

/// What every relay process is started with.
#[derive(Clone, Debug)]
pub struct RelaySettings {
    /// The outbox database.
    pub database_url: String,
    /// The broker.
    pub broker_url: String,
    /// The TOML config file.
    pub config: PathBuf,
    /// Where the logs go (one file per process started).
    pub log_dir: PathBuf,
}

/// A relay process that exited without being killed by the chaos loop.
#[derive(Clone, Debug)]
pub struct Exit {
    /// `r{slot}.{generation}`.
    pub relay: String,
    /// Its exit status.
    pub status: String,
    /// The end of its log.
    pub log_tail: String,
}

struct Slot {
    child: Option<Child>,
    generation: u32,
    log: PathBuf,
    paused_until: Option<Instant>,
    restart_at: Option<Instant>,
}

/// A fixed number of relay slots, each running at most one process at a time.
pub struct Fleet {
    settings: RelaySettings,
    slots: Vec<Slot>,
    /// Processes that exited by themselves (restarted by the supervisor).
    pub exits: Vec<Exit>,
}

impl Fleet {
    /// Starts `n` relays.
    pub fn start(n: usize, settings: RelaySettings) -> Self {
        let mut fleet = Self {
            settings,
            slots: Vec::new(),
            exits: Vec::new(),
        };
        for _ in 0..n {
            fleet.slots.push(Slot {
                child: None,
                generation: 0,
                log: PathBuf::new(),
                paused_until: None,
                restart_at: None,
            });
            fleet.spawn(fleet.slots.len() - 1);
        }
        fleet
    }

    /// Slots with a live process (paused or not).
    pub fn alive(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].child.is_some())
            .collect()
    }

    /// Slots with a live process that is not paused.
    pub fn running(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].child.is_some() && self.slots[i].paused_until.is_none())
            .collect()
    }

    /// `r{slot}.{generation}` of the slot's current (or last) process.
    pub fn name(&self, slot: usize) -> String {
        format!("r{slot}.{}", self.slots[slot].generation)
    }

    /// SIGKILL (works on a paused process too); restarted after `restart_after`.
    pub fn kill(&mut self, slot: usize, restart_after: Duration) {
        let s = &mut self.slots[slot];
        if let Some(mut child) = s.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        s.paused_until = None;
        s.restart_at = Some(Instant::now() + restart_after);
    }

    /// SIGSTOP now, SIGCONT after `pause`.
    pub fn pause(&mut self, slot: usize, pause: Duration) {
        let s = &mut self.slots[slot];
        if let Some(child) = &s.child {
            signal("STOP", child.id());
            s.paused_until = Some(Instant::now() + pause);
        }
    }

    /// Resumes paused relays that are due, restarts killed ones that are due, and notices
    /// relays that exited by themselves (restarted after a short delay).
    pub fn tick(&mut self) {
        let now = Instant::now();
        for i in 0..self.slots.len() {
            let s = &mut self.slots[i];
            if s.paused_until.is_some_and(|t| t <= now) {
                if let Some(child) = &s.child {
                    signal("CONT", child.id());
                }
                s.paused_until = None;
            }
            if let Some(child) = &mut s.child {
                if let Ok(Some(status)) = child.try_wait() {
                    s.child = None;
                    s.paused_until = None;
                    s.restart_at = Some(now + SUPERVISOR_DELAY);
                    let exit = Exit {
                        relay: format!("r{i}.{}", s.generation),
                        status: status.to_string(),
                        log_tail: tail(&s.log, 5),
                    };
                    super::log(&format!(
                        "{} exited by itself ({}); the supervisor restarts it: {}",
                        exit.relay, exit.status, exit.log_tail
                    ));
                    self.exits.push(exit);
                }
            }
            if self.slots[i].restart_at.is_some_and(|t| t <= now) {
                self.spawn(i);
            }
        }
    }

    /// The next instant [`Fleet::tick`] has something to do.
    pub fn next_due(&self) -> Option<Instant> {
        self.slots
            .iter()
            .flat_map(|s| [s.paused_until, s.restart_at])
            .flatten()
            .min()
    }

    /// Ends the chaos: resumes every paused relay and starts every missing one now.
    pub fn heal(&mut self) {
        for s in &mut self.slots {
            if s.paused_until.is_some() {
                s.paused_until = Some(Instant::now());
            }
            if s.restart_at.is_some() {
                s.restart_at = Some(Instant::now());
            }
        }
        self.tick();
    }

    /// SIGTERM to every relay; returns the relays that did not exit cleanly (status 0) within
    /// `timeout` (those are then killed).
    pub async fn terminate_all(&mut self, timeout: Duration) -> Vec<String> {
        for s in &self.slots {
            if let Some(child) = &s.child {
                signal("TERM", child.id());
            }
        }
        let deadline = Instant::now() + timeout;
        let mut unclean = Vec::new();
        for i in 0..self.slots.len() {
            let name = self.name(i);
            let Some(mut child) = self.slots[i].child.take() else {
                continue;
            };
            let status = loop {
                match child.try_wait() {
                    Ok(Some(status)) => break Some(status),
                    Ok(None) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break None;
                    }
                }
            };
            if !status.is_some_and(|s| s.success()) {
                unclean.push(format!(
                    "{name}: {}: {}",
                    status.map_or("still running: killed".into(), |s| s.to_string()),
                    tail(&self.slots[i].log, 10)
                ));
            }
        }
        unclean
    }

    fn spawn(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        s.generation += 1;
        s.restart_at = None;
        s.paused_until = None;
        s.log = self
            .settings
            .log_dir
            .join(format!("relay-r{slot}.{}.log", s.generation));
        let log = std::fs::File::create(&s.log).expect("relay log file");
        let child = Command::new(env!("CARGO_BIN_EXE_outbox"))
            .arg("relay")
            .args(["--database-url", &self.settings.database_url])
            .args(["--broker-url", &self.settings.broker_url])
            .args(["--listen", "127.0.0.1:0"])
            .args(["--relay-id", &format!("r{slot}.{}", s.generation)])
            .arg("--config")
            .arg(&self.settings.config)
            .env("RUST_LOG", "info")
            // Odd slots run on a runtime of two threads, even ones on the default one thread:
            // the chaos covers both kinds of runtime, side by side.
            .env(
                "OUTBOX_WORKER_THREADS",
                if slot % 2 == 1 { "2" } else { "1" },
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn outbox relay");
        s.child = Some(child);
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for s in &mut self.slots {
            if let Some(mut child) = s.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// `kill -{name} {pid}`: only ever a process this harness started.
fn signal(name: &str, pid: u32) {
    let _ = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status();
}

/// The last `n` lines of a log file, on one line.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}
