//! Typed handlers on real PostgreSQL: messages built from the wire (header strings and payload
//! bytes, as a broker hands them over) reach the handler of their Rust type, upcast, or are
//! dead-lettered with the reason; the handler's writes commit with the inbox row. The orders
//! example runs the whole path (typed `publish`, relay, NATS or RabbitMQ, runners).

use std::{collections::BTreeMap, sync::Arc};

use futures::future::BoxFuture;
use outbox::DomainEvent;
use outbox_consumer::{
    Envelope, Handle, Handler, HandlerError, Handlers, Message, Outcome, Processor,
};
use outbox_testkit::TestDb;
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use uuid::Uuid;

/// Version 2: version 1 had no `region`.
#[derive(Debug, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: i64,
    sku: String,
    qty: i64,
    region: String,
}

impl DomainEvent for OrderPlaced {
    const AGGREGATE_TYPE: &'static str = "order";
    const EVENT_TYPE: &'static str = "OrderPlaced";
    const SCHEMA_VERSION: i32 = 2;
}

#[derive(Debug, Serialize, Deserialize)]
struct OrderCancelled {
    order_id: i64,
}

impl DomainEvent for OrderCancelled {
    const AGGREGATE_TYPE: &'static str = "order";
    const EVENT_TYPE: &'static str = "OrderCancelled";
}

/// The same event type name on another aggregate type, at a version of its own: version 1
/// called the field `id`.
#[derive(Debug, Serialize, Deserialize)]
struct CartCancelled {
    cart: String,
}

impl DomainEvent for CartCancelled {
    const AGGREGATE_TYPE: &'static str = "cart";
    const EVENT_TYPE: &'static str = "OrderCancelled";
    const SCHEMA_VERSION: i32 = 2;
}

/// Writes what it applied into `{schema}.log`, one row per event, through the transaction.
struct Log {
    sql: String,
}

impl Log {
    async fn install(db: &TestDb) -> Self {
        db.exec("CREATE TABLE {schema}.log (event_id uuid NOT NULL, what text NOT NULL)")
            .await;
        Self {
            sql: db
                .tables
                .render("INSERT INTO {schema}.log (event_id, what) VALUES ($1, $2)"),
        }
    }

    async fn write(
        &self,
        tx: &mut PgConnection,
        envelope: &Envelope,
        what: String,
    ) -> Result<(), HandlerError> {
        sqlx::query(&self.sql)
            .bind(envelope.event_id)
            .bind(what)
            .execute(tx)
            .await?;
        Ok(())
    }
}

impl Handle<OrderPlaced> for Log {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        placed: OrderPlaced,
        envelope: &Envelope,
    ) -> Result<(), HandlerError> {
        let what = format!(
            "placed {} {}x{} in {}",
            placed.order_id, placed.qty, placed.sku, placed.region
        );
        self.write(tx, envelope, what).await
    }
}

impl Handle<OrderCancelled> for Log {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        cancelled: OrderCancelled,
        envelope: &Envelope,
    ) -> Result<(), HandlerError> {
        let what = format!("cancelled order {}", cancelled.order_id);
        self.write(tx, envelope, what).await
    }
}

/// An `Arc<Log>` shares one log between several registrations.
struct Shared(Arc<Log>);

impl Handle<CartCancelled> for Shared {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        cancelled: CartCancelled,
        envelope: &Envelope,
    ) -> Result<(), HandlerError> {
        let what = format!("cancelled cart {}", cancelled.cart);
        self.0.write(tx, envelope, what).await
    }
}

/// The untyped fallback: logs the event type.
struct Fallback(Arc<Log>);

impl Handler for Fallback {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(
            self.0
                .write(tx, event, format!("other {}", event.event_type)),
        )
    }
}

/// A message as the relay's headers carry it: every value a string, the payload raw bytes.
fn message(
    aggregate_type: Option<&str>,
    event_type: &str,
    schema_version: &str,
    payload: &[u8],
) -> (Uuid, Message) {
    let id = Uuid::now_v7();
    let mut headers = BTreeMap::new();
    headers.insert("event-id".to_owned(), id.to_string());
    headers.insert("event-type".to_owned(), event_type.to_owned());
    headers.insert("schema-version".to_owned(), schema_version.to_owned());
    if let Some(kind) = aggregate_type {
        headers.insert("aggregate-type".to_owned(), kind.to_owned());
        headers.insert("aggregate-id".to_owned(), "7".to_owned());
    }
    headers.insert("content-type".to_owned(), "application/json".to_owned());
    (id, Message::new("orders", headers, payload.to_vec()))
}

/// A message's aggregate type, event type, schema version and payload, and the reason expected.
type Case<'a> = (Option<&'a str>, &'a str, &'a str, &'a [u8], &'a str);

fn handlers(log: &Arc<Log>) -> Handlers {
    Handlers::new()
        .on::<OrderPlaced>(Log {
            sql: log.sql.clone(),
        })
        .upcast::<OrderPlaced>(1, |mut v| {
            v.as_object_mut()
                .ok_or("an OrderPlaced payload is an object")?
                .insert("region".into(), "unknown".into());
            Ok(v)
        })
        .on::<OrderCancelled>(Log {
            sql: log.sql.clone(),
        })
        .on::<CartCancelled>(Shared(log.clone()))
        .upcast::<CartCancelled>(1, |mut v| {
            let id = v["id"].take();
            Ok(serde_json::json!({ "cart": id }))
        })
}

async fn logged(db: &TestDb) -> Vec<(Uuid, String)> {
    sqlx::query_as(
        &db.tables
            .render("SELECT event_id, what FROM {schema}.log ORDER BY what"),
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn each_event_type_reaches_its_typed_handler_upcast_to_its_version() {
    let db = TestDb::new(1).await;
    let log = Arc::new(Log::install(&db).await);
    let processor = Processor::new(
        db.pool.clone(),
        &db.tables,
        "typed",
        Arc::new(handlers(&log)),
    );

    let (v1, old) = message(
        Some("order"),
        "OrderPlaced",
        "1",
        br#"{"order_id": 7, "sku": "apple", "qty": 2}"#,
    );
    let (v2, new) = message(
        Some("order"),
        "OrderPlaced",
        "2",
        br#"{"order_id": 8, "sku": "pear", "qty": 1, "region": "eu"}"#,
    );
    let (order, cancel_order) =
        message(Some("order"), "OrderCancelled", "1", br#"{"order_id": 8}"#);
    let (cart, cancel_cart) = message(Some("cart"), "OrderCancelled", "2", br#"{"cart": "c9"}"#);
    let (old_cart, cancel_old_cart) =
        message(Some("cart"), "OrderCancelled", "1", br#"{"id": "c8"}"#);
    for m in [&old, &new, &cancel_order, &cancel_cart, &cancel_old_cart] {
        assert_eq!(processor.apply(m).await.unwrap(), Outcome::Applied);
    }
    // Redelivered: the inbox recognises it; the handler does not run again.
    assert_eq!(processor.apply(&old).await.unwrap(), Outcome::Duplicate);

    assert_eq!(
        logged(&db).await,
        vec![
            (old_cart, "cancelled cart c8".to_owned()),
            (cart, "cancelled cart c9".to_owned()),
            (order, "cancelled order 8".to_owned()),
            (v1, "placed 7 2xapple in unknown".to_owned()),
            (v2, "placed 8 1xpear in eu".to_owned()),
        ]
    );
}

#[tokio::test]
async fn what_cannot_reach_a_handler_in_its_shape_fails_permanently_with_the_reason() {
    let db = TestDb::new(1).await;
    let log = Arc::new(Log::install(&db).await);
    let processor = Processor::new(
        db.pool.clone(),
        &db.tables,
        "typed",
        Arc::new(handlers(&log)),
    );

    let cases: [Case; 6] = [
        // A writer deployed ahead of this consumer.
        (
            Some("order"),
            "OrderPlaced",
            "3",
            br#"{"order_id": 7}"#,
            "OrderPlaced schema_version 3 is newer than this consumer's current version 2",
        ),
        // A payload of another shape: the field's type is wrong.
        (
            Some("order"),
            "OrderPlaced",
            "2",
            br#"{"order_id": "seven", "sku": "apple", "qty": 2, "region": "eu"}"#,
            "order/OrderPlaced schema_version 2: the payload does not decode as",
        ),
        // Not JSON at all.
        (
            Some("order"),
            "OrderCancelled",
            "1",
            b"\xff\x00not json",
            "order/OrderCancelled schema_version 1: the payload does not decode as",
        ),
        // Not JSON, old version: the upcaster cannot read it.
        (
            Some("order"),
            "OrderPlaced",
            "1",
            b"<order/>",
            "OrderPlaced schema_version 1: payload is not JSON",
        ),
        // An event type nobody registered.
        (
            Some("order"),
            "OrderShipped",
            "1",
            b"{}",
            "no handler for order/OrderShipped (handled: cart/OrderCancelled, \
             order/OrderCancelled, order/OrderPlaced)",
        ),
        // A known event type under an aggregate type nobody registered.
        (
            Some("invoice"),
            "OrderCancelled",
            "1",
            b"{}",
            "no handler for invoice/OrderCancelled",
        ),
    ];
    for (aggregate, event_type, version, payload, reason) in cases {
        let (_, m) = message(aggregate, event_type, version, payload);
        let error = processor.apply(&m).await.unwrap_err();
        assert!(error.is_permanent(), "{event_type} v{version}: {error}");
        assert!(
            error.message().contains(reason),
            "{event_type} v{version}: {error}"
        );
    }
    // Two aggregate types share `OrderCancelled`: without an aggregate type it is ambiguous.
    let (_, m) = message(None, "OrderCancelled", "1", br#"{"order_id": 1}"#);
    let error = processor.apply(&m).await.unwrap_err();
    assert!(
        error
            .message()
            .contains("OrderCancelled names no aggregate type, and several handle it"),
        "{error}"
    );
    // Nothing was applied, nor recorded in the inbox: each can be replayed after a fix.
    assert!(logged(&db).await.is_empty());
    let inbox: i64 = sqlx::query_scalar(&db.tables.render("SELECT count(*) FROM {schema}.inbox"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(inbox, 0);
}

#[tokio::test]
async fn unknown_types_are_skipped_or_handed_on_when_the_consumer_says_so() {
    let db = TestDb::new(1).await;
    let log = Arc::new(Log::install(&db).await);

    let skipping = Processor::new(
        db.pool.clone(),
        &db.tables,
        "skipping",
        Arc::new(handlers(&log).skip_unknown()),
    );
    let (_, shipped) = message(Some("order"), "OrderShipped", "1", b"{}");
    assert_eq!(skipping.apply(&shipped).await.unwrap(), Outcome::Applied);
    assert_eq!(skipping.apply(&shipped).await.unwrap(), Outcome::Duplicate);
    assert!(logged(&db).await.is_empty());

    let handing_on = Processor::new(
        db.pool.clone(),
        &db.tables,
        "handing-on",
        Arc::new(handlers(&log).otherwise(Fallback(log.clone()))),
    );
    assert_eq!(handing_on.apply(&shipped).await.unwrap(), Outcome::Applied);
    // One aggregate type for the name: a message without one still finds it.
    let (placed, m) = message(
        None,
        "OrderPlaced",
        "2",
        br#"{"order_id": 1, "sku": "plum", "qty": 3, "region": "us"}"#,
    );
    assert_eq!(handing_on.apply(&m).await.unwrap(), Outcome::Applied);
    let ids = logged(&db).await;
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(ids[0].1, "other OrderShipped");
    assert_eq!(ids[1], (placed, "placed 1 3xplum in us".to_owned()));
}

#[tokio::test]
async fn a_closure_handles_an_event_and_a_failure_rolls_its_writes_back() {
    let db = TestDb::new(1).await;
    let log = Arc::new(Log::install(&db).await);
    let writer = log.clone();
    let handlers = Handlers::new().on_fn::<OrderCancelled, _>(move |tx, cancelled, envelope| {
        let log = writer.clone();
        Box::pin(async move {
            log.write(tx, envelope, format!("cancelled {}", cancelled.order_id))
                .await?;
            if cancelled.order_id == 13 {
                return Err(HandlerError::new("unlucky"));
            }
            Ok(())
        })
    });
    let processor = Processor::new(db.pool.clone(), &db.tables, "closure", Arc::new(handlers));
    let (id, ok) = message(Some("order"), "OrderCancelled", "1", br#"{"order_id": 12}"#);
    assert_eq!(processor.apply(&ok).await.unwrap(), Outcome::Applied);
    let (_, unlucky) = message(Some("order"), "OrderCancelled", "1", br#"{"order_id": 13}"#);
    let error = processor.apply(&unlucky).await.unwrap_err();
    assert!(!error.is_permanent(), "{error}");
    assert_eq!(logged(&db).await, vec![(id, "cancelled 12".to_owned())]);
}

#[test]
#[should_panic(expected = "order/OrderPlaced: a handler is registered twice")]
fn registering_a_type_twice_is_refused_at_start_up() {
    let _ = Handlers::new()
        .on_fn::<OrderPlaced, _>(|_, _, _| Box::pin(async { Ok(()) }))
        .on_fn::<OrderPlaced, _>(|_, _, _| Box::pin(async { Ok(()) }));
}

#[test]
#[should_panic(
    expected = "OrderCancelled: an upcaster from schema_version 1 goes past the current version 1"
)]
fn an_upcaster_past_the_types_version_is_refused_at_start_up() {
    let _ = Handlers::new().upcast::<OrderCancelled>(1, Ok);
}

#[test]
fn a_handlers_upcasts_per_type_and_gives_the_processor_no_upcasters() {
    let handlers = handlers_without_database();
    assert_eq!(handlers.upcasters().current_version("OrderPlaced"), None);
    assert_eq!(
        handlers.registered(),
        vec![
            ("cart", "OrderCancelled"),
            ("order", "OrderCancelled"),
            ("order", "OrderPlaced")
        ]
    );
}

fn handlers_without_database() -> Handlers {
    handlers(&Arc::new(Log { sql: String::new() }))
}

/// An untyped fallback that logs the version and payload it was given, with upcasters of its
/// own: `OrderShipped` 1 → 2 adds `carrier`.
struct Upcasting(Arc<Log>);

impl Handler for Upcasting {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        let what = format!(
            "other {}/{} v{} {}",
            event.aggregate_type.as_deref().unwrap_or("-"),
            event.event_type,
            event.schema_version,
            String::from_utf8_lossy(&event.payload)
        );
        Box::pin(self.0.write(tx, event, what))
    }

    fn upcasters(&self) -> outbox_consumer::Upcasters {
        outbox_consumer::Upcasters::new().register("OrderShipped", 1, |mut v| {
            v["carrier"] = "post".into();
            Ok(v)
        })
    }
}

/// `message` of aggregate `kind`/`id` at aggregate version `version`.
fn gated(
    kind: &str,
    id: &str,
    version: i64,
    event_type: &str,
    schema: &str,
    payload: &[u8],
) -> Message {
    let (_, m) = message(Some(kind), event_type, schema, payload);
    let mut headers = m.headers;
    headers.insert("aggregate-id".to_owned(), id.to_owned());
    headers.insert("aggregate-version".to_owned(), version.to_string());
    Message::new("orders", headers, payload.to_vec())
}

#[tokio::test]
async fn another_aggregates_event_of_a_handled_name_is_unknown_never_upcast_or_refused() {
    let db = TestDb::new(1).await;
    let log = Arc::new(Log::install(&db).await);
    // Skipped: a cart's `OrderPlaced` at a version the order's type does not know, and the
    // cart's next event after it, in its aggregate's order.
    let skipping = Processor::new(
        db.pool.clone(),
        &db.tables,
        "skipping",
        Arc::new(handlers(&log).skip_unknown()),
    )
    .with_version_gate(outbox_consumer::VersionGate::starting_at(1));
    let cart_placed = gated("cart", "k1", 1, "OrderPlaced", "3", br#"{"items": 2}"#);
    let cart_emptied = gated("cart", "k1", 2, "CartEmptied", "1", b"{}");
    let order_placed = gated(
        "order",
        "7",
        1,
        "OrderPlaced",
        "2",
        br#"{"order_id": 7, "sku": "fig", "qty": 1, "region": "eu"}"#,
    );
    for m in [&cart_placed, &cart_emptied, &order_placed] {
        assert_eq!(skipping.apply(m).await.unwrap(), Outcome::Applied);
    }
    let held: i64 = sqlx::query_scalar(
        &db.tables
            .render("SELECT count(*) FROM {schema}.consumer_held"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(held, 0);

    // Handed on as it came (version 1, payload untouched), not as the order's version 2; and
    // upcast with the fallback's own upcasters.
    let handing_on = Processor::new(
        db.pool.clone(),
        &db.tables,
        "handing-on",
        Arc::new(handlers(&log).otherwise(Upcasting(log.clone()))),
    );
    let (_, cart_v1) = message(Some("cart"), "OrderPlaced", "1", br#"{"cart":"c1"}"#);
    assert_eq!(handing_on.apply(&cart_v1).await.unwrap(), Outcome::Applied);
    let (_, shipped) = message(Some("order"), "OrderShipped", "1", br#"{"order_id":7}"#);
    assert_eq!(handing_on.apply(&shipped).await.unwrap(), Outcome::Applied);
    let (_, too_new) = message(Some("order"), "OrderShipped", "5", br#"{"order_id":7}"#);
    let error = handing_on.apply(&too_new).await.unwrap_err();
    assert!(error.is_permanent(), "{error}");
    assert!(
        error.message().contains(
            "OrderShipped schema_version 5 is newer than this consumer's current version 2"
        ),
        "{error}"
    );
    let whats: Vec<String> = logged(&db).await.into_iter().map(|(_, w)| w).collect();
    assert_eq!(
        whats,
        vec![
            r#"other cart/OrderPlaced v1 {"cart":"c1"}"#.to_owned(),
            r#"other order/OrderShipped v2 {"carrier":"post","order_id":7}"#.to_owned(),
            "placed 7 1xfig in eu".to_owned(),
        ]
    );
}

#[tokio::test]
async fn a_message_several_handlers_could_take_is_never_skipped_unapplied() {
    let db = TestDb::new(1).await;
    let log = Arc::new(Log::install(&db).await);
    let processor = Processor::new(
        db.pool.clone(),
        &db.tables,
        "skipping",
        Arc::new(handlers(&log).skip_unknown()),
    );
    // `OrderCancelled` is handled for `order` and for `cart`: without an aggregate type (or
    // with an empty one) nobody can tell which, and skipping would acknowledge it unapplied.
    for kind in [None, Some("")] {
        let (_, m) = message(kind, "OrderCancelled", "1", br#"{"order_id": 1}"#);
        let error = processor.apply(&m).await.unwrap_err();
        assert!(error.is_permanent(), "{error}");
        assert!(
            error.message().contains(
                "OrderCancelled names no aggregate type, and several handle it: \
                 cart/OrderCancelled, order/OrderCancelled"
            ),
            "{error}"
        );
    }
    // An empty aggregate type is no aggregate type: the only handler of its event type takes it.
    let (placed, m) = message(
        Some(""),
        "OrderPlaced",
        "2",
        br#"{"order_id": 3, "sku": "kiwi", "qty": 1, "region": "eu"}"#,
    );
    assert_eq!(processor.apply(&m).await.unwrap(), Outcome::Applied);
    assert_eq!(
        logged(&db).await,
        vec![(placed, "placed 3 1xkiwi in eu".to_owned())]
    );
}

#[tokio::test]
async fn a_panicking_upcaster_dead_letters_its_message_and_counts_as_a_panic() {
    let db = TestDb::new(1).await;
    let log = Arc::new(Log::install(&db).await);
    let handlers = Handlers::new()
        .on::<OrderPlaced>(Log {
            sql: log.sql.clone(),
        })
        .upcast::<OrderPlaced>(1, |v| {
            let sku = v["sku"].as_str().expect("a sku");
            Ok(serde_json::json!({ "sku": sku }))
        });
    let processor = Processor::new(db.pool.clone(), &db.tables, "typed", Arc::new(handlers));
    let (_, m) = message(Some("order"), "OrderPlaced", "1", br#"{"order_id": 1}"#);
    let error = processor.apply(&m).await.unwrap_err();
    assert!(error.is_permanent(), "{error}");
    assert!(
        error
            .message()
            .starts_with("OrderPlaced: the upcaster from schema_version 1 panicked"),
        "{error}"
    );
    assert_eq!(
        processor
            .metrics()
            .count("typed", outbox_consumer::Count::Panics),
        1
    );
    assert!(logged(&db).await.is_empty());
}
