//! The headers an event carries.

use std::collections::BTreeMap;

/// String headers carried with the event to the broker (trace context, correlation id, tenant…).
pub type Headers = BTreeMap<String, String>;
