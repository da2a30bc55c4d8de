use std::collections::BTreeMap;

use bytes::Bytes;

use crate::{DecodeError, Envelope};

/// A message as a runner received it from its broker, before decoding: what a processor
/// applies, what a consumer holds in its database when the event must wait, and what it
/// dead-letters whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The subject, routing key or topic it arrived on.
    pub destination: String,
    /// The record key (Kafka), kept for its dead letter.
    pub key: Option<Bytes>,
    /// Its headers as text, the first value of each name.
    pub headers: BTreeMap<String, String>,
    /// Its body.
    pub payload: Bytes,
}

impl Message {
    /// A message that arrived on `destination` with `headers` and `payload`.
    pub fn new(
        destination: impl Into<String>,
        headers: BTreeMap<String, String>,
        payload: impl Into<Bytes>,
    ) -> Self {
        Self {
            destination: destination.into(),
            key: None,
            headers,
            payload: payload.into(),
        }
    }

    /// The event it carries, in either envelope (see [`Envelope::decode`]).
    pub fn decode(&self) -> Result<Envelope, DecodeError> {
        Envelope::decode(
            self.destination.clone(),
            self.headers.clone(),
            self.payload.clone(),
        )
    }
}
