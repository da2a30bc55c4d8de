//! Redis Streams: one `XADD` per event into the stream named by the destination, the payload
//! in the `payload` field and every header in a field of its own. Ok means the primary applied
//! the `XADD`; with `wait_replicas` it also means that many replicas acknowledged it (`WAIT`).
//! The event id is the dedupe key: a script adds the entry and remembers the event id for
//! `dedupe_window`, so a re-publish within the window (after a lost reply or a `WAIT` shortfall)
//! returns the first entry instead of adding a second. Entries of one stream are totally
//! ordered, so an aggregate's events (published one after the other) stay in order.

// Parts only its publisher uses are dead in a build without it.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
mod config;
#[cfg(feature = "redis")]
mod publisher;

pub use config::RedisConfig;
#[cfg(feature = "redis")]
pub use publisher::RedisPublisher;
