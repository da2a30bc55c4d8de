//! `outbox-sim`: sweeps seeds of the deterministic simulation, or replays one with its trace.
//!
//! ```text
//! cargo run --release -p outbox-sim -- --seeds 100000          # the long sweep
//! cargo run --release -p outbox-sim -- --seed 1234 --trace     # replay one seed, step by step
//! cargo run --release -p outbox-sim -- --source cdc --seeds 1000 # the CDC relay
//! ```

use std::{
    process::ExitCode,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use clap::Parser;
use outbox_sim::{Bug, Faults, Report, SimConfig, Source, WriteMode};

/// Deterministic fault-injection simulation of the outbox relay.
#[derive(Parser, Debug)]
#[command(name = "outbox-sim", version)]
struct Args {
    /// Seeds to run, starting at --first.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// First seed of the sweep.
    #[arg(long, default_value_t = 1)]
    first: u64,
    /// Run this one seed only (with --trace, print every step).
    #[arg(long, conflicts_with_all = ["seeds", "first"])]
    seed: Option<u64>,
    /// Print the trace of the seed run with --seed.
    #[arg(long, requires = "seed")]
    trace: bool,
    /// Virtual seconds of writing and chaos per seed.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Relay instances.
    #[arg(long, default_value_t = 3)]
    relays: usize,
    /// Threads running seeds [default: the number of cores].
    #[arg(long)]
    threads: Option<usize>,
    /// Plant a deliberate bug in the model, to see the oracle catch it.
    #[arg(long, value_enum)]
    bug: Option<Bug>,
    /// Where the relays read events from.
    #[arg(long, value_enum, default_value = "poll")]
    source: Source,
    /// CDC: how the writers write (default: drawn from each seed).
    #[arg(long, value_enum)]
    write_mode: Option<WriteMode>,
    /// No faults at all: the calm baseline.
    #[arg(long)]
    calm: bool,
    /// CDC: the share of commits the stream carries before queries see them (0 to 1).
    #[arg(long, conflicts_with = "calm", value_parser = share)]
    invisible_commits: Option<f64>,
}

/// A share between 0 and 1.
fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err(format!("`{s}` is not a share between 0 and 1")),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = SimConfig {
        relays: args.relays,
        write_for: Duration::from_secs(args.seconds),
        bug: args.bug,
        keep_trace: args.trace,
        source: args.source,
        write_mode: args.write_mode,
        faults: if args.calm {
            Faults::none()
        } else {
            let defaults = Faults::default();
            Faults {
                invisible_commit: args.invisible_commits.unwrap_or(defaults.invisible_commit),
                ..defaults
            }
        },
        ..SimConfig::default()
    };
    if let Some(seed) = args.seed {
        let report = outbox_sim::run(seed, &config);
        for line in &report.trace {
            println!("{line}");
        }
        print!("{report}");
        return if report.ok() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let started = Instant::now();
    let next = AtomicU64::new(args.first);
    let end = args.first + args.seeds;
    let reports: Vec<Report> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let seed = next.fetch_add(1, Ordering::Relaxed);
                        if seed >= end {
                            return out;
                        }
                        let report = outbox_sim::run(seed, &config);
                        if !report.ok() {
                            eprint!("{report}");
                        }
                        out.push(report);
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker"))
            .collect()
    });
    let summary = outbox_sim::Summary::of(&reports);
    println!("{summary}");
    println!(
        "{} seeds ({}..{}) in {:.1} s on {threads} threads",
        reports.len(),
        args.first,
        end - 1,
        started.elapsed().as_secs_f64()
    );
    if summary.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
