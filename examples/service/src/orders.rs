//! The service's one endpoint: `POST /orders` saves the order and its `OrderPlaced` event in
//! one transaction.

use axum::{extract::State, http::StatusCode, routing::post, Json, Router};
use outbox::{postgres::PgOutbox, DomainEvent, Outbox, Tables};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

/// The event every placed order publishes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderPlaced {
    /// The order's id, also its aggregate id.
    pub order_id: i64,
    /// Who ordered.
    pub customer: String,
    /// What.
    pub sku: String,
    /// How many.
    pub qty: i64,
}

impl DomainEvent for OrderPlaced {
    const AGGREGATE_TYPE: &'static str = "order";
    const EVENT_TYPE: &'static str = "OrderPlaced";
}

/// The request body of `POST /orders`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewOrder {
    /// Who orders: 1 to 100 characters.
    pub customer: String,
    /// What: 1 to 64 characters.
    pub sku: String,
    /// How many: 1 to 1,000.
    pub qty: i64,
}

/// The answer to `POST /orders`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Placed {
    /// The new order's id.
    pub order_id: i64,
    /// Its `OrderPlaced` event's id: the broker message's id.
    pub event_id: Uuid,
}

/// Where orders are saved, beside the outbox.
#[derive(Clone)]
pub(crate) struct Shop {
    pub(crate) pool: PgPool,
    pub(crate) outbox: PgOutbox,
    insert: String,
}

impl Shop {
    /// Creates the orders table in the outbox's schema if it is missing.
    pub(crate) async fn install(pool: PgPool, tables: &Tables) -> Result<Self, sqlx::Error> {
        sqlx::query(&tables.render(
            "CREATE TABLE IF NOT EXISTS {schema}.orders (
                 id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                 customer text   NOT NULL,
                 sku      text   NOT NULL,
                 qty      bigint NOT NULL)",
        ))
        .execute(&pool)
        .await?;
        Ok(Self {
            pool,
            outbox: PgOutbox::new(tables.clone()),
            insert: tables.render(
                "INSERT INTO {schema}.orders (customer, sku, qty) VALUES ($1, $2, $3) RETURNING id",
            ),
        })
    }

    /// `POST /orders`.
    pub(crate) fn router(self) -> Router {
        Router::new().route("/orders", post(place)).with_state(self)
    }
}

async fn place(
    State(shop): State<Shop>,
    Json(order): Json<NewOrder>,
) -> Result<(StatusCode, Json<Placed>), (StatusCode, String)> {
    check(&order).map_err(|reason| (StatusCode::UNPROCESSABLE_ENTITY, reason))?;
    // The order and its event commit together, or neither does.
    let placed = async {
        let mut tx = shop.pool.begin().await?;
        let order_id: i64 = sqlx::query_scalar(&shop.insert)
            .bind(&order.customer)
            .bind(&order.sku)
            .bind(order.qty)
            .fetch_one(&mut *tx)
            .await?;
        let event = OrderPlaced {
            order_id,
            customer: order.customer,
            sku: order.sku,
            qty: order.qty,
        };
        let event_id = shop.outbox.publish(&mut tx, order_id, &event).await?;
        tx.commit().await?;
        Ok::<_, crate::BoxError>(Placed { order_id, event_id })
    }
    .await
    .map_err(|error| {
        tracing::error!(%error, "could not place an order");
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the order could not be saved; nothing was placed, try again\n".to_owned(),
        )
    })?;
    Ok((StatusCode::CREATED, Json(placed)))
}

/// What is wrong with `order`, named by field.
fn check(order: &NewOrder) -> Result<(), String> {
    let length = |field: &str, value: &str, max: usize| match value.chars().count() {
        0 => Err(format!("{field}: must not be empty\n")),
        n if n > max => Err(format!("{field}: at most {max} characters, not {n}\n")),
        // PostgreSQL's text cannot hold NUL: refused here, not retried as an outage.
        _ if value.contains('\0') => Err(format!("{field}: must not contain NUL\n")),
        _ => Ok(()),
    };
    length("customer", &order.customer, 100)?;
    length("sku", &order.sku, 64)?;
    if !(1..=1000).contains(&order.qty) {
        return Err(format!("qty: from 1 to 1000, not {}\n", order.qty));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(customer: &str, sku: &str, qty: i64) -> NewOrder {
        NewOrder {
            customer: customer.into(),
            sku: sku.into(),
            qty,
        }
    }

    #[test]
    fn a_bad_order_is_refused_with_its_field() {
        assert_eq!(check(&order("ada", "apple", 2)), Ok(()));
        assert_eq!(
            check(&order("", "apple", 2)).unwrap_err(),
            "customer: must not be empty\n"
        );
        assert_eq!(
            check(&order("ada", &"x".repeat(65), 2)).unwrap_err(),
            "sku: at most 64 characters, not 65\n"
        );
        assert_eq!(
            check(&order("ada", "apple", 0)).unwrap_err(),
            "qty: from 1 to 1000, not 0\n"
        );
        assert_eq!(
            check(&order("a\0da", "apple", 1)).unwrap_err(),
            "customer: must not contain NUL\n"
        );
    }
}
