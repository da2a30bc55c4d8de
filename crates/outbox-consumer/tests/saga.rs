//! Saga steps on the real PostgreSQL: each step is one transaction with the inbox, the
//! instance, the emitted events and the step's record; timeouts fire once; nothing a saga
//! receives is dropped silently.

use std::{
    collections::BTreeMap,
    future::Future,
    io,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use outbox::Event;
use outbox_consumer::{
    saga::{Saga, SagaHandler, Start, Step, Trigger, TIMEOUT},
    Envelope, HandlerError, Outcome, Processor,
};
use outbox_testkit::{wait_until, TestDb};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum State {
    AwaitingPayment,
    Paid,
    Cancelled,
}

#[derive(Serialize, Deserialize)]
struct Order {
    id: String,
    notes: u32,
}

/// A checkout: placed → awaiting payment → paid, or cancelled when payment does not come in
/// time (a payment after that is refunded). `Note` only counts; `Scribble` changes the data
/// and then ignores the event; `Boom` changes the data and then fails. Orders whose id starts
/// with `unstartable` cannot be started; the timeout step fails for those starting with
/// `poison` and panics for those starting with `panic`.
struct Checkout {
    payment_timeout: Duration,
}

impl Saga for Checkout {
    type State = State;
    type Data = Order;

    fn name(&self) -> &str {
        "checkout"
    }

    fn reacts_to(&self) -> &[&str] {
        &["OrderPlaced", "PaymentTaken", "Note", "Boom", "Scribble"]
    }

    fn correlate(&self, event: &Envelope) -> Option<String> {
        event.aggregate_id.clone()
    }

    fn start(&self, event: &Envelope) -> Result<Option<Start<State, Order>>, HandlerError> {
        if event.event_type != "OrderPlaced" {
            return Ok(None);
        }
        let id = event.aggregate_id.clone().unwrap_or_default();
        if id.starts_with("unstartable") {
            return Err(HandlerError::new(format!("order {id} cannot be started")));
        }
        let take_payment = Event::new("order", &id, "TakePayment");
        Ok(Some(
            Start::new(State::AwaitingPayment, Order { id, notes: 0 }).emit(take_payment),
        ))
    }

    fn react(
        &self,
        state: &State,
        order: &mut Order,
        on: &Trigger,
    ) -> Result<Step<State>, HandlerError> {
        use State::*;
        Ok(match (state, on.name()) {
            (_, "OrderPlaced") => Step::ignore("the order is placed already"),
            (AwaitingPayment, "PaymentTaken") => Step::to(Paid),
            (Cancelled, "PaymentTaken") => Step::ignore("paid after the cancellation")
                .emit(Event::new("order", &order.id, "RefundPayment")),
            (AwaitingPayment, TIMEOUT) if order.id.starts_with("panic") => {
                panic!("react panicked for {}", order.id)
            }
            (AwaitingPayment, TIMEOUT) if order.id.starts_with("poison") => {
                return Err(HandlerError::new(
                    "the timeout step cannot run for this order",
                ));
            }
            (AwaitingPayment, TIMEOUT) => {
                Step::to(Cancelled).emit(Event::new("order", &order.id, "CancelOrder"))
            }
            (_, "Note") => {
                order.notes += 1;
                Step::stay()
            }
            (_, "Scribble") => {
                order.notes += 100;
                Step::ignore("scribbled on the order, then ignored the event")
            }
            (_, "Boom") => {
                order.notes += 1000;
                return Err(HandlerError::new("boom"));
            }
            _ => Step::unexpected(format!("{} while {state:?}", on.name())),
        })
    }

    fn timeout(&self, state: &State) -> Option<Duration> {
        (*state == State::AwaitingPayment).then_some(self.payment_timeout)
    }

    fn is_final(&self, state: &State) -> bool {
        matches!(state, State::Paid | State::Cancelled)
    }
}

fn envelope(order: Option<&str>, event_type: &str) -> Envelope {
    let event_id = Uuid::now_v7();
    Envelope {
        event_id,
        message_id: event_id.to_string(),
        event_type: event_type.into(),
        schema_version: 1,
        aggregate_type: Some("order".into()),
        aggregate_id: order.map(str::to_owned),
        aggregate_version: None,
        occurred_at: None,
        copy_of_schema_version: None,
        destination: format!("order.{event_type}"),
        headers: BTreeMap::new(),
        payload: Bytes::from_static(b"{}"),
    }
}

struct Fixture {
    db: TestDb,
    saga: Arc<SagaHandler<Checkout>>,
    processor: Processor,
}

async fn fixture(payment_timeout: Duration) -> Fixture {
    let db = TestDb::new(4).await;
    let saga = Arc::new(SagaHandler::new(Checkout { payment_timeout }, &db.tables));
    let processor = Processor::new(db.pool.clone(), &db.tables, "checkout", saga.clone());
    Fixture {
        db,
        saga,
        processor,
    }
}

#[derive(Debug, PartialEq)]
struct Row {
    state: String,
    version: i64,
    notes: i64,
    finished: bool,
    has_deadline: bool,
}

impl Fixture {
    async fn instance(&self, id: &str) -> Option<Row> {
        let row: Option<(String, i64, i64, bool, bool)> = sqlx::query_as(&self.db.tables.render(
            "SELECT state, version, (data->>'notes')::bigint, finished, deadline IS NOT NULL \
             FROM {schema}.sagas WHERE saga_type = 'checkout' AND correlation_id = $1",
        ))
        .bind(id)
        .fetch_optional(&self.db.pool)
        .await
        .unwrap();
        row.map(|(state, version, notes, finished, has_deadline)| Row {
            state,
            version,
            notes,
            finished,
            has_deadline,
        })
    }

    async fn steps(&self, id: &str) -> Vec<(String, String, Option<String>, Option<String>)> {
        sqlx::query_as(&self.db.tables.render(
            "SELECT trigger, outcome, from_state, to_state FROM {schema}.saga_steps \
             WHERE correlation_id = $1 ORDER BY id",
        ))
        .bind(id)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }

    /// Writes an instance as an earlier version of the saga left it, by plain SQL, due a minute
    /// ago (before any instance the test starts).
    async fn stored(&self, id: &str, state: &str, data: serde_json::Value) {
        sqlx::query(&self.db.tables.render(
            "INSERT INTO {schema}.sagas (saga_type, correlation_id, state, data, deadline) \
             VALUES ('checkout', $1, $2, $3, now() - interval '1 minute')",
        ))
        .bind(id)
        .bind(state)
        .bind(data)
        .execute(&self.db.pool)
        .await
        .unwrap();
    }

    /// The last step recorded for the instance (outcome, from and to state, detail), and how
    /// many seconds until it is due.
    async fn last_step(
        &self,
        id: &str,
    ) -> (String, Option<String>, Option<String>, Option<String>, f64) {
        sqlx::query_as(&self.db.tables.render(
            "SELECT s.outcome, s.from_state, s.to_state, s.detail, \
                    extract(epoch FROM g.deadline - now())::float8 \
             FROM {schema}.saga_steps s JOIN {schema}.sagas g USING (saga_type, correlation_id) \
             WHERE s.correlation_id = $1 ORDER BY s.id DESC LIMIT 1",
        ))
        .bind(id)
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    async fn inbox(&self, event_id: Uuid) -> i64 {
        sqlx::query_scalar(
            &self
                .db
                .tables
                .render("SELECT count(*) FROM {schema}.inbox WHERE event_id = $1"),
        )
        .bind(event_id.to_string())
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    async fn emitted(&self, id: &str) -> Vec<(String, serde_json::Value)> {
        sqlx::query_as(&self.db.tables.render(
            "SELECT event_type, headers FROM {schema}.{events} WHERE aggregate_id = $1 ORDER BY id",
        ))
        .bind(id)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }
}

#[tokio::test]
async fn a_step_saves_the_instance_and_enqueues_what_it_emits_in_one_transaction() {
    let f = fixture(Duration::from_secs(600)).await;
    let placed = envelope(Some("o1"), "OrderPlaced");
    assert_eq!(
        f.processor.apply(&placed.to_message()).await.unwrap(),
        Outcome::Applied
    );

    let row = f.instance("o1").await.expect("instance created");
    assert_eq!(
        (row.state.as_str(), row.version, row.has_deadline),
        ("AwaitingPayment", 1, true)
    );
    let emitted = f.emitted("o1").await;
    assert_eq!(emitted.len(), 1);
    let (event_type, headers) = &emitted[0];
    assert_eq!(event_type, "TakePayment");
    assert_eq!(headers["correlation-id"], "o1");
    assert_eq!(headers["saga-type"], "checkout");
    assert_eq!(headers["causation-id"], placed.event_id.to_string());

    f.processor
        .apply(&envelope(Some("o1"), "PaymentTaken").to_message())
        .await
        .unwrap();
    let row = f.instance("o1").await.unwrap();
    assert_eq!(
        row,
        Row {
            state: "Paid".into(),
            version: 2,
            notes: 0,
            finished: true,
            has_deadline: false
        }
    );
    let steps = f.steps("o1").await;
    assert_eq!(
        steps,
        vec![
            (
                "OrderPlaced".into(),
                "started".into(),
                None,
                Some("AwaitingPayment".into())
            ),
            (
                "PaymentTaken".into(),
                "transitioned".into(),
                Some("AwaitingPayment".into()),
                Some("Paid".into())
            ),
        ]
    );
}

#[tokio::test]
async fn a_redelivered_event_is_not_applied_twice() {
    let f = fixture(Duration::from_secs(600)).await;
    f.processor
        .apply(&envelope(Some("o2"), "OrderPlaced").to_message())
        .await
        .unwrap();
    let note = envelope(Some("o2"), "Note");
    for _ in 0..3 {
        f.processor.apply(&note.to_message()).await.unwrap();
    }
    let row = f.instance("o2").await.unwrap();
    assert_eq!((row.notes, row.version), (1, 2), "one Note applied, once");
    assert_eq!(f.steps("o2").await.len(), 2);
}

#[tokio::test]
async fn a_failed_step_leaves_nothing_behind_and_is_retried_whole() {
    let f = fixture(Duration::from_secs(600)).await;
    f.processor
        .apply(&envelope(Some("o3"), "OrderPlaced").to_message())
        .await
        .unwrap();
    let boom = envelope(Some("o3"), "Boom");
    let err = f.processor.apply(&boom.to_message()).await.unwrap_err();
    assert!(err.to_string().contains("boom"), "{err}");
    let row = f.instance("o3").await.unwrap();
    assert_eq!((row.notes, row.version), (0, 1), "data change rolled back");
    assert_eq!(f.steps("o3").await.len(), 1, "no step recorded");
    assert_eq!(f.emitted("o3").await.len(), 1, "nothing more emitted");
    assert_eq!(
        f.inbox(boom.event_id).await,
        0,
        "the event is not marked seen: a redelivery runs the step again"
    );
}

/// Before: a payment that overtook its order was recorded as `orphan` and acknowledged, and
/// the order then waited for it until its timeout cancelled it.
#[tokio::test]
async fn an_event_for_no_instance_yet_is_retried_not_dropped() {
    let f = fixture(Duration::from_secs(600)).await;
    let early = envelope(Some("early"), "PaymentTaken");
    let err = f.processor.apply(&early.to_message()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "saga checkout \"early\": no instance yet, and PaymentTaken does not start one"
    );
    assert_eq!(f.inbox(early.event_id).await, 0, "not marked seen");
    assert!(f.steps("early").await.is_empty());
    // The order arrives; the retried payment then applies.
    f.processor
        .apply(&envelope(Some("early"), "OrderPlaced").to_message())
        .await
        .unwrap();
    assert_eq!(
        f.processor.apply(&early.to_message()).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(f.instance("early").await.unwrap().state, "Paid");
}

/// Before: `unexpected` was committed and acknowledged, so an event that overtook the one
/// leading to the state that expects it was lost.
#[tokio::test]
async fn an_unexpected_event_is_rolled_back_and_retried() {
    let f = fixture(Duration::from_secs(600)).await;
    f.processor
        .apply(&envelope(Some("o4"), "OrderPlaced").to_message())
        .await
        .unwrap();
    f.processor
        .apply(&envelope(Some("o4"), "PaymentTaken").to_message())
        .await
        .unwrap();
    let again = envelope(Some("o4"), "PaymentTaken");
    let err = f.processor.apply(&again.to_message()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "saga checkout \"o4\" in Paid: PaymentTaken not expected: PaymentTaken while Paid"
    );
    assert_eq!(f.inbox(again.event_id).await, 0, "not marked seen");
    assert_eq!(
        f.instance("o4").await.unwrap().version,
        2,
        "nothing written"
    );
    assert_eq!(f.steps("o4").await.len(), 2);
}

#[tokio::test]
async fn uncorrelated_events_are_recorded_and_others_skipped() {
    let f = fixture(Duration::from_secs(600)).await;
    f.processor
        .apply(&envelope(None, "PaymentTaken").to_message())
        .await
        .unwrap();
    // Not addressed to this saga: skipped without a trace.
    f.processor
        .apply(&envelope(Some("o5"), "Unrelated").to_message())
        .await
        .unwrap();
    assert_eq!(f.steps("").await[0].1, "uncorrelated");
    assert!(f.steps("o5").await.is_empty());
}

/// Before: `react` ran the starting arm again for the second `OrderPlaced` (new event id, same
/// order) and a second `TakePayment` was emitted.
#[tokio::test]
async fn a_second_start_event_does_not_start_the_instance_again() {
    let f = fixture(Duration::from_secs(600)).await;
    for _ in 0..2 {
        f.processor
            .apply(&envelope(Some("twice"), "OrderPlaced").to_message())
            .await
            .unwrap();
    }
    let types: Vec<String> = f
        .emitted("twice")
        .await
        .into_iter()
        .map(|(t, _)| t)
        .collect();
    assert_eq!(types, ["TakePayment"], "the payment is requested once");
    let outcomes: Vec<String> = f.steps("twice").await.into_iter().map(|s| s.1).collect();
    assert_eq!(outcomes, ["started", "ignored"]);
}

/// Before: `start` returned an `Option` and could not say why an event did not start.
#[tokio::test]
async fn start_can_fail_and_then_nothing_is_written() {
    let f = fixture(Duration::from_secs(600)).await;
    let placed = envelope(Some("unstartable-1"), "OrderPlaced");
    let err = f.processor.apply(&placed.to_message()).await.unwrap_err();
    assert_eq!(err.to_string(), "order unstartable-1 cannot be started");
    assert!(f.instance("unstartable-1").await.is_none());
    assert_eq!(f.inbox(placed.event_id).await, 0);
    assert!(f.emitted("unstartable-1").await.is_empty());
}

#[tokio::test]
async fn a_deadline_fires_once_even_with_two_schedulers_racing() {
    let f = fixture(Duration::ZERO).await;
    for n in 0..20 {
        f.processor
            .apply(&envelope(Some(&format!("t{n}")), "OrderPlaced").to_message())
            .await
            .unwrap();
    }
    let (a, b) = (
        f.saga.timeouts(f.db.pool.clone()),
        f.saga.timeouts(f.db.pool.clone()),
    );
    let (fired_a, fired_b) = tokio::join!(a.fire_due(), b.fire_due());
    assert_eq!(fired_a.unwrap() + fired_b.unwrap(), 20);
    assert_eq!(a.fire_due().await.unwrap(), 0, "nothing left to fire");
    for n in 0..20 {
        let id = format!("t{n}");
        let row = f.instance(&id).await.unwrap();
        assert_eq!(
            (row.state.as_str(), row.finished, row.has_deadline),
            ("Cancelled", true, false)
        );
        let types: Vec<String> = f.emitted(&id).await.into_iter().map(|(t, _)| t).collect();
        assert_eq!(types, ["TakePayment", "CancelOrder"]);
        assert_eq!(f.steps(&id).await[1].1, "timed_out");
    }
    // A payment after the timeout is ignored, and refunded.
    f.processor
        .apply(&envelope(Some("t0"), "PaymentTaken").to_message())
        .await
        .unwrap();
    assert_eq!(f.instance("t0").await.unwrap().state, "Cancelled");
    assert_eq!(f.steps("t0").await[2].1, "ignored");
    let types: Vec<String> = f.emitted("t0").await.into_iter().map(|(t, _)| t).collect();
    assert_eq!(types, ["TakePayment", "CancelOrder", "RefundPayment"]);
}

/// Before: `react` changed the data, returned `unexpected`, and the change was saved.
#[tokio::test]
async fn an_ignored_step_keeps_the_data_as_it_was() {
    let f = fixture(Duration::from_secs(3600)).await;
    f.processor
        .apply(&envelope(Some("s1"), "OrderPlaced").to_message())
        .await
        .unwrap();
    f.processor
        .apply(&envelope(Some("s1"), "Note").to_message())
        .await
        .unwrap();
    f.processor
        .apply(&envelope(Some("s1"), "Scribble").to_message())
        .await
        .unwrap();
    let row = f.instance("s1").await.unwrap();
    assert_eq!((row.state.as_str(), row.notes), ("AwaitingPayment", 1));
    assert_eq!(f.steps("s1").await.last().unwrap().1, "ignored");
}

/// Before: the failing instance, due first, failed every round before the others were tried,
/// so no later timeout of the saga type ever fired.
#[tokio::test]
async fn a_failing_timeout_step_is_put_off_and_does_not_hold_back_the_others() {
    let f = fixture(Duration::ZERO).await;
    for id in ["poison-1", "a", "b", "c"] {
        f.processor
            .apply(&envelope(Some(id), "OrderPlaced").to_message())
            .await
            .unwrap();
    }
    let timeouts = f.saga.timeouts(f.db.pool.clone());
    assert_eq!(timeouts.fire_due().await.unwrap(), 3);
    for id in ["a", "b", "c"] {
        assert_eq!(f.instance(id).await.unwrap().state, "Cancelled", "{id}");
    }
    // The failing one stays where it was, due again later, its failure recorded.
    let poison = f.instance("poison-1").await.unwrap();
    assert_eq!(
        (poison.state.as_str(), poison.has_deadline),
        ("AwaitingPayment", true)
    );
    let steps = f.steps("poison-1").await;
    assert_eq!(
        steps.last().unwrap(),
        &(
            TIMEOUT.to_owned(),
            "timeout_failed".to_owned(),
            Some("AwaitingPayment".to_owned()),
            Some("AwaitingPayment".to_owned())
        )
    );
    let (detail, wait): (String, f64) = sqlx::query_as(&f.db.tables.render(
        "SELECT s.detail, extract(epoch FROM g.deadline - now())::float8 \
         FROM {schema}.saga_steps s JOIN {schema}.sagas g USING (saga_type, correlation_id) \
         WHERE s.correlation_id = 'poison-1' ORDER BY s.id DESC LIMIT 1",
    ))
    .fetch_one(&f.db.pool)
    .await
    .unwrap();
    assert!(detail.contains("cannot run for this order"), "{detail}");
    assert!(wait > 0.0, "due again later, not now: {wait}");
    assert_eq!(
        timeouts.fire_due().await.unwrap(),
        0,
        "put off, not retried at once"
    );
    // Each consecutive failure doubles the delay.
    f.db.exec("UPDATE {schema}.sagas SET deadline = now() WHERE correlation_id = 'poison-1'")
        .await;
    assert_eq!(timeouts.fire_due().await.unwrap(), 0);
    let wait: f64 = sqlx::query_scalar(&f.db.tables.render(
        "SELECT extract(epoch FROM deadline - now())::float8 FROM {schema}.sagas \
         WHERE correlation_id = 'poison-1'",
    ))
    .fetch_one(&f.db.pool)
    .await
    .unwrap();
    let first = outbox_consumer::saga::TIMEOUT_RETRY_FIRST.as_secs_f64();
    assert!(
        wait > first * 1.5,
        "second failure waits about twice the first: {wait}"
    );
}

/// A log line sink shared with the test.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Every log line of this test binary, from a global subscriber installed once. A scoped
/// subscriber (`with_subscriber`) proved unreliable here: tracing caches whether a callsite is
/// wanted, and a test of this binary hitting the callsite while no subscriber existed left it
/// cached as unwanted; the line was then missing (twice in CI). With a global subscriber every
/// callsite is wanted from the start.
fn all_logs() -> &'static Logs {
    static LOGS: std::sync::OnceLock<Logs> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs::default();
        let sink = logs.clone();
        tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .with_writer(move || sink.clone())
                .with_ansi(false)
                .finish(),
        )
        .expect("the only global subscriber of this binary");
        logs
    })
}

/// Runs `future` and returns its output with the log lines written while it ran (other tests
/// of the binary may add theirs: look for a line by what it says).
async fn logged<T>(future: impl Future<Output = T>) -> (T, String) {
    let logs = all_logs();
    let start = logs.0.lock().unwrap().len();
    let output = future.await;
    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()[start..]).into_owned();
    (output, text)
}

/// A row that fails to decode is that instance's failure, not the round's: due first, it would
/// otherwise end every round before the deferral, and no other timeout of the saga type would
/// ever fire. The failure is recorded and logged with the saga type, correlation id and serde's
/// message.
#[tokio::test]
async fn an_instance_whose_state_no_longer_decodes_is_put_off_and_the_others_time_out() {
    let f = fixture(Duration::ZERO).await;
    f.processor
        .apply(&envelope(Some("healthy"), "OrderPlaced").to_message())
        .await
        .unwrap();
    // Stored by a version of the saga whose state was called `AwaitingPayout`.
    let data = json!({"id": "renamed", "notes": 0});
    f.stored("renamed", "AwaitingPayout", data).await;

    let timeouts = f.saga.timeouts(f.db.pool.clone());
    let (fired, logs) = logged(timeouts.fire_due()).await;
    assert_eq!(fired.unwrap(), 1, "the healthy instance timed out");
    assert_eq!(f.instance("healthy").await.unwrap().state, "Cancelled");

    let error = "saga checkout \"renamed\": stored state does not decode: unknown variant \
                 `AwaitingPayout`, expected one of `AwaitingPayment`, `Paid`, `Cancelled`";
    let (outcome, from, to, detail, wait) = f.last_step("renamed").await;
    assert_eq!(outcome, "timeout_failed");
    assert_eq!(
        (from.as_deref(), to.as_deref()),
        (Some("AwaitingPayout"), Some("AwaitingPayout"))
    );
    assert_eq!(detail.as_deref(), Some(error));
    assert!(wait > 0.0, "due again later, not now: {wait}");
    let row = f.instance("renamed").await.unwrap();
    assert_eq!(
        (row.state.as_str(), row.version),
        ("AwaitingPayout", 1),
        "left as it was"
    );
    let line = logs
        .lines()
        .find(|l| l.contains("saga timeout step failed") && l.contains("\"renamed\""))
        .unwrap_or_else(|| panic!("no WARN line for the failure in:\n{logs}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("saga=\"checkout\""), "{line}");
    assert!(line.contains("correlation_id=\"renamed\""), "{line}");
    assert!(line.contains(error), "{line}");
    assert_eq!(
        timeouts.fire_due().await.unwrap(),
        0,
        "put off, not retried at once"
    );
}

/// The same for `data` that no longer decodes (a field added without a default).
#[tokio::test]
async fn an_instance_whose_data_no_longer_decodes_is_put_off_and_the_others_time_out() {
    let f = fixture(Duration::ZERO).await;
    f.processor
        .apply(&envelope(Some("healthy"), "OrderPlaced").to_message())
        .await
        .unwrap();
    // Stored before `Order` had its `notes` field.
    f.stored("stale", "AwaitingPayment", json!({"id": "stale"}))
        .await;

    let timeouts = f.saga.timeouts(f.db.pool.clone());
    assert_eq!(timeouts.fire_due().await.unwrap(), 1);
    assert_eq!(f.instance("healthy").await.unwrap().state, "Cancelled");
    let (outcome, from, to, detail, wait) = f.last_step("stale").await;
    assert_eq!(outcome, "timeout_failed");
    let state = Some("AwaitingPayment");
    assert_eq!(
        (from.as_deref(), to.as_deref()),
        (state, state),
        "left as it was"
    );
    assert_eq!(
        detail.as_deref(),
        Some("saga checkout \"stale\": stored data does not decode: missing field `notes`")
    );
    assert!(wait > 0.0, "due again later, not now: {wait}");
    assert_eq!(
        timeouts.fire_due().await.unwrap(),
        0,
        "put off, not retried at once"
    );
}

/// A panic in `react` is that instance's failure: unwinding out of `fire_due`, it would end the
/// task running `run`, and no timeout of the saga type would fire again until a restart.
#[tokio::test]
async fn a_panicking_timeout_step_is_put_off_and_the_scheduler_goes_on() {
    let f = fixture(Duration::ZERO).await;
    f.processor
        .apply(&envelope(Some("panic-1"), "OrderPlaced").to_message())
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let scheduler = tokio::spawn(
        f.saga
            .timeouts(f.db.pool.clone())
            .interval(Duration::from_millis(20))
            .run(stop.clone()),
    );
    wait_until(
        "the panicking instance put off",
        Duration::from_secs(10),
        || async {
            f.steps("panic-1")
                .await
                .iter()
                .any(|s| s.1 == "timeout_failed")
        },
    )
    .await;
    // An instance due after the panic: the same task fires its timeout.
    f.processor
        .apply(&envelope(Some("after-panic"), "OrderPlaced").to_message())
        .await
        .unwrap();
    wait_until(
        "the next timeout fired",
        Duration::from_secs(10),
        || async { f.instance("after-panic").await.unwrap().state == "Cancelled" },
    )
    .await;
    assert!(!scheduler.is_finished(), "the scheduler still runs");
    let (outcome, _, _, detail, _) = f.last_step("panic-1").await;
    assert_eq!(outcome, "timeout_failed");
    assert_eq!(
        detail.as_deref(),
        Some("saga checkout \"panic-1\": timeout step panicked: react panicked for panic-1")
    );
    stop.cancel();
    scheduler
        .await
        .expect("the scheduler ends when stopped, not by a panic");
}

#[tokio::test]
async fn concurrent_steps_on_one_instance_serialise() {
    let f = fixture(Duration::from_secs(600)).await;
    f.processor
        .apply(&envelope(Some("c1"), "OrderPlaced").to_message())
        .await
        .unwrap();
    let notes = (0..24).map(|_| {
        let p = f.processor.clone();
        tokio::spawn(async move { p.apply(&envelope(Some("c1"), "Note").to_message()).await })
    });
    for r in futures::future::join_all(notes).await {
        r.unwrap().unwrap();
    }
    let row = f.instance("c1").await.unwrap();
    assert_eq!((row.notes, row.version), (24, 25));
}

#[tokio::test]
async fn concurrent_starts_create_one_instance() {
    let f = fixture(Duration::from_secs(600)).await;
    // Two different events that both start the same instance, at once: one creates it, the
    // other fails its step (the instance appeared) and succeeds when retried.
    let (a, b) = (
        envelope(Some("s1"), "OrderPlaced"),
        envelope(Some("s1"), "OrderPlaced"),
    );
    let (a, b) = (a.to_message(), b.to_message());
    let (ra, rb) = tokio::join!(f.processor.apply(&a), f.processor.apply(&b));
    for (r, e) in [(ra, &a), (rb, &b)] {
        if r.is_err() {
            f.processor.apply(e).await.unwrap();
        }
    }
    let row = f.instance("s1").await.unwrap();
    assert_eq!(
        row.version, 2,
        "created once, then the second start is a step on it"
    );
    let steps = f.steps("s1").await;
    assert_eq!(steps[0].1, "started");
    assert_eq!(steps[1].1, "ignored");
    assert_eq!(f.emitted("s1").await.len(), 1, "one TakePayment");
}
