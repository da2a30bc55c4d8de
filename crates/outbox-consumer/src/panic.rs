//! A panic in user code (a handler, an upcaster) becomes a failure of the message it was
//! processing, never the end of the runner.

use std::any::Any;

/// The panic's message, as `"panicked: …"`.
pub(crate) fn message(payload: Box<dyn Any + Send>) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    format!("panicked: {text}")
}
