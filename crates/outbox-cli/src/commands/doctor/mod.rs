//! `outbox doctor`: checks a set-up before (or while) the relay runs, one line per check, each
//! problem with the exact fix. Exit 0 when nothing fails (warnings allowed), 1 when a check
//! fails, 2 on bad input (no database URL, an unreadable config file).

mod cdc;
mod database;

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use outbox_relay::doctor::{Check, Level};

use super::{require_url, CommandResult};
use crate::config;

/// Options of `outbox doctor`. Flags override the config file and the environment, as for
/// `outbox relay`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Database URL: postgres://…, mysql://… or sqlite://path.
    #[arg(long, env = "OUTBOX_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Broker URL, as for `outbox relay` (without one the broker is not checked).
    #[arg(long, env = "OUTBOX_BROKER_URL", hide_env_values = true)]
    broker_url: Option<String>,
    /// The relay's TOML config file.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// The relay's mode: `cdc` adds the logical replication checks.
    #[arg(long, value_enum)]
    mode: Option<DoctorMode>,
    /// The address the relay will serve on (default: the config's `listen`).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Schema holding the outbox [default: outbox].
    #[arg(long)]
    schema: Option<String>,
    /// Events table in that schema [default: events].
    #[arg(long)]
    table: Option<String>,
    /// Print JSON for scripts: `{"checks": [{area, name, level, detail, fix}], "failed": n}`.
    #[arg(long)]
    json: bool,
}

/// `--mode`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum DoctorMode {
    Poll,
    Cdc,
}

/// Runs every check and prints them.
pub async fn run(args: Args) -> CommandResult {
    let mut cfg = config::load(args.config.as_deref())?;
    if let Some(url) = args.database_url {
        cfg.database_url = Some(url);
    }
    if let Some(url) = args.broker_url {
        cfg.broker_url = Some(url);
    }
    if let Some(listen) = args.listen {
        cfg.listen = listen;
    }
    if let Some(schema) = args.schema {
        cfg.relay.schema = schema;
    }
    if let Some(table) = args.table {
        cfg.relay.table = table;
    }
    match args.mode {
        Some(DoctorMode::Poll) => cfg.relay.mode = outbox_relay::Mode::Poll,
        Some(DoctorMode::Cdc) => cfg.relay.mode = outbox_relay::Mode::Cdc,
        None => {}
    }
    let database_url = require_url(cfg.database_url.as_deref())?.to_owned();
    // Identifiers are validated before any SQL is built from them.
    let tables = outbox::Tables::new(&cfg.relay.schema, &cfg.relay.table)?;

    let mut checks = config_checks(&cfg);
    let found = database::check(&database_url, &tables).await;
    checks.extend(found.checks);
    if cfg.relay.mode == outbox_relay::Mode::Cdc {
        match &found.postgres {
            Some(pool) => checks.extend(cdc::check(pool, &tables, &cfg.relay).await),
            None if found.reachable => checks.push(Check::fail(
                "cdc",
                "database",
                "change data capture needs PostgreSQL",
                "use --mode poll with this database",
            )),
            None => {}
        }
    }
    let destinations: Vec<String> = {
        let mut routed: Vec<String> = found
            .recent
            .iter()
            .map(|e| {
                cfg.relay.routing.route(
                    e.destination.as_deref(),
                    &e.aggregate_type,
                    &e.event_type,
                    e.schema_version,
                )
            })
            .collect();
        routed.sort();
        routed.dedup();
        routed
    };
    match cfg.broker_url.as_deref() {
        Some(url) => checks.extend(
            outbox_relay::publishers::probe::probe(url, cfg.broker_settings(), &destinations).await,
        ),
        None => checks.push(Check::warn(
            "broker",
            "URL",
            "no broker URL given: the broker was not checked",
            "pass --broker-url, set OUTBOX_BROKER_URL or broker_url in the config file",
        )),
    }
    let failed = checks.iter().filter(|c| c.level == Level::Fail).count();
    let warned = checks.iter().filter(|c| c.level == Level::Warn).count();
    if args.json {
        let doc = serde_json::json!({ "checks": checks, "failed": failed, "warnings": warned });
        super::print(&format!("{}\n", serde_json::to_string_pretty(&doc)?));
    } else {
        let mut out = String::new();
        for check in &checks {
            out.push_str(&check.line());
            out.push('\n');
        }
        out.push_str(&format!(
            "{} checks: {} passed, {warned} warnings, {failed} failed\n",
            checks.len(),
            checks.len() - failed - warned
        ));
        super::print(&out);
    }
    Ok(if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The relay's settings: they load (else the command has already exited with 2), the routing
/// templates render, and the dashboard is not open to the network without a token.
fn config_checks(cfg: &config::FileConfig) -> Vec<Check> {
    let mut checks = Vec::new();
    match cfg.relay.validate() {
        Ok(()) => checks.push(Check::ok(
            "config",
            "relay settings",
            "valid; every routing template renders",
        )),
        Err(error) => checks.push(Check::fail(
            "config",
            "relay settings",
            error.to_string(),
            "correct the setting it names in the config file (see README: configuration \
             reference)",
        )),
    }
    let token = cfg.admin_token.as_deref().is_some_and(|t| !t.is_empty());
    let listen = cfg.listen;
    if listen.ip().is_loopback() {
        checks.push(Check::ok(
            "config",
            "listen",
            format!("{listen}: only this machine reaches the dashboard and the API"),
        ));
    } else if token {
        checks.push(Check::ok(
            "config",
            "listen",
            format!("{listen} is reachable from the network; the dashboard's actions need the admin token"),
        ));
    } else {
        checks.push(Check::fail(
            "config",
            "listen",
            format!(
                "{listen} is reachable from the network and no admin token is set: anyone who \
                 reaches it reads the dead letters' payloads, and the dashboard cannot replay \
                 or skip"
            ),
            "set OUTBOX_ADMIN_TOKEN (or admin_token in the config file), or listen on \
             127.0.0.1 behind your own proxy",
        ));
    }
    checks
}
