//! What goes on the wire: the message built from a row ([`message`]), where it goes
//! ([`routing`]), its fan-out copies for other schema versions ([`fanout`]), its CloudEvents
//! envelope ([`cloudevents`]), and the publisher wrapper that applies them ([`outgoing`]). The
//! header names themselves are the contract of `outbox::wire`, shared with the consumers.

pub mod cloudevents;
pub mod fanout;
pub mod message;
pub mod outgoing;
pub mod routing;
