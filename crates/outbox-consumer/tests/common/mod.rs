//! A stock-reserving handler that records every application, so a test can count them.
#![allow(dead_code)]

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use futures::future::BoxFuture;
use outbox_consumer::{Envelope, Handler, HandlerError, Processor};
use outbox_testkit::TestDb;
use sqlx::PgConnection;
use uuid::Uuid;

/// Reserves `qty` of `sku` (from the JSON payload) and logs the event id in `applied`
/// (deliberately without a unique key: a double application would show).
pub struct ReserveStock {
    stock_sql: String,
    log_sql: String,
    /// Fail this many times per event before succeeding.
    pub fail_first: u32,
    /// Always fail events of this type.
    pub poison_type: Option<String>,
    /// Handler calls per event id.
    pub calls: Mutex<HashMap<Uuid, u32>>,
}

impl ReserveStock {
    pub async fn install(db: &TestDb) -> Self {
        db.exec(
            "CREATE TABLE {schema}.stock (sku text PRIMARY KEY, reserved int NOT NULL DEFAULT 0);
             CREATE TABLE {schema}.applied (event_id uuid NOT NULL);
             INSERT INTO {schema}.stock (sku) VALUES ('apple'), ('pear');",
        )
        .await;
        Self {
            stock_sql: db
                .tables
                .render("UPDATE {schema}.stock SET reserved = reserved + $2 WHERE sku = $1"),
            log_sql: db
                .tables
                .render("INSERT INTO {schema}.applied (event_id) VALUES ($1)"),
            fail_first: 0,
            poison_type: None,
            calls: Mutex::new(HashMap::new()),
        }
    }

    pub fn calls(&self, id: Uuid) -> u32 {
        self.calls.lock().unwrap().get(&id).copied().unwrap_or(0)
    }
}

impl Handler for ReserveStock {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let n = {
                let mut calls = self.calls.lock().unwrap();
                let n = calls.entry(event.event_id).or_insert(0);
                *n += 1;
                *n
            };
            if self.poison_type.as_deref() == Some(event.event_type.as_str()) {
                return Err(HandlerError::new("cannot reserve: poison"));
            }
            let body: serde_json::Value = event.json()?;
            sqlx::query(&self.stock_sql)
                .bind(body["sku"].as_str().unwrap_or_default())
                .bind(body["qty"].as_i64().unwrap_or(0) as i32)
                .execute(&mut *tx)
                .await?;
            sqlx::query(&self.log_sql)
                .bind(event.event_id)
                .execute(&mut *tx)
                .await?;
            if n <= self.fail_first {
                // The writes above are rolled back with the transaction.
                return Err(HandlerError::new(format!("transient failure {n}")));
            }
            Ok(())
        })
    }
}

pub fn processor(db: &TestDb, name: &str, handler: Arc<ReserveStock>) -> Processor {
    Processor::new(db.pool.clone(), &db.tables, name, handler)
}

pub async fn applied(db: &TestDb) -> i64 {
    sqlx::query_scalar(&db.tables.render("SELECT count(*) FROM {schema}.applied"))
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

pub async fn distinct_applied(db: &TestDb) -> i64 {
    sqlx::query_scalar(
        &db.tables
            .render("SELECT count(DISTINCT event_id) FROM {schema}.applied"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

pub async fn reserved(db: &TestDb, sku: &str) -> i64 {
    sqlx::query_scalar::<_, i32>(
        &db.tables
            .render("SELECT reserved FROM {schema}.stock WHERE sku = $1"),
    )
    .bind(sku)
    .fetch_one(&db.pool)
    .await
    .unwrap() as i64
}

/// Headers as the relay sets them.
pub fn relay_headers(id: Uuid, event_type: &str) -> Vec<(&'static str, String)> {
    vec![
        ("event-id", id.to_string()),
        ("event-type", event_type.to_owned()),
        ("schema-version", "1".into()),
        ("aggregate-type", "order".into()),
        ("aggregate-id", "o-1".into()),
        ("content-type", "application/json".into()),
    ]
}
