//! The wire contract between the relay and consumers, written once: the header names every
//! message carries, and how they map to CloudEvents 1.0 attributes. The relay writes it
//! (`outbox-relayer`); the consumer runners read it (`outbox-consumer`).

/// Header names the relay sets on every message (user headers with the same name are replaced).
pub mod header {
    /// The event id (UUID): the consumer's idempotency key.
    pub const EVENT_ID: &str = "event-id";
    /// The event type (`OrderPlaced`).
    pub const EVENT_TYPE: &str = "event-type";
    /// The payload's schema version, for upcasting.
    pub const SCHEMA_VERSION: &str = "schema-version";
    /// The aggregate type (first half of the ordering key).
    pub const AGGREGATE_TYPE: &str = "aggregate-type";
    /// The aggregate id (second half of the ordering key; the partition key).
    pub const AGGREGATE_ID: &str = "aggregate-id";
    /// The aggregate version, when the writer gave one.
    pub const AGGREGATE_VERSION: &str = "aggregate-version";
    /// When the event was written (RFC 3339, UTC).
    pub const OCCURRED_AT: &str = "occurred-at";
    /// The payload's content type.
    pub const CONTENT_TYPE: &str = "content-type";

    /// On a fan-out copy only: the schema version of the stored event it was made from. A
    /// consumer that also reads the event's own destination skips the copies by it. The relay
    /// drops a writer's header of this name from every message that is not a copy.
    pub const COPY_OF_SCHEMA_VERSION: &str = "copy-of-schema-version";

    /// Every header above but [`COPY_OF_SCHEMA_VERSION`]: a writer's header of one of these
    /// names never travels as written.
    pub const ALL: [&str; 8] = [
        EVENT_ID,
        EVENT_TYPE,
        SCHEMA_VERSION,
        AGGREGATE_TYPE,
        AGGREGATE_ID,
        AGGREGATE_VERSION,
        OCCURRED_AT,
        CONTENT_TYPE,
    ];
}

/// The CloudEvents 1.0 envelope of the same contract.
pub mod cloudevents {
    use super::header;

    /// The media type of a structured-mode message.
    pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json";

    /// The prefixes of attribute headers in binary mode, lowercase, by protocol binding:
    /// `ce-` (HTTP, NATS), `ce_` (Kafka), `cloudevents:` and `cloudevents_` (AMQP).
    pub const BINARY_PREFIXES: [&str; 4] = ["ce-", "ce_", "cloudevents:", "cloudevents_"];

    /// Each CloudEvents attribute that carries a native header, and that header. `specversion`
    /// and `source` have no native header.
    pub const ATTRIBUTES: [(&str, &str); 8] = [
        ("id", header::EVENT_ID),
        ("type", header::EVENT_TYPE),
        ("subject", header::AGGREGATE_ID),
        ("time", header::OCCURRED_AT),
        ("datacontenttype", header::CONTENT_TYPE),
        ("schemaversion", header::SCHEMA_VERSION),
        ("aggregatetype", header::AGGREGATE_TYPE),
        ("aggregateversion", header::AGGREGATE_VERSION),
    ];
}
