//! The shop's SQL in each dialect. The shop's tables live where the run put them (a schema of
//! its own on PostgreSQL, a database of its own on MySQL, a file of its own on SQLite), next to
//! the outbox.

use outbox::Tables;

/// The database a [`Statements`] set is written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// PostgreSQL: `$n` parameters, tables in the run's schema.
    Postgres,
    /// MySQL and MariaDB: `?` parameters, tables in the run's database.
    MySql,
    /// SQLite: `?` parameters, tables in the run's file.
    Sqlite,
}

/// Every statement the shop and its summary run. Parameters are bound in the order the
/// comments give, on every dialect.
#[derive(Clone, Debug)]
pub struct Statements {
    /// Creates the shop's tables. `applied_log` has no unique key on purpose: it records every
    /// application, so a double one shows.
    pub install: Vec<String>,
    /// Stocks a product: sku, available.
    pub stock: String,
    /// id, customer, sku, qty.
    pub insert_order: String,
    /// qty, qty, sku.
    pub reserve: String,
    /// order id, message.
    pub notify: String,
    /// consumer, event id (text).
    pub log: String,
    /// Distinct (consumer, event) applications.
    pub applied_pairs: String,
    /// (consumer, event) pairs applied more than once.
    pub applied_twice: String,
    /// Orders placed.
    pub orders: String,
    /// Units ordered.
    pub ordered: String,
    /// Units reserved.
    pub reserved: String,
    /// Notifications sent.
    pub notifications: String,
    /// Events in the outbox.
    pub events: String,
    /// Events still pending.
    pub pending: String,
    /// Events marked published.
    pub published: String,
}

impl Statements {
    /// The statements for `dialect`, with the outbox in `tables`.
    pub fn new(dialect: Dialect, tables: &Tables) -> Self {
        let (prefix, events) = match dialect {
            Dialect::Postgres => (
                tables.render("{schema}."),
                tables.render("{schema}.{events}"),
            ),
            Dialect::MySql | Dialect::Sqlite => (String::new(), tables.render_mysql("{events}")),
        };
        let table = |name: &str| format!("{prefix}{name}");
        let params = |sql: &str| match dialect {
            Dialect::Postgres => numbered(sql),
            Dialect::MySql | Dialect::Sqlite => sql.to_owned(),
        };
        let (text, sum) = match dialect {
            Dialect::Postgres => ("text", "coalesce(sum({}), 0)::bigint"),
            Dialect::MySql => ("varchar(64)", "CAST(coalesce(sum({}), 0) AS SIGNED)"),
            Dialect::Sqlite => ("text", "coalesce(sum({}), 0)"),
        };
        let (orders, stock, notifications, log) = (
            table("orders"),
            table("stock"),
            table("notifications"),
            table("applied_log"),
        );
        Self {
            install: vec![
                format!(
                    "CREATE TABLE {orders} (id bigint PRIMARY KEY, customer {text} NOT NULL, \
                     sku {text} NOT NULL, qty bigint NOT NULL)"
                ),
                format!(
                    "CREATE TABLE {stock} (sku varchar(16) PRIMARY KEY, available bigint NOT \
                     NULL, reserved bigint NOT NULL DEFAULT 0)"
                ),
                format!(
                    "CREATE TABLE {notifications} (order_id bigint NOT NULL, message {text} \
                     NOT NULL)"
                ),
                format!(
                    "CREATE TABLE {log} (consumer varchar(32) NOT NULL, event_id char(36) NOT \
                     NULL)"
                ),
            ],
            stock: params(&format!(
                "INSERT INTO {stock} (sku, available) VALUES (?, ?)"
            )),
            insert_order: params(&format!(
                "INSERT INTO {orders} (id, customer, sku, qty) VALUES (?, ?, ?, ?)"
            )),
            reserve: params(&format!(
                "UPDATE {stock} SET available = available - ?, reserved = reserved + ? \
                 WHERE sku = ?"
            )),
            notify: params(&format!(
                "INSERT INTO {notifications} (order_id, message) VALUES (?, ?)"
            )),
            log: params(&format!(
                "INSERT INTO {log} (consumer, event_id) VALUES (?, ?)"
            )),
            applied_pairs: format!(
                "SELECT count(*) FROM (SELECT DISTINCT consumer, event_id FROM {log}) a"
            ),
            applied_twice: format!(
                "SELECT count(*) FROM (SELECT 1 FROM {log} GROUP BY consumer, event_id \
                 HAVING count(*) > 1) d"
            ),
            orders: format!("SELECT count(*) FROM {orders}"),
            ordered: format!("SELECT {} FROM {orders}", sum.replace("{}", "qty")),
            reserved: format!("SELECT {} FROM {stock}", sum.replace("{}", "reserved")),
            notifications: format!("SELECT count(*) FROM {notifications}"),
            pending: format!("SELECT count(*) FROM {events} WHERE status = 'pending'"),
            published: format!("SELECT count(*) FROM {events} WHERE status = 'published'"),
            events: format!("SELECT count(*) FROM {events}"),
        }
    }
}

/// `?` placeholders as PostgreSQL's `$1`, `$2`, … (the shop's statements hold no `?` in
/// literals).
fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_statements_number_their_parameters_in_the_schema_of_the_run() {
        let sql = Statements::new(
            Dialect::Postgres,
            &Tables::new("orders_1", "events").unwrap(),
        );
        assert_eq!(
            sql.reserve,
            "UPDATE \"orders_1\".stock SET available = available - $1, reserved = reserved + $2 \
             WHERE sku = $3"
        );
        assert_eq!(
            sql.pending,
            "SELECT count(*) FROM \"orders_1\".\"events\" WHERE status = 'pending'"
        );
    }

    #[test]
    fn mysql_and_sqlite_statements_keep_question_marks_and_the_prefixed_outbox() {
        for dialect in [Dialect::MySql, Dialect::Sqlite] {
            let sql = Statements::new(dialect, &Tables::default());
            assert_eq!(
                sql.insert_order,
                "INSERT INTO orders (id, customer, sku, qty) VALUES (?, ?, ?, ?)"
            );
            assert_eq!(sql.events, "SELECT count(*) FROM outbox_events");
        }
        assert!(Statements::new(Dialect::MySql, &Tables::default())
            .reserved
            .contains("AS SIGNED"));
    }
}
