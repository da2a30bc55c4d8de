//! The application side: writer tasks committing business changes and their events through
//! the library (`PgOutbox` or `MySqlOutbox` inside sqlx transactions), and a ledger of what each
//! transaction became.
//!
//! Each aggregate is a row of `chaos_aggregates` holding its current version. A transaction
//! locks the rows of the aggregates it changes (`FOR UPDATE`, as an application would), writes
//! the next versions as events and bumps the rows. Each writer owns its own aggregates, so one
//! writer at a time writes an aggregate and, with the row lock, an aggregate's events are
//! inserted in version order: per aggregate, id order = version order. Some transactions roll
//! back, some stay open for seconds and commit after later ones (late commits), some are bulk
//! (10–30 aggregates, 2–5 events each, through `enqueue_batch`) so that faults find batches in
//! flight.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use outbox::{postgres::WriteMode, Event};
use rand::{rngs::StdRng, seq::IndexedRandom, Rng, SeedableRng};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::database::{Outboxes, Pool};

/// The aggregate type of every event written.
pub const AGGREGATE_TYPE: &str = "account";

/// What a transaction's event became, as the writer saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// COMMIT answered OK, at this time.
    Committed(SystemTime),
    /// Rolled back on purpose.
    RolledBack,
    /// An error (a PostgreSQL crash) before COMMIT was sent: never committed.
    Aborted,
    /// COMMIT was sent and its answer lost: committed or not, the table says.
    Interrupted,
}

/// One event written.
#[derive(Clone, Debug)]
pub struct Written {
    /// Its id (the library's UUIDv7).
    pub event_id: Uuid,
    /// Its aggregate id.
    pub aggregate_id: String,
    /// Its aggregate version.
    pub version: i64,
    /// What its transaction became.
    pub fate: Fate,
}

/// Writer settings.
#[derive(Clone, Copy, Debug)]
pub struct WriterSettings {
    /// Concurrent writer tasks.
    pub writers: usize,
    /// Aggregates each writer owns.
    pub aggregates_per_writer: usize,
    /// Share of transactions rolled back on purpose.
    pub rollback_ratio: f64,
    /// Share of transactions kept open for 1–4 s before they commit.
    pub late_ratio: f64,
    /// Share of bulk transactions.
    pub bulk_ratio: f64,
    /// How events are written (rows kept, zero-growth, table-less: the last two with CDC).
    pub write_mode: WriteMode,
}

/// The running writers.
pub struct Writers {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    ledger: Arc<Mutex<Vec<Written>>>,
}

/// Creates the business table with every aggregate at version 0.
pub async fn prepare(pool: &Pool, settings: WriterSettings) {
    let ids: Vec<String> = (0..settings.writers)
        .flat_map(|w| (0..settings.aggregates_per_writer).map(move |a| aggregate_id(w, a)))
        .collect();
    pool.prepare(&ids).await;
}

fn aggregate_id(writer: usize, n: usize) -> String {
    format!("w{writer}-a{n}")
}

impl Writers {
    /// Starts the writers; writer `w` draws its choices from `seed + w`.
    pub fn start(pool: Pool, settings: WriterSettings, seed: u64) -> Self {
        let stop = CancellationToken::new();
        let ledger = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..settings.writers)
            .map(|w| {
                let writer = Writer {
                    pool: pool.clone(),
                    outbox: Outboxes::new(settings.write_mode),
                    aggregates: (0..settings.aggregates_per_writer)
                        .map(|a| aggregate_id(w, a))
                        .collect(),
                    rng: StdRng::seed_from_u64(seed.wrapping_add(w as u64)),
                    settings,
                    ledger: ledger.clone(),
                };
                tokio::spawn(writer.run(stop.clone()))
            })
            .collect();
        Self {
            stop,
            tasks,
            ledger,
        }
    }

    /// Events written so far (any fate).
    pub fn written(&self) -> usize {
        self.ledger.lock().unwrap().len()
    }

    /// Stops the writers (each finishes its transaction) and returns the ledger.
    pub async fn stop(self) -> Vec<Written> {
        self.stop.cancel();
        for task in self.tasks {
            task.await.expect("writer task panicked");
        }
        std::mem::take(&mut *self.ledger.lock().unwrap())
    }
}

struct Writer {
    pool: Pool,
    outbox: Outboxes,
    aggregates: Vec<String>,
    rng: StdRng,
    settings: WriterSettings,
    ledger: Arc<Mutex<Vec<Written>>>,
}

enum Ending {
    Commit,
    Rollback,
    /// Commit after keeping the transaction open this long.
    Late(Duration),
}

impl Writer {
    async fn run(mut self, stop: CancellationToken) {
        while !stop.is_cancelled() {
            let pace = Duration::from_millis(self.rng.random_range(5..25));
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(pace) => {}
            }
            let bulk = self.rng.random::<f64>() < self.settings.bulk_ratio;
            let (count, events) = if bulk {
                (10..=30, 2..=5)
            } else {
                (1..=3, 1..=2)
            };
            let count = self.rng.random_range(count).min(self.aggregates.len());
            let chosen: Vec<String> = self
                .aggregates
                .choose_multiple(&mut self.rng, count)
                .cloned()
                .collect();
            let roll: f64 = self.rng.random();
            let ending = if roll < self.settings.rollback_ratio {
                Ending::Rollback
            } else if roll < self.settings.rollback_ratio + self.settings.late_ratio {
                Ending::Late(Duration::from_millis(self.rng.random_range(1_000..4_000)))
            } else {
                Ending::Commit
            };
            let per_aggregate: Vec<i64> = chosen
                .iter()
                .map(|_| self.rng.random_range(events.clone()))
                .collect();
            if !self.transaction(&chosen, &per_aggregate, ending).await {
                // The database is down: an application would retry the command later.
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
        }
    }

    /// One transaction; false when the database failed it.
    async fn transaction(
        &mut self,
        aggregates: &[String],
        per_aggregate: &[i64],
        ending: Ending,
    ) -> bool {
        let Ok(mut tx) = self.pool.begin().await else {
            return false;
        };
        let mut events = Vec::new();
        let body = async {
            // A fixed lock order, as an application locking several rows would use.
            let mut order: Vec<usize> = (0..aggregates.len()).collect();
            order.sort_by_key(|&i| &aggregates[i]);
            for i in order {
                let (aggregate, n) = (&aggregates[i], per_aggregate[i]);
                let version = tx.lock_version(aggregate).await?;
                let batch = (version + 1..=version + n)
                    .map(|v| {
                        Event::new(AGGREGATE_TYPE, aggregate.clone(), "Changed")
                            .json(&serde_json::json!({ "account": aggregate, "version": v }))
                            .map(|e| e.aggregate_version(v))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                let ids = tx.enqueue(&self.outbox, &batch).await?;
                for (v, event_id) in (version + 1..).zip(ids) {
                    events.push(Written {
                        event_id,
                        aggregate_id: aggregate.clone(),
                        version: v,
                        fate: Fate::Aborted,
                    });
                }
                tx.set_version(aggregate, version + n).await?;
            }
            Ok::<(), String>(())
        }
        .await;
        let fate = match (body, ending) {
            (Err(_), _) => Fate::Aborted,
            (Ok(()), Ending::Rollback) => {
                let _ = tx.rollback().await;
                Fate::RolledBack
            }
            (Ok(()), ending) => {
                if let Ending::Late(hold) = ending {
                    tokio::time::sleep(hold).await;
                }
                match tx.commit().await {
                    Ok(()) => Fate::Committed(SystemTime::now()),
                    Err(_) => Fate::Interrupted,
                }
            }
        };
        let ok = !matches!(fate, Fate::Aborted | Fate::Interrupted);
        for event in &mut events {
            event.fate = fate;
        }
        self.ledger.lock().unwrap().extend(events);
        ok
    }
}
