//! Typed events: a Rust type bound to its aggregate type, event type and schema version.

use std::fmt::Display;

use crate::{error::Error, event::Event};

/// A Rust type that is one event type of one aggregate type, serialised as its JSON payload.
///
/// The three names are what the relay routes on and what consumers match: implementing this
/// once, in a crate that writers and consumers share, keeps them from drifting apart.
/// `outbox-consumer`'s `Handlers` decodes the same type on the other side.
///
/// ```
/// use outbox::{DomainEvent, Event};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct OrderPlaced {
///     order_id: i64,
///     total: String,
/// }
///
/// impl DomainEvent for OrderPlaced {
///     const AGGREGATE_TYPE: &'static str = "order";
///     const EVENT_TYPE: &'static str = "OrderPlaced";
/// }
///
/// let placed = OrderPlaced { order_id: 42, total: "19.90".into() };
/// // `outbox.publish(&mut tx, 42, &placed)` writes it; `Event::of` when more is to be set.
/// let event = Event::of(42, &placed)?.aggregate_version(1);
/// assert_eq!(event.aggregate(), ("order", "42"));
/// assert_eq!(event.kind(), "OrderPlaced");
/// # Ok::<(), outbox::Error>(())
/// ```
pub trait DomainEvent: serde::Serialize {
    /// The aggregate type: with the aggregate id, the ordering key (`"order"`).
    const AGGREGATE_TYPE: &'static str;
    /// The event type consumers match on (`"OrderPlaced"`).
    const EVENT_TYPE: &'static str;
    /// The version of this type's payload schema (1 unless it evolved); consumers upcast
    /// older versions to it.
    const SCHEMA_VERSION: i32 = 1;
}

impl Event {
    /// `event` as an [`Event`] of aggregate `aggregate_id`: its type's names and schema version,
    /// its JSON serialisation as payload, a fresh UUIDv7 id. The builder methods set the rest
    /// (aggregate version, headers, destination).
    pub fn of<E: DomainEvent + ?Sized>(
        aggregate_id: impl Display,
        event: &E,
    ) -> Result<Self, Error> {
        Ok(
            Event::new(E::AGGREGATE_TYPE, aggregate_id.to_string(), E::EVENT_TYPE)
                .json(event)?
                .schema_version(E::SCHEMA_VERSION),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize)]
    struct Renamed {
        to: String,
    }

    impl DomainEvent for Renamed {
        const AGGREGATE_TYPE: &'static str = "account";
        const EVENT_TYPE: &'static str = "AccountRenamed";
        const SCHEMA_VERSION: i32 = 3;
    }

    #[test]
    fn an_event_of_a_typed_value_carries_its_names_version_and_json() {
        let event = Event::of(uuid::Uuid::nil(), &Renamed { to: "ada".into() }).unwrap();
        assert_eq!(
            event.aggregate(),
            ("account", "00000000-0000-0000-0000-000000000000")
        );
        assert_eq!(event.kind(), "AccountRenamed");
        assert_eq!(event.schema_version, 3);
        assert_eq!(event.payload_bytes(), br#"{"to":"ada"}"#);
        assert_eq!(event.content_type, crate::event::DEFAULT_CONTENT_TYPE);
        assert_eq!(event.version(), None);
    }

    #[test]
    fn a_typed_event_is_validated_like_any_other() {
        let event = Event::of("", &Renamed { to: "ada".into() }).unwrap();
        let error = event
            .validate(crate::event::DEFAULT_MAX_PAYLOAD_BYTES)
            .unwrap_err();
        assert!(error.to_string().contains("aggregate_id"), "{error}");
    }
}
