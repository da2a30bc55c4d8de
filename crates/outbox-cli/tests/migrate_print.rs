//! `outbox migrate --print`: the script a DBA applies with their own tool (psql, mariadb,
//! sqlite3) makes the same outbox `outbox migrate` makes, records itself as applied, and
//! printing writes nothing.

mod support;

use std::{
    io::Write,
    path::Path,
    process::{Command, Output, Stdio},
};

use outbox_testkit::{database_url, mysql_url, unique};
use sqlx::{Connection, Executor};
use support::run;

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "outbox failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs a database client with `script` on its standard input; panics with its output when it
/// fails.
fn apply(mut client: Command, script: &str) {
    let mut child = client
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the database client");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .expect("write the script");
    let out = child.wait_with_output().expect("run the database client");
    assert!(
        out.status.success(),
        "the client refused the script: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `outbox migrate --print` says there is nothing left, and `outbox migrate` finds the outbox
/// up to date.
fn assert_applied(url: &str, schema: &str) {
    let printed = stdout(&run(&[
        "migrate",
        "--print",
        "--database-url",
        url,
        "--schema",
        schema,
    ]));
    assert!(
        printed.contains("Nothing to apply"),
        "a second print still holds migrations:\n{printed}"
    );
    let migrated = stdout(&run(&[
        "migrate",
        "--database-url",
        url,
        "--schema",
        schema,
    ]));
    assert!(migrated.contains("is up to date"), "{migrated}");
}

#[tokio::test]
async fn a_printed_postgres_script_applied_with_psql_makes_the_outbox_migrate_makes() {
    let url = database_url();
    let scripted = unique("printed");
    let migrated = unique("migrated");
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();

    // Printed against the database, before the outbox exists: the whole script, and nothing
    // written (not even the schema).
    let script = stdout(&run(&[
        "migrate",
        "--print",
        "--database-url",
        &url,
        "--schema",
        &scripted,
        "--partitions",
        "8",
    ]));
    let schema_exists: bool = sqlx::query_scalar("SELECT to_regnamespace($1) IS NOT NULL")
        .bind(&scripted)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(!schema_exists, "printing created the schema");
    let offline = stdout(&run(&[
        "migrate",
        "--print",
        "--offline",
        "--database-url",
        "postgres://",
        "--schema",
        &scripted,
        "--partitions",
        "8",
    ]));
    assert_eq!(
        script, offline,
        "online and offline scripts of a new outbox differ"
    );
    assert!(script.contains("BEGIN;") && script.contains("COMMIT;"));

    let mut psql = Command::new("psql");
    psql.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", &url]);
    apply(psql, &script);
    stdout(&run(&[
        "migrate",
        "--database-url",
        &url,
        "--schema",
        &migrated,
        "--partitions",
        "8",
    ]));

    let dump = |schema: &str| {
        let out = Command::new("pg_dump")
            .args(["--schema-only", "--no-owner", "-n", schema, &url])
            .output()
            .expect("run pg_dump");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // pg_dump brackets its output with a random `\restrict` key: left out.
        String::from_utf8_lossy(&out.stdout)
            .replace(schema, "SCHEMA")
            .lines()
            .filter(|line| !line.starts_with("\\restrict") && !line.starts_with("\\unrestrict"))
            .map(|line| format!("{line}\n"))
            .collect::<String>()
    };
    let (a, b) = (dump(&scripted), dump(&migrated));
    assert!(a.contains("CREATE TABLE SCHEMA.events ("), "{a}");
    let differing: Vec<(&str, &str)> = a.lines().zip(b.lines()).filter(|(x, y)| x != y).collect();
    assert!(
        differing.is_empty() && a.len() == b.len(),
        "the printed script made another schema than `outbox migrate`: {differing:?}"
    );
    for schema in [&scripted, &migrated] {
        let settings: (i32, i64) = sqlx::query_as(&format!(
            "SELECT (SELECT partitions FROM \"{schema}\".meta),
                    (SELECT count(*) FROM \"{schema}\".leases)"
        ))
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert_eq!(settings, (8, 8), "partitions and leases of {schema}");
    }
    assert_applied(&url, &scripted);

    // An existing outbox is checked against what is asked, as `migrate` checks it.
    let o = run(&[
        "migrate",
        "--print",
        "--database-url",
        &url,
        "--schema",
        &scripted,
        "--partitions",
        "16",
    ]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("8"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    for schema in [&scripted, &migrated] {
        conn.execute(sqlx::raw_sql(&format!("DROP SCHEMA \"{schema}\" CASCADE")))
            .await
            .unwrap();
    }
}

#[test]
fn a_new_time_partitioned_outbox_is_refused_with_the_reason() {
    let o = run(&[
        "migrate",
        "--print",
        "--offline",
        "--database-url",
        "postgres://",
        "--time-partition-days",
        "7",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("cannot convert a new outbox to time partitions"),
        "{stderr}"
    );
}

#[test]
fn print_does_not_combine_with_cdc_and_offline_needs_print() {
    for args in [
        &[
            "migrate",
            "--print",
            "--cdc",
            "--database-url",
            "postgres://",
        ][..],
        &["migrate", "--offline", "--database-url", "postgres://"][..],
    ] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
    }
}

#[tokio::test]
async fn a_printed_mysql_script_applied_with_the_mariadb_client_makes_the_outbox_migrate_makes() {
    let server = mysql_url();
    let base = server
        .rsplit_once('/')
        .expect("a database in the URL")
        .0
        .to_owned();
    let mut admin = sqlx::MySqlConnection::connect(&server).await.unwrap();
    let (scripted, migrated) = (unique("printed"), unique("migrated"));
    for database in [&scripted, &migrated] {
        admin
            .execute(sqlx::raw_sql(&format!("CREATE DATABASE `{database}`")))
            .await
            .unwrap();
    }
    let scripted_url = format!("{base}/{scripted}");
    let migrated_url = format!("{base}/{migrated}");

    let script = stdout(&run(&[
        "migrate",
        "--print",
        "--database-url",
        &scripted_url,
        "--partitions",
        "4",
    ]));
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM information_schema.tables WHERE table_schema = ?")
            .bind(&scripted)
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert_eq!(tables, 0, "printing created tables");
    let offline = stdout(&run(&[
        "migrate",
        "--print",
        "--offline",
        "--database-url",
        "mysql://",
        "--partitions",
        "4",
    ]));
    assert_eq!(script, offline);

    let mut client = Command::new("mariadb");
    client.args(["-h", "127.0.0.1", "-u", "root", &scripted]);
    apply(client, &script);
    stdout(&run(&[
        "migrate",
        "--database-url",
        &migrated_url,
        "--partitions",
        "4",
    ]));

    let mut definitions = Vec::new();
    for database in [&scripted, &migrated] {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT CAST(table_name AS CHAR) FROM information_schema.tables
             WHERE table_schema = ? ORDER BY table_name",
        )
        .bind(database)
        .fetch_all(&mut admin)
        .await
        .unwrap();
        let mut text = String::new();
        for name in &names {
            let row: (String, String) =
                sqlx::query_as(&format!("SHOW CREATE TABLE `{database}`.`{name}`"))
                    .fetch_one(&mut admin)
                    .await
                    .unwrap();
            text.push_str(&row.1);
            text.push('\n');
        }
        let leases: i64 =
            sqlx::query_scalar(&format!("SELECT count(*) FROM `{database}`.outbox_leases"))
                .fetch_one(&mut admin)
                .await
                .unwrap();
        assert_eq!(leases, 4, "lease rows of {database}");
        definitions.push((names, text));
    }
    assert!(definitions[0].0.contains(&"outbox_events".to_owned()));
    assert_eq!(
        definitions[0], definitions[1],
        "the printed script made other tables than `outbox migrate`"
    );
    assert_applied(&scripted_url, "outbox");

    for database in [&scripted, &migrated] {
        admin
            .execute(sqlx::raw_sql(&format!("DROP DATABASE `{database}`")))
            .await
            .unwrap();
    }
}

/// The `sqlite_master` definitions of a SQLite file, in order.
async fn sqlite_schema(path: &Path) -> Vec<(String, String, Option<String>)> {
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query_as("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name")
        .fetch_all(&mut conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_printed_sqlite_script_applied_with_sqlite3_makes_the_outbox_migrate_makes() {
    let dir = std::env::temp_dir().join(unique("migrate-print"));
    std::fs::create_dir_all(&dir).unwrap();
    let scripted = dir.join("printed.db");
    let migrated = dir.join("migrated.db");
    let scripted_url = format!("sqlite://{}", scripted.display());

    let script = stdout(&run(&[
        "migrate",
        "--print",
        "--database-url",
        &scripted_url,
    ]));
    assert!(!scripted.exists(), "printing created the database file");
    assert!(script.contains("BEGIN IMMEDIATE;"), "{script}");

    // As documented: `sqlite3 FILE < SCRIPT` (the script turns on `.bail` itself).
    let mut sqlite3 = Command::new("sqlite3");
    sqlite3.arg(&scripted);
    apply(sqlite3, &script);
    stdout(&run(&[
        "migrate",
        "--database-url",
        &format!("sqlite://{}", migrated.display()),
    ]));
    let a = sqlite_schema(&scripted).await;
    assert!(
        a.iter().any(|(_, name, _)| name == "outbox_events"),
        "{a:?}"
    );
    assert_eq!(a, sqlite_schema(&migrated).await);
    assert_applied(&scripted_url, "outbox");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A printed SQLite script that meets an error (here: a view made after printing, naming the
/// table the rebuild renames) stops and commits nothing: the outbox stays at its migration,
/// whole, rather than left without its events table and recorded as migrated.
#[tokio::test]
async fn a_failing_sqlite_script_stops_and_commits_nothing() {
    let dir = std::env::temp_dir().join(unique("migrate-print"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("outbox.db");
    let url = format!("sqlite://{}", file.display());
    // An outbox at migration 6: the whole script, cut before migration 7 (the rebuild).
    let full = stdout(&run(&[
        "migrate",
        "--print",
        "--offline",
        "--database-url",
        &url,
    ]));
    let cut = full
        .find("-- Migration 0007")
        .expect("migration 7 in the script");
    let mut sqlite3 = Command::new("sqlite3");
    sqlite3.arg(&file);
    apply(sqlite3, &format!("{}COMMIT;\n", &full[..cut]));

    let script = stdout(&run(&["migrate", "--print", "--database-url", &url]));
    assert!(script.contains("-- Migration 0007"), "{script}");
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    conn.execute(
        "CREATE VIEW pending_orders AS SELECT * FROM outbox_events WHERE status = 'pending'",
    )
    .await
    .unwrap();
    let mut child = Command::new("sqlite3")
        .arg(&file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "the script went on past its error");
    let applied: i64 = sqlx::query_scalar("SELECT max(version) FROM outbox_migrations")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(applied, 6, "a migration was recorded although it failed");
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'outbox_events'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(events, 1, "the events table is gone");
    drop(conn);
    std::fs::remove_dir_all(&dir).unwrap();
}
