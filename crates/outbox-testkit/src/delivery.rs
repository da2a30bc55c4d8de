use std::collections::{BTreeMap, HashMap, HashSet};

/// One message as a consumer saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delivery {
    /// `event-id` header.
    pub event_id: String,
    /// `aggregate-type` header.
    pub aggregate_type: String,
    /// `aggregate-id` header.
    pub aggregate_id: String,
    /// `aggregate-version` header, if present.
    pub version: Option<i64>,
    /// Subject or routing key.
    pub destination: String,
    /// Every header / property the consumer could read.
    pub headers: BTreeMap<String, String>,
    /// The body.
    pub payload: Vec<u8>,
}

impl Delivery {
    /// Builds a delivery from its headers.
    pub fn from_headers(
        destination: String,
        headers: BTreeMap<String, String>,
        payload: Vec<u8>,
    ) -> Self {
        Self {
            event_id: headers.get("event-id").cloned().unwrap_or_default(),
            aggregate_type: headers.get("aggregate-type").cloned().unwrap_or_default(),
            aggregate_id: headers.get("aggregate-id").cloned().unwrap_or_default(),
            version: headers
                .get("aggregate-version")
                .and_then(|v| v.parse().ok()),
            destination,
            headers,
            payload,
        }
    }
}

/// What a stream of deliveries says about the guarantees.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Distinct events delivered.
    pub unique: usize,
    /// Deliveries of an event already delivered.
    pub duplicates: usize,
    /// First deliveries that came after a later version of the same aggregate (G4). The
    /// aggregate is the (type, id) pair.
    pub order_violations: usize,
}

impl Report {
    /// Checks per-aggregate order on first deliveries: each aggregate's versions must first
    /// appear in increasing order.
    pub fn of(deliveries: &[Delivery]) -> Self {
        let mut seen = HashSet::new();
        let mut last: HashMap<(&str, &str), i64> = HashMap::new();
        let mut report = Report::default();
        for d in deliveries {
            if !seen.insert(d.event_id.as_str()) {
                report.duplicates += 1;
                continue;
            }
            report.unique += 1;
            if let Some(v) = d.version {
                let key = (d.aggregate_type.as_str(), d.aggregate_id.as_str());
                let previous = last.entry(key).or_insert(0);
                if v < *previous {
                    report.order_violations += 1;
                }
                *previous = (*previous).max(v);
            }
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(id: &str, agg: &str, v: i64) -> Delivery {
        Delivery {
            event_id: id.into(),
            aggregate_id: agg.into(),
            version: Some(v),
            ..Default::default()
        }
    }

    #[test]
    fn counts_duplicates_and_violations() {
        let report = Report::of(&[
            d("1", "a", 1),
            d("3", "b", 1),
            d("1", "a", 1),
            d("4", "a", 3),
            d("2", "a", 2),
        ]);
        assert_eq!(
            report,
            Report {
                unique: 4,
                duplicates: 1,
                order_violations: 1
            }
        );
    }
}
