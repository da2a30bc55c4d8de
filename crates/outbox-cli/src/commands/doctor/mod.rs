//! `outbox doctor`: checks a set-up before (or while) the relay runs, one line per check, each
//! problem with the exact fix. Exit 0 when nothing fails (warnings allowed), 1 when a check
//! fails, 2 on bad input (no database URL, an unreadable config file).

use std::process::ExitCode;

use outbox_relayer::doctor::{database, Check, Level};

use super::{connect_existing, database_address, require_url, CommandResult, Db};
use crate::config;

/// Options of `outbox doctor`: the relay's own settings (`--mode cdc` adds the logical
/// replication checks; without a broker URL the broker is not checked).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    settings: super::relay::Settings,
    /// Print JSON for scripts: `{"checks": [{area, name, level, detail, fix}], "failed": n}`.
    #[arg(long)]
    json: bool,
}

/// Runs every check and prints them.
pub async fn run(args: Args) -> CommandResult {
    let cfg = args.settings.load()?;
    let database_url = require_url(cfg.database_url.as_deref())?.to_owned();
    // Identifiers are validated before any SQL is built from them.
    let tables = outbox::Tables::new(&cfg.relay.schema, &cfg.relay.table)?;

    let mut checks = config_checks(&cfg);
    let address = database_address(&database_url);
    let db = connect_existing(&database_url, 2).await;
    let found = match &db {
        Ok(db) => database::examine(db.examined(), &address, &tables).await,
        Err(error) => database::Found {
            checks: vec![database::unreachable(error, &address)],
            ..Default::default()
        },
    };
    checks.extend(found.checks);
    if cfg.relay.mode == outbox_relayer::Mode::Cdc {
        match &db {
            Ok(Db::Postgres(pool)) => checks
                .extend(outbox_relayer::postgres::cdc_checks(pool, &tables, &cfg.relay.cdc).await),
            Ok(_) => checks.push(Check::fail(
                "cdc",
                "database",
                "change data capture needs PostgreSQL",
                "use --mode poll with this database",
            )),
            Err(_) => {}
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
            outbox_relayer::publishers::probe::probe(url, cfg.broker_settings(), &destinations)
                .await,
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
            "correct the setting it names in the config file (see docs/configuration.md: \
             the configuration file)",
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
