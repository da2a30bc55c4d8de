//! The CDC relay's table path against a real PostgreSQL (`wal_level = logical`) and NATS
//! JetStream, in the three write modes: an aggregate that cannot be published waits in the
//! table while every other one streams on, and an aggregate in the table path resumes whatever
//! happened to its relay meanwhile (a dead head replayed or skipped while the relay was
//! stopped).

mod common;

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use futures::future::BoxFuture;

use common::cdc::{cdc_config, cdc_db, slot_caught_up, start, write, WAIT};
use outbox::{postgres::WriteMode, Event, Outbox};
use outbox_relayer::{admin::Admin, Message, PublishError, Publisher};
use outbox_testkit::{unique, wait_until, NatsReader, Report, TestDb, NATS_URL};

const MODES: [WriteMode; 3] = [WriteMode::Table, WriteMode::ZeroGrowth, WriteMode::WalOnly];

/// The real NATS publisher, refusing the events of aggregate type `sick` while `failing` is
/// set: transiently (503, a partition without a leader) or permanently.
struct Sick {
    inner: Arc<dyn Publisher>,
    failing: AtomicBool,
    permanent: bool,
}

impl Publisher for Sick {
    fn publish<'a>(&'a self, m: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            if m.aggregate_type == "sick" && self.failing.load(Ordering::SeqCst) {
                return Err(if self.permanent {
                    PublishError::permanent("injected: sick rejected")
                } else {
                    PublishError::transient("injected: sick unavailable")
                });
            }
            self.inner.publish(m).await
        })
    }
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn max_payload_bytes(&self) -> usize {
        self.inner.max_payload_bytes()
    }
}

/// A JetStream stream of the test's own, the [`Sick`] publisher in front of it (failing from
/// the start, `permanent`ly or not) and a CDC relay on `db` publishing through it.
struct SickRelay {
    prefix: String,
    reader: NatsReader,
    sick: Arc<Sick>,
    relay: outbox_relayer::RelayHandle,
}

impl SickRelay {
    async fn start(db: &TestDb, permanent: bool) -> Self {
        let prefix = unique("p");
        let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
        let sick = Arc::new(Sick {
            inner: common::nats(NATS_URL, &reader.stream).await,
            failing: AtomicBool::new(true),
            permanent,
        });
        let relay = start(db, sick.clone(), cdc_config(db, &prefix)).await;
        Self {
            prefix,
            reader,
            sick,
            relay,
        }
    }
}

/// Writes versions `versions` of aggregate `sick/1`, one transaction each.
async fn write_sick(db: &TestDb, mode: WriteMode, versions: std::ops::RangeInclusive<i64>) {
    let outbox = db.outbox().write_mode(mode);
    for v in versions {
        let mut tx = db.pool.begin().await.unwrap();
        outbox
            .enqueue(
                &mut tx,
                &Event::new("sick", "1", "Happened").aggregate_version(v),
            )
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
}

async fn scalar(db: &TestDb, sql: &str) -> i64 {
    sqlx::query_scalar(&db.tables.render(sql))
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// How many rows of `sick/1` have `status`.
async fn sick_rows(db: &TestDb, status: &str) -> i64 {
    sqlx::query_scalar(&db.tables.render(
        "SELECT count(*) FROM {schema}.{events} WHERE aggregate_type = 'sick' AND status = $1",
    ))
    .bind(status)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

async fn one_sick_aggregate_waits_in_the_table(mode: WriteMode) {
    let db = cdc_db(4).await;
    let SickRelay {
        prefix: _,
        reader,
        sick,
        relay,
    } = SickRelay::start(&db, false).await;
    // The sick aggregate first, alone in its transactions (batches of which nothing goes
    // out), then 200 events of twenty healthy aggregates.
    write_sick(&db, mode, 1..=3).await;
    let healthy = write(&db, mode, "healthy", 20, 10, 10).await;
    reader.wait_for(healthy, WAIT).await;
    // The stream went past the sick events: they wait in the table, with their attempts and
    // a hold, and the slot keeps no WAL for them.
    wait_until("the sick events to wait in the table", WAIT, || async {
        sick_rows(&db, "pending").await == 3
            && scalar(
                &db,
                "SELECT count(*) FROM {schema}.holds WHERE aggregate_type = 'sick' \
                 AND held_until IS NOT NULL",
            )
            .await
                == 1
    })
    .await;
    let attempted = scalar(
        &db,
        "SELECT coalesce(max(attempts), 0)::bigint FROM {schema}.{events} \
         WHERE aggregate_type = 'sick'",
    )
    .await;
    assert!(attempted >= 1, "the failed head has its attempts recorded");
    slot_caught_up(&db).await;
    assert_eq!(
        db.count("dead").await,
        0,
        "a transient failure never dead-letters"
    );
    // Healed: the aggregate goes out from the table, in order, and back to the stream.
    sick.failing.store(false, Ordering::SeqCst);
    let got = reader.wait_for(healthy + 3, WAIT).await;
    write_sick(&db, mode, 4..=5).await;
    let got = if got.len() >= healthy + 5 {
        got
    } else {
        reader.wait_for(healthy + 5, WAIT).await
    };
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();
    let report = Report::of(&got);
    assert_eq!(report.unique, healthy + 5, "{mode:?}: {report:?}");
    assert_eq!(report.order_violations, 0, "{mode:?}: {report:?}");
    reader.cleanup().await;
}

#[tokio::test]
async fn an_aggregate_failing_for_ever_waits_in_the_table_while_the_others_stream_on() {
    for mode in MODES {
        one_sick_aggregate_waits_in_the_table(mode).await;
    }
}

#[derive(Clone, Copy, Debug)]
enum Action {
    Replay,
    Skip,
}

/// A dead head parks `sick/1` with two events behind it; the relay stops; the operator acts;
/// a new relay publishes what the action released.
async fn released_while_stopped(mode: WriteMode, action: Action) {
    let db = cdc_db(4).await;
    let SickRelay {
        prefix,
        reader,
        sick,
        relay,
    } = SickRelay::start(&db, true).await;
    write_sick(&db, mode, 1..=3).await;
    let healthy = write(&db, mode, "healthy", 5, 4, 5).await;
    reader.wait_for(healthy, WAIT).await;
    wait_until(
        "the head dead and the rest parked in the table",
        WAIT,
        || async { sick_rows(&db, "dead").await == 1 && sick_rows(&db, "pending").await == 2 },
    )
    .await;
    slot_caught_up(&db).await;
    relay.shutdown().await.unwrap();

    sick.failing.store(false, Ordering::SeqCst);
    let dead: i64 = scalar(
        &db,
        "SELECT id FROM {schema}.{events} WHERE aggregate_type = 'sick' AND status = 'dead'",
    )
    .await;
    let admin = Admin::new(db.pool.clone(), &db.tables);
    let (acted, released) = match action {
        Action::Replay => (admin.replay(&[dead], "test", "fixed").await.unwrap(), 3),
        Action::Skip => (admin.skip(&[dead], "test", "abandoned").await.unwrap(), 2),
    };
    assert_eq!(acted, 1, "{action:?}");

    let relay = start(&db, sick.clone(), cdc_config(&db, &prefix)).await;
    let got = reader.wait_for(healthy + released, WAIT).await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();
    let report = Report::of(&got);
    assert_eq!(
        report.unique,
        healthy + released,
        "{mode:?} {action:?}: {report:?}"
    );
    assert_eq!(
        report.order_violations, 0,
        "{mode:?} {action:?}: {report:?}"
    );
    let versions: Vec<Option<i64>> = got
        .iter()
        .filter(|d| d.aggregate_type == "sick")
        .map(|d| d.version)
        .collect();
    let expected = match action {
        Action::Replay => vec![Some(1), Some(2), Some(3)],
        Action::Skip => vec![Some(2), Some(3)],
    };
    assert_eq!(versions, expected, "{mode:?} {action:?}");
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM {schema}.holds").await,
        0,
        "{mode:?} {action:?}: the aggregate is back with the stream"
    );
    reader.cleanup().await;
}

#[tokio::test]
async fn a_dead_head_replayed_while_the_relay_is_stopped_resumes_its_aggregate() {
    for mode in MODES {
        released_while_stopped(mode, Action::Replay).await;
    }
}

#[tokio::test]
async fn a_dead_head_skipped_while_the_relay_is_stopped_resumes_its_aggregate() {
    for mode in MODES {
        released_while_stopped(mode, Action::Skip).await;
    }
}

/// Emits table-less event content written by hand, as SQL text.
async fn emit(db: &TestDb, content: &str) {
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SELECT pg_logical_emit_message(true, $1, $2::text)::text")
        .bind(outbox::wal::prefix(&db.tables))
        .bind(content)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

/// Table-less content with `fields` besides an event id and a payload.
fn content(fields: &str) -> String {
    format!(
        r#"{{"v":1,"event_id":"{}","payload":"{{}}",{fields}}}"#,
        uuid::Uuid::now_v7()
    )
}

/// Hand-written table-less events the table would refuse, and a duplicate version of an
/// aggregate in the table path (which nothing checks when it is written), on `db`: each ends
/// as a dead letter naming what is wrong, and everything else flows.
async fn hostile_table_less_events_on(db: TestDb) {
    let SickRelay {
        prefix: _,
        reader,
        sick,
        relay,
    } = SickRelay::start(&db, false).await;
    let hostile = [
        (
            r#""aggregate_type":"","aggregate_id":"1","event_type":"T""#,
            "aggregate_type",
        ),
        (
            r#""aggregate_type":"h","aggregate_id":"1","event_type":"""#,
            "event_type",
        ),
        (
            r#""aggregate_type":"h","aggregate_id":"2","event_type":"T\u0000""#,
            "event_type",
        ),
        (
            r#""aggregate_type":"h","aggregate_id":"3","event_type":"T","schema_version":0"#,
            "schema_version",
        ),
        (
            r#""aggregate_type":"h","aggregate_id":"4","event_type":"T","headers":{"x":"\u0000"}"#,
            "headers.x",
        ),
    ];
    for (fields, _) in hostile {
        emit(&db, &content(fields)).await;
    }
    // Two events claiming version 1 of sick/1: both fail (the destination is down) and go to
    // the table, where the second cannot be written as it is.
    let sick_event =
        r#""aggregate_type":"sick","aggregate_id":"1","event_type":"T","aggregate_version":1"#;
    emit(&db, &content(sick_event)).await;
    emit(&db, &content(sick_event)).await;
    let healthy = write(&db, WriteMode::WalOnly, "healthy", 10, 5, 10).await;
    reader.wait_for(healthy, WAIT).await;
    wait_until("every hostile event to be a dead letter", WAIT, || async {
        db.count("dead").await == hostile.len() as i64 + 1
    })
    .await;
    let errors: Vec<(String, String)> = sqlx::query_as(&db.tables.render(
        "SELECT aggregate_type, last_error FROM {schema}.{events} WHERE status = 'dead' ORDER BY id",
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    for (fields, field) in hostile {
        assert!(
            errors
                .iter()
                .any(|(t, e)| t == "outbox.undecodable" && e.contains(field)),
            "{fields}: {errors:?}"
        );
    }
    assert!(
        errors
            .iter()
            .any(|(t, e)| t == "outbox.unwritable" && e.contains("aggregate_version")),
        "{errors:?}"
    );
    slot_caught_up(&db).await;
    // Healed: the first sick/1 event goes out; nothing else is pending.
    sick.failing.store(false, Ordering::SeqCst);
    let got = reader.wait_for(healthy + 1, WAIT).await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();
    assert_eq!(Report::of(&got).unique, healthy + 1);
    reader.cleanup().await;
}

#[tokio::test]
async fn hostile_table_less_events_are_dead_letters_and_the_rest_flows() {
    hostile_table_less_events_on(cdc_db(4).await).await;
}

#[tokio::test]
async fn on_a_time_partitioned_outbox_too() {
    let db = TestDb::on(
        &outbox_testkit::cdc_database_url(),
        outbox::postgres::MigrateOptions {
            partitions: Some(4),
            time_partition_days: Some(1),
        },
    )
    .await;
    hostile_table_less_events_on(common::cdc::with_slot(db).await).await;
}

/// The id of the dead row of aggregate type `kind` (waited for).
async fn dead_of(db: &TestDb, kind: &str) -> i64 {
    let sql = db.tables.render(
        "SELECT max(id) FROM {schema}.{events} WHERE status = 'dead' AND aggregate_type = $1",
    );
    let read = || async {
        sqlx::query_scalar::<_, Option<i64>>(&sql)
            .bind(kind)
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };
    wait_until(&format!("a dead letter of {kind}"), WAIT, || async {
        read().await.is_some()
    })
    .await;
    read().await.unwrap()
}

/// A dead event the table refuses (a duplicate version among table-less events) is written
/// as an unwritable dead letter under a key of its own, and does not park its aggregate on
/// that row (a hold no skip would find, the keys differing): the aggregate's later events go
/// out.
#[tokio::test]
async fn an_unwritable_dead_event_does_not_strand_its_aggregate() {
    let db = cdc_db(2).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let sick = Arc::new(Sick {
        inner: common::nats(NATS_URL, &reader.stream).await,
        failing: AtomicBool::new(true),
        permanent: true,
    });
    let mut config = cdc_config(&db, &prefix);
    // Dead at the first refusal: the table path is handed a dead event, which parks.
    config.retry.max_attempts = 1;
    let relay = start(&db, sick.clone(), config).await;
    let admin = Admin::new(db.pool.clone(), &db.tables);
    let first =
        r#""aggregate_type":"sick","aggregate_id":"1","event_type":"T","aggregate_version":1"#;
    emit(&db, &content(first)).await;
    let dead = dead_of(&db, "sick").await;
    admin
        .skip(&[dead], "test", "let the rest go")
        .await
        .unwrap();
    // Version 1 again: refused by the table, it is dead twice over.
    emit(&db, &content(first)).await;
    let unwritable = dead_of(&db, "outbox.unwritable").await;
    sick.failing.store(false, Ordering::SeqCst);
    admin
        .skip(&[unwritable], "test", "let the rest go")
        .await
        .unwrap();
    let second =
        r#""aggregate_type":"sick","aggregate_id":"1","event_type":"T","aggregate_version":2"#;
    emit(&db, &content(second)).await;
    let got = reader.wait_for(1, WAIT).await;
    assert_eq!(got[0].version, Some(2), "{got:?}");
    common::drained(&db, WAIT).await;
    wait_until("no hold left", WAIT, || async {
        scalar(&db, "SELECT count(*) FROM {schema}.holds").await == 0
    })
    .await;
    relay.shutdown().await.unwrap();
    reader.cleanup().await;
}

/// Events of a transaction larger than the relay's chunk (50,000 events) are published
/// before its commit arrives. A zero-growth row of a chunk whose aggregate goes to the table
/// path is deleted at that commit: it must be written into the table then, not counted on.
#[tokio::test]
async fn a_failing_aggregate_inside_a_chunked_zero_growth_transaction_loses_nothing() {
    let db = cdc_db(4).await;
    let SickRelay {
        prefix: _,
        reader,
        sick,
        relay,
    } = SickRelay::start(&db, false).await;
    // 60,000 events over 600 aggregates; sick/1's four versions spread over the first chunk
    // and the rest of the transaction.
    let mut events = Vec::with_capacity(60_004);
    let mut sick_version = 0;
    for i in 0..60_000usize {
        if [10, 30_000, 55_000, 59_990].contains(&i) {
            sick_version += 1;
            events.push(Event::new("sick", "1", "Happened").aggregate_version(sick_version));
        }
        events.push(
            Event::new("healthy", format!("a{}", i % 600), "Happened")
                .aggregate_version(i as i64 / 600 + 1),
        );
    }
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox()
        .write_mode(WriteMode::ZeroGrowth)
        .enqueue_batch(&mut tx, &events)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    reader.wait_for(60_000, WAIT).await;
    wait_until("sick/1 to wait in the table", WAIT, || async {
        sick_rows(&db, "pending").await == 4
    })
    .await;
    sick.failing.store(false, Ordering::SeqCst);
    let got = reader.wait_for(events.len(), WAIT).await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();
    let report = Report::of(&got);
    assert_eq!(report.unique, events.len(), "{report:?}");
    assert_eq!(report.order_violations, 0, "{report:?}");
    reader.cleanup().await;
}

/// A commit waiting for a synchronous standby reaches the stream before queries see its rows.
/// An event of a held aggregate in such a transaction must wait for its row, however long the
/// standby takes, not be given up (the stream position is confirmed past it).
/// Sets `synchronous_standby_names` on the server of `pool` and reloads it.
async fn standby(pool: &sqlx::PgPool, names: &str) {
    sqlx::query(&format!(
        "ALTER SYSTEM SET synchronous_standby_names = '{names}'"
    ))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("SELECT pg_reload_conf()")
        .execute(pool)
        .await
        .unwrap();
}

/// Names an absent synchronous standby, and returns once commits wait for it: the reload
/// reaches the checkpointer (which tells backends whether to wait) at a moment of its own, so
/// probe commits (writing a row of a table of their own) are made until one waits (it is then
/// cancelled: committed locally).
async fn commits_wait_for_an_absent_standby(pool: &sqlx::PgPool) {
    sqlx::query("CREATE TABLE IF NOT EXISTS public.sync_probe (at timestamptz)")
        .execute(pool)
        .await
        .unwrap();
    standby(pool, "absent").await;
    wait_until("a commit to wait for the standby", WAIT, || async {
        let mut probe = pool.acquire().await.unwrap();
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *probe)
            .await
            .unwrap();
        for statement in [
            "BEGIN",
            "SET LOCAL synchronous_commit = on",
            "INSERT INTO public.sync_probe VALUES (now())",
        ] {
            sqlx::query(statement).execute(&mut *probe).await.unwrap();
        }
        let commit = tokio::spawn(async move {
            sqlx::query("COMMIT").execute(&mut *probe).await.unwrap();
        });
        let waiting = || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
                 WHERE pid = $1 AND wait_event = 'SyncRep')",
            )
            .bind(pid)
            .fetch_one(pool)
            .await
            .unwrap()
        };
        wait_until("the probe commit to end or wait", WAIT, || async {
            commit.is_finished() || waiting().await
        })
        .await;
        let waited = !commit.is_finished();
        if waited {
            sqlx::query("SELECT pg_cancel_backend($1)")
                .bind(pid)
                .execute(pool)
                .await
                .unwrap();
        }
        commit.await.unwrap();
        waited
    })
    .await;
}

/// A CDC relay on `db` publishing through `sick`, and its metrics.
async fn start_watched(
    db: &TestDb,
    sick: Arc<Sick>,
    prefix: &str,
) -> (
    outbox_relayer::RelayHandle,
    Arc<outbox_relayer::telemetry::Metrics>,
) {
    let relay = outbox_relayer::Relay::builder(db.pool.clone(), sick, cdc_config(db, prefix))
        .replication_url(&db.url)
        .build()
        .await
        .expect("relay");
    let metrics = relay.metrics();
    (relay.spawn(), metrics)
}

/// A commit waiting for a synchronous standby is in the stream before queries see its rows.
/// A row of a held aggregate in it is passed only once visible: a relay restarted meanwhile
/// finds it (before the fix the stream confirmed past it, and after the restart the aggregate
/// was given back while it was invisible: it stayed pending for ever).
#[tokio::test]
async fn a_row_of_a_held_aggregate_not_yet_visible_survives_a_restart() {
    // A server of the test's own: its synchronous standby setting is changed. The relay's own
    // commits stay local; only the writer's waits for the (absent) standby.
    let server = outbox_testkit::PrivatePostgres::start_with(&[
        "wal_level=logical",
        "synchronous_commit=local",
    ])
    .await;
    let db = common::cdc::with_slot(common::cdc::outbox_on(&server.url(), 4).await).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let sick = Arc::new(Sick {
        inner: common::nats(NATS_URL, &reader.stream).await,
        failing: AtomicBool::new(true),
        permanent: false,
    });
    let (relay, metrics) = start_watched(&db, sick.clone(), &prefix).await;
    write_sick(&db, WriteMode::Table, 1..=1).await;
    wait_until("sick/1 to be held in the table", WAIT, || async {
        scalar(&db, "SELECT count(*) FROM {schema}.holds").await == 1
    })
    .await;

    commits_wait_for_an_absent_standby(&db.pool).await;
    let spilled = metrics.cdc_spilled.get();
    let writer = {
        let pool = db.pool.clone();
        let outbox = db.outbox();
        tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query("SET LOCAL synchronous_commit = on")
                .execute(&mut *tx)
                .await
                .unwrap();
            outbox
                .enqueue(
                    &mut tx,
                    &Event::new("sick", "1", "Happened").aggregate_version(2),
                )
                .await
                .unwrap();
            tx.commit().await.unwrap();
        })
    };
    // The stream carries the commit to the relay, which finds sick/1 held.
    wait_until("the relay to receive the invisible row", WAIT, || async {
        metrics.cdc_spilled.get() > spilled
    })
    .await;
    relay.shutdown().await.unwrap();
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
        )
        .await,
        1,
        "the writer's commit still waits"
    );

    sick.failing.store(false, Ordering::SeqCst);
    let (relay, metrics) = start_watched(&db, sick.clone(), &prefix).await;
    // The new relay either waits in the stream for the row (nothing confirmed past it), or,
    // as before the fix, publishes version 1 from the table and gives sick/1 back.
    wait_until(
        "the new relay to reach the row, or publish past it",
        WAIT,
        || async { metrics.cdc_spilled.get() > 0 || !reader.deliveries().is_empty() },
    )
    .await;
    standby(&db.pool, "").await;
    writer.await.unwrap();
    let got = reader.wait_for(2, WAIT).await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();
    let versions: Vec<Option<i64>> = got.iter().map(|d| d.version).collect();
    assert_eq!(versions, vec![Some(1), Some(2)]);
    reader.cleanup().await;
    drop(db);
    drop(server);
}
