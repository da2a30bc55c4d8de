//! Upcasting: old payloads turned into the current shape before the handler sees them.
//!
//! An event type evolves by versions (`schema_version` 1, 2, 3, …, carried by every message).
//! For each step N → N+1 the consumer registers one [`Upcaster`], a function from the version-N
//! JSON payload to the version-N+1 one. The [`Upcasters`] registry chains them, so a V1 event
//! reaching a consumer whose current version is 3 runs V1 → V2, then V2 → V3, and the handler
//! only ever sees V3:
//!
//! ```
//! use outbox_consumer::Upcasters;
//! use serde_json::json;
//!
//! let upcasters = Upcasters::new()
//!     // V2 added `region` (unknown for older orders).
//!     .register("OrderPlaced", 1, |mut v| {
//!         v["region"] = json!("unknown");
//!         Ok(v)
//!     })
//!     // V3 added `currency`.
//!     .register("OrderPlaced", 2, |mut v| {
//!         v["currency"] = json!("EUR");
//!         Ok(v)
//!     });
//! assert_eq!(upcasters.current_version("OrderPlaced"), Some(3));
//! let v3 = upcasters.upcast("OrderPlaced", 1, json!({"order_id": "o1", "total": 9.5})).unwrap();
//! assert_eq!(v3, json!({"order_id": "o1", "total": 9.5, "region": "unknown", "currency": "EUR"}));
//! ```
//!
//! Event types without any upcaster pass through untouched. For a registered type, a message
//! *newer* than the current version (a producer deployed ahead of this consumer) and a version
//! with no upcaster to the next one (a gap in the chain) are errors: the runners dead-letter
//! such messages at once, with the reason; they never reach the handler in a shape it does not
//! expect.

use std::{collections::BTreeMap, fmt, panic::AssertUnwindSafe, sync::Arc};

use bytes::Bytes;
use serde_json::Value;

use crate::Envelope;

/// One step: turns a version-N payload into a version-N+1 payload, or says why it cannot.
pub type Upcaster = Arc<dyn Fn(Value) -> Result<Value, String> + Send + Sync>;

/// Why an event could not be brought to its current version. Such messages are dead-lettered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UpcastError {
    /// The message is newer than what this consumer knows.
    #[error("{event_type} schema_version {version} is newer than this consumer's current version {current}")]
    TooNew {
        /// Event type.
        event_type: String,
        /// Version on the message.
        version: i32,
        /// Highest version this consumer handles.
        current: i32,
    },
    /// No upcaster from this version to the next.
    #[error("{event_type}: no upcaster from schema_version {from} to {} (current version {current})", from + 1)]
    Gap {
        /// Event type.
        event_type: String,
        /// The version with no next step.
        from: i32,
        /// Highest version this consumer handles.
        current: i32,
    },
    /// The payload is not JSON, so no upcaster can read it.
    #[error("{event_type} schema_version {version}: payload is not JSON: {reason}")]
    NotJson {
        /// Event type.
        event_type: String,
        /// Version on the message.
        version: i32,
        /// The parser's message.
        reason: String,
    },
    /// An upcaster refused the payload.
    #[error("{event_type}: upcasting schema_version {from} to {} failed: {reason}", from + 1)]
    Failed {
        /// Event type.
        event_type: String,
        /// The step's source version.
        from: i32,
        /// The upcaster's message.
        reason: String,
    },
    /// An upcaster panicked (indexing a payload of another shape, say).
    #[error("{event_type}: the upcaster from schema_version {from} {message}")]
    Panicked {
        /// Event type.
        event_type: String,
        /// The step's source version.
        from: i32,
        /// The panic's message.
        message: String,
    },
}

/// The upcasters of a consumer, per (event type, source version). Cheap to clone.
#[derive(Clone, Default)]
pub struct Upcasters {
    steps: BTreeMap<String, BTreeMap<i32, Upcaster>>,
    /// Current versions declared with [`Upcasters::current`].
    declared: BTreeMap<String, i32>,
}

impl fmt::Debug for Upcasters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for (event_type, steps) in &self.steps {
            map.entry(event_type, &steps.keys().collect::<Vec<_>>());
        }
        for (event_type, current) in &self.declared {
            map.entry(&format!("{event_type} current"), current);
        }
        map.finish()
    }
}

impl Upcasters {
    /// An empty registry: every event passes through unchanged.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the step from version `from` of `event_type` to version `from + 1`.
    ///
    /// # Panics
    ///
    /// When `from` is below 1, or when the same step is registered twice: both are
    /// programming errors, found at start-up.
    pub fn register(
        mut self,
        event_type: impl Into<String>,
        from: i32,
        upcast: impl Fn(Value) -> Result<Value, String> + Send + Sync + 'static,
    ) -> Self {
        let event_type = event_type.into();
        assert!(
            from >= 1,
            "{event_type}: upcasters start at schema_version 1, not {from}"
        );
        if let Some(&current) = self.declared.get(&event_type) {
            assert!(
                from < current,
                "{event_type}: an upcaster from schema_version {from} goes past the current \
                 version {current}"
            );
        }
        let previous = self
            .steps
            .entry(event_type.clone())
            .or_default()
            .insert(from, Arc::new(upcast));
        assert!(
            previous.is_none(),
            "{event_type}: the upcaster from schema_version {from} is registered twice"
        );
        self
    }

    /// Declares `version` the current version of `event_type`, the one its handler is written
    /// for: a newer message is refused ([`UpcastError::TooNew`]) even when the type has no
    /// upcaster, and an older one with no chain of steps up to `version` is a
    /// [`UpcastError::Gap`]. Typed handlers (`Handlers::on`) declare their type's version.
    ///
    /// # Panics
    ///
    /// When `version` is below 1, below a registered step's target, or declared twice
    /// differently: programming errors, found at start-up.
    pub fn current(mut self, event_type: impl Into<String>, version: i32) -> Self {
        let event_type = event_type.into();
        assert!(
            version >= 1,
            "{event_type}: schema versions start at 1, not {version}"
        );
        if let Some(last) = self
            .steps
            .get(&event_type)
            .and_then(|s| s.keys().next_back())
        {
            assert!(
                *last < version,
                "{event_type}: an upcaster from schema_version {last} goes past the current \
                 version {version}"
            );
        }
        let previous = self.declared.insert(event_type.clone(), version);
        assert!(
            previous.is_none_or(|p| p == version),
            "{event_type}: current version declared as both {} and {version}",
            previous.unwrap_or_default()
        );
        self
    }

    /// The version handlers see for `event_type`: the declared one ([`Upcasters::current`]),
    /// else one past its last upcaster. `None` when the type has neither (its events pass
    /// through unchanged).
    pub fn current_version(&self, event_type: &str) -> Option<i32> {
        self.declared.get(event_type).copied().or_else(|| {
            self.steps
                .get(event_type)
                .and_then(|steps| steps.keys().next_back())
                .map(|last| last + 1)
        })
    }

    /// Brings a `version` payload of `event_type` to the current version, step by step.
    pub fn upcast(
        &self,
        event_type: &str,
        version: i32,
        payload: Value,
    ) -> Result<Value, UpcastError> {
        let Some(current) = self.current_version(event_type) else {
            return Ok(payload);
        };
        let steps = self.steps.get(event_type);
        if version > current {
            return Err(UpcastError::TooNew {
                event_type: event_type.to_owned(),
                version,
                current,
            });
        }
        (version..current).try_fold(payload, |value, from| {
            let step = steps
                .and_then(|s| s.get(&from))
                .ok_or_else(|| UpcastError::Gap {
                    event_type: event_type.to_owned(),
                    from,
                    current,
                })?;
            // A panic fails this message only (dead-lettered with the reason), not the runner.
            match std::panic::catch_unwind(AssertUnwindSafe(|| step(value))) {
                Ok(result) => result.map_err(|reason| UpcastError::Failed {
                    event_type: event_type.to_owned(),
                    from,
                    reason,
                }),
                Err(panic) => Err(UpcastError::Panicked {
                    event_type: event_type.to_owned(),
                    from,
                    message: crate::panic::message(panic),
                }),
            }
        })
    }

    /// `envelope` at its current version: borrowed when it is there already (or its type has no
    /// current version), else upcast ([`Upcasters::upcast_envelope`]) into a new one.
    pub fn to_current<'e>(
        &self,
        envelope: &'e Envelope,
    ) -> Result<std::borrow::Cow<'e, Envelope>, UpcastError> {
        match self.current_version(&envelope.event_type) {
            Some(current) if current != envelope.schema_version => self
                .upcast_envelope(envelope.clone())
                .map(std::borrow::Cow::Owned),
            _ => Ok(std::borrow::Cow::Borrowed(envelope)),
        }
    }

    /// The envelope as handlers must see it: payload upcast and `schema_version` set to the
    /// current version. Envelopes already current, and types without upcasters, are returned
    /// unchanged (their payload is not parsed).
    pub fn upcast_envelope(&self, envelope: Envelope) -> Result<Envelope, UpcastError> {
        let Some(current) = self.current_version(&envelope.event_type) else {
            return Ok(envelope);
        };
        if envelope.schema_version == current {
            return Ok(envelope);
        }
        let old: Value = serde_json::from_slice(&envelope.payload).map_err(|e| {
            // A newer version is reported as such even when its payload is not JSON.
            if envelope.schema_version > current {
                UpcastError::TooNew {
                    event_type: envelope.event_type.clone(),
                    version: envelope.schema_version,
                    current,
                }
            } else {
                UpcastError::NotJson {
                    event_type: envelope.event_type.clone(),
                    version: envelope.schema_version,
                    reason: e.to_string(),
                }
            }
        })?;
        let new = self.upcast(&envelope.event_type, envelope.schema_version, old)?;
        Ok(Envelope {
            schema_version: current,
            payload: Bytes::from(serde_json::to_vec(&new).expect("a Value serialises")),
            ..envelope
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;
    use uuid::Uuid;

    use super::*;

    fn orders() -> Upcasters {
        Upcasters::new()
            .register("OrderPlaced", 1, |mut v| {
                v["region"] = json!("unknown");
                Ok(v)
            })
            .register("OrderPlaced", 2, |mut v| {
                let total = v["total"].as_f64().ok_or("total is not a number")?;
                v["total_cents"] = json!((total * 100.0).round() as i64);
                Ok(v)
            })
    }

    fn envelope(version: i32, payload: &[u8]) -> Envelope {
        let event_id = Uuid::now_v7();
        Envelope {
            event_id,
            message_id: event_id.to_string(),
            event_type: "OrderPlaced".into(),
            schema_version: version,
            aggregate_type: None,
            aggregate_id: None,
            aggregate_version: None,
            occurred_at: None,
            copy_of_schema_version: None,
            destination: "order.OrderPlaced".into(),
            headers: BTreeMap::new(),
            payload: Bytes::copy_from_slice(payload),
        }
    }

    #[test]
    fn chains_every_step_up_to_the_current_version() {
        let up = orders();
        assert_eq!(up.current_version("OrderPlaced"), Some(3));
        let from_v1 = up.upcast("OrderPlaced", 1, json!({"total": 9.5})).unwrap();
        assert_eq!(
            from_v1,
            json!({"total": 9.5, "region": "unknown", "total_cents": 950})
        );
        let from_v2 = up
            .upcast("OrderPlaced", 2, json!({"total": 1.0, "region": "eu"}))
            .unwrap();
        assert_eq!(from_v2["region"], "eu");
        assert_eq!(from_v2["total_cents"], 100);
    }

    #[test]
    fn rewrites_the_envelope_payload_and_version() {
        let e = orders()
            .upcast_envelope(envelope(1, br#"{"total":2}"#))
            .unwrap();
        assert_eq!(e.schema_version, 3);
        assert_eq!(e.json::<Value>().unwrap()["total_cents"], 200);
    }

    #[test]
    fn current_and_unknown_types_pass_through_untouched() {
        let current = envelope(3, b"not even json");
        assert_eq!(orders().upcast_envelope(current.clone()).unwrap(), current);
        let mut other = envelope(7, b"\x00binary");
        other.event_type = "Shipped".into();
        assert_eq!(orders().upcast_envelope(other.clone()).unwrap(), other);
        assert_eq!(orders().current_version("Shipped"), None);
    }

    #[test]
    fn newer_than_current_is_an_error_naming_both_versions() {
        let err = orders()
            .upcast_envelope(envelope(4, b"{}"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "OrderPlaced schema_version 4 is newer than this consumer's current version 3"
        );
    }

    #[test]
    fn a_gap_in_the_chain_is_an_error() {
        let up = Upcasters::new().register("T", 2, Ok);
        let err = up.upcast("T", 1, json!({})).unwrap_err();
        assert_eq!(
            err,
            UpcastError::Gap {
                event_type: "T".into(),
                from: 1,
                current: 3
            }
        );
        assert_eq!(
            err.to_string(),
            "T: no upcaster from schema_version 1 to 2 (current version 3)"
        );
        assert!(up.upcast("T", 2, json!({})).is_ok());
    }

    /// Before: the documented V1 → V2 step (`v["region"] = …`) panicked on a payload that is
    /// not an object, and the panic ended the runner.
    #[test]
    fn a_panicking_upcaster_fails_the_message_with_the_panic() {
        let err = orders()
            .upcast_envelope(envelope(1, b"[1, 2]"))
            .unwrap_err();
        assert!(
            matches!(err, UpcastError::Panicked { from: 1, .. }),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.starts_with("OrderPlaced: the upcaster from schema_version 1 panicked: "),
            "{text}"
        );
    }

    #[test]
    fn failures_name_the_type_and_the_step() {
        let err = orders()
            .upcast_envelope(envelope(2, br#"{"total":"12.50"}"#))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "OrderPlaced: upcasting schema_version 2 to 3 failed: total is not a number"
        );
        let err = orders()
            .upcast_envelope(envelope(1, b"<xml/>"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("OrderPlaced schema_version 1: payload is not JSON"));
    }

    #[test]
    #[should_panic(expected = "registered twice")]
    fn registering_a_step_twice_panics() {
        let _ = Upcasters::new().register("T", 1, Ok).register("T", 1, Ok);
    }

    #[test]
    fn a_declared_current_version_refuses_newer_messages_and_gaps_without_steps() {
        let declared = Upcasters::new().current("OrderShipped", 2);
        assert_eq!(declared.current_version("OrderShipped"), Some(2));
        let shipped = |version| Envelope {
            event_type: "OrderShipped".into(),
            ..envelope(version, br#"{"order_id":"o1"}"#)
        };
        assert_eq!(
            declared.upcast_envelope(shipped(2)).unwrap().schema_version,
            2
        );
        assert_eq!(
            declared.upcast_envelope(shipped(3)).unwrap_err(),
            UpcastError::TooNew {
                event_type: "OrderShipped".into(),
                version: 3,
                current: 2
            }
        );
        assert_eq!(
            declared.upcast_envelope(shipped(1)).unwrap_err(),
            UpcastError::Gap {
                event_type: "OrderShipped".into(),
                from: 1,
                current: 2
            }
        );
        // A declaration above the last step leaves a gap at the top, found per message.
        let short = orders().current("OrderPlaced", 4);
        assert!(matches!(
            short.upcast_envelope(envelope(1, br#"{"total":1.5}"#)),
            Err(UpcastError::Gap {
                from: 3,
                current: 4,
                ..
            })
        ));
        // Declaring the version the steps reach changes nothing.
        let same = orders().current("OrderPlaced", 3);
        assert_eq!(same.current_version("OrderPlaced"), Some(3));
    }

    #[test]
    #[should_panic(
        expected = "OrderPlaced: an upcaster from schema_version 2 goes past the current version 2"
    )]
    fn a_step_past_the_declared_version_panics() {
        let _ = orders().current("OrderPlaced", 2);
    }

    #[test]
    #[should_panic(expected = "T: current version declared as both 2 and 3")]
    fn declaring_two_current_versions_panics() {
        let _ = Upcasters::new().current("T", 2).current("T", 3);
    }
}
