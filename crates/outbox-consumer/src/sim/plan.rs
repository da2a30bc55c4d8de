//! What the simulated relay publishes: each aggregate's versions in order, interleaved between
//! aggregates, some versions never published (a relay-side skip: a permanent gap), some
//! published again later (a relay's redelivery after a lost ack: an earlier event after a
//! later one), each in an envelope drawn from the seed (native, CloudEvents binary or
//! structured, with the binding's prefix of the broker).

use std::collections::BTreeMap;

use bytes::Bytes;
use rand::{rngs::StdRng, seq::IndexedRandom, Rng};
use uuid::Uuid;

use crate::Message;

/// One event of the plan.
#[derive(Clone, Debug)]
pub(super) struct Planned {
    pub(super) event_id: Uuid,
    pub(super) aggregate: String,
    pub(super) version: i64,
    /// Event type: `Placed` for version 1, `Changed` after (Kafka topics follow it).
    pub(super) event_type: &'static str,
    pub(super) message: Message,
}

/// The plan of one seed.
pub(super) struct Plan {
    pub(super) events: Vec<Planned>,
    /// Indices of `events`, in the relay's publication order (an index twice: a redelivery).
    pub(super) order: Vec<usize>,
}

/// How messages are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Envelopes {
    Native,
    /// Native, CloudEvents binary and structured, mixed.
    Mixed,
}

/// Which broker's CloudEvents binding names binary headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Binding {
    Nats,
    RabbitMq,
    Kafka,
}

impl Binding {
    fn prefix(self) -> &'static str {
        match self {
            Self::Nats => "ce-",
            Self::RabbitMq => "cloudEvents:",
            Self::Kafka => "ce_",
        }
    }
}

/// A plan of `aggregates` aggregates of `versions` versions each.
pub(super) fn plan(
    rng: &mut StdRng,
    aggregates: usize,
    versions: i64,
    envelopes: Envelopes,
    binding: Binding,
) -> Plan {
    let mut events = Vec::new();
    let mut per_aggregate: Vec<Vec<usize>> = Vec::new();
    for a in 0..aggregates {
        let aggregate = format!("a{a}");
        // A permanent gap on some aggregates: one version the relay never publishes.
        let skip = rng
            .random_bool(0.15)
            .then(|| rng.random_range(2..=versions));
        let mut mine = Vec::new();
        for version in 1..=versions {
            let event_id = Uuid::now_v7();
            let event_type = if version == 1 { "Placed" } else { "Changed" };
            let message = encode(
                rng, envelopes, binding, event_id, &aggregate, version, event_type,
            );
            let index = events.len();
            events.push(Planned {
                event_id,
                aggregate: aggregate.clone(),
                version,
                event_type,
                message,
            });
            if Some(version) != skip {
                mine.push(index);
            }
        }
        per_aggregate.push(mine);
    }
    // Interleave the aggregates, each in order; now and then an earlier event again.
    let mut cursors = vec![0usize; per_aggregate.len()];
    let mut order = Vec::new();
    let mut published: Vec<Vec<usize>> = vec![Vec::new(); per_aggregate.len()];
    loop {
        let open: Vec<usize> = (0..per_aggregate.len())
            .filter(|&a| cursors[a] < per_aggregate[a].len())
            .collect();
        let Some(&a) = open.choose(rng) else { break };
        let index = per_aggregate[a][cursors[a]];
        cursors[a] += 1;
        order.push(index);
        published[a].push(index);
        if rng.random_bool(0.08) {
            if let Some(&again) = published[a].choose(rng) {
                order.push(again);
            }
        }
    }
    Plan { events, order }
}

fn encode(
    rng: &mut StdRng,
    envelopes: Envelopes,
    binding: Binding,
    event_id: Uuid,
    aggregate: &str,
    version: i64,
    event_type: &str,
) -> Message {
    let destination = format!("order.{event_type}");
    let payload = format!("{{\"aggregate\":\"{aggregate}\",\"version\":{version}}}");
    let roll = match envelopes {
        Envelopes::Native => 0,
        Envelopes::Mixed => rng.random_range(0..3),
    };
    let mut headers = BTreeMap::new();
    let mut put = |k: String, v: String| {
        headers.insert(k, v);
    };
    match roll {
        0 => {
            put("event-id".into(), event_id.to_string());
            put("event-type".into(), event_type.into());
            put("aggregate-type".into(), "order".into());
            put("aggregate-id".into(), aggregate.into());
            put("aggregate-version".into(), version.to_string());
            put("content-type".into(), "application/json".into());
            Message::new(destination, headers, payload)
        }
        1 => {
            let p = binding.prefix();
            put(format!("{p}specversion"), "1.0".into());
            put(format!("{p}id"), event_id.to_string());
            put(format!("{p}source"), "/outbox/order".into());
            put(format!("{p}type"), event_type.into());
            put(format!("{p}subject"), aggregate.into());
            put(format!("{p}aggregatetype"), "order".into());
            put(format!("{p}aggregateversion"), version.to_string());
            put("content-type".into(), "application/json".into());
            Message::new(destination, headers, payload)
        }
        _ => {
            put("content-type".into(), "application/cloudevents+json".into());
            let body = serde_json::json!({
                "specversion": "1.0",
                "id": event_id.to_string(),
                "source": "/outbox/order",
                "type": event_type,
                "subject": aggregate,
                "aggregatetype": "order",
                "aggregateversion": version.to_string(),
                "datacontenttype": "application/json",
                "data": serde_json::from_str::<serde_json::Value>(&payload).expect("JSON"),
            });
            Message::new(
                destination,
                headers,
                Bytes::from(serde_json::to_vec(&body).expect("JSON")),
            )
        }
    }
}
