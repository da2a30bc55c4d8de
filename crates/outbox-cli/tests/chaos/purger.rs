//! The operator's purge running throughout a run, as production runs it beside the relays and
//! the application: `outbox purge` every few hundred milliseconds with a retention shorter than
//! the run, alternately deleting and archiving (`--archive`) the published rows. A purge that
//! makes an application insert wait or fail shows in the writers' aborted transactions; one
//! that deletes a row not yet published shows as a lost event.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use tokio_util::sync::CancellationToken;

/// What the purges did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Purges {
    /// Runs that exited 0.
    pub ran: u64,
    /// Runs that failed (the database was down, or a lock wait timed out).
    pub failed: u64,
}

/// The running purger.
pub struct Purger {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    ran: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl Purger {
    /// Starts purging the outbox at `database_url`.
    pub fn start(database_url: String) -> Self {
        let stop = CancellationToken::new();
        let (ran, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let task = tokio::spawn({
            let (stop, ran, failed) = (stop.clone(), ran.clone(), failed.clone());
            async move {
                let mut archive = false;
                while !stop.is_cancelled() {
                    archive = !archive;
                    let url = database_url.clone();
                    let ok = tokio::task::spawn_blocking(move || purge(&url, archive))
                        .await
                        .unwrap_or(false);
                    if ok { &ran } else { &failed }.fetch_add(1, Ordering::Relaxed);
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = tokio::time::sleep(Duration::from_millis(300)) => {}
                    }
                }
            }
        });
        Self {
            stop,
            task,
            ran,
            failed,
        }
    }

    /// Stops purging; returns the counts.
    pub async fn stop(self) -> Purges {
        self.stop.cancel();
        let _ = self.task.await;
        Purges {
            ran: self.ran.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }
}

/// One `outbox purge` of rows published over 500 ms ago, in batches of 100.
fn purge(database_url: &str, archive: bool) -> bool {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_outbox"));
    command.args([
        "purge",
        "--database-url",
        database_url,
        "--older-than",
        "500ms",
        "--batch",
        "100",
    ]);
    if archive {
        command.arg("--archive");
    }
    command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
