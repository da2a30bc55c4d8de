//! What is SQLite's own in the migrations; the contract all backends share is in
//! conformance.rs.

use outbox::{sqlite::SqliteOutbox, MigrateOptions, Outbox, Tables};
use outbox_testkit::{unique, SqliteFile};

#[tokio::test]
async fn partitions_and_time_partitioning_are_refused_by_name() {
    let db = SqliteFile::new().await;
    let outbox = SqliteOutbox::new(Tables::new(&unique("p"), "events").unwrap());
    for (options, expected) in [
        (
            MigrateOptions {
                partitions: Some(8),
                time_partition_days: None,
            },
            "outbox schema: partitions: a SQLite outbox has one partition (one relay at a time)",
        ),
        (
            MigrateOptions {
                partitions: None,
                time_partition_days: Some(1),
            },
            "outbox schema: time partitioning: time partitioning is available on PostgreSQL only",
        ),
    ] {
        let err = outbox.migrate(&db.pool, options).await.unwrap_err();
        assert_eq!(err.to_string(), expected);
        let err = outbox.migration_script(None, options).await.unwrap_err();
        assert_eq!(err.to_string(), expected);
    }
    let sql = outbox.tables().render_sqlite(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '{events}'",
    );
    let tables = || sqlx::query_scalar::<_, i64>(&sql).fetch_one(&db.pool);
    assert_eq!(tables().await.unwrap(), 0, "a refusal creates nothing");
    let one = MigrateOptions {
        partitions: Some(1),
        time_partition_days: None,
    };
    outbox.migrate(&db.pool, one).await.unwrap();
    assert_eq!(tables().await.unwrap(), 1);
}
