//! Verifying requests from the relay's webhook publisher (Standard Webhooks,
//! <https://www.standardwebhooks.com/>).
//!
//! Each request carries `webhook-id` (the event id; a fan-out copy's own message id),
//! `webhook-timestamp` (unix seconds when it was sent) and `webhook-signature`: space-separated
//! `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, one per secret the relay holds.
//! [`WebhookVerifier`] accepts a request when
//! 1. each of the three headers is present exactly once and well-formed;
//! 2. the timestamp is within the tolerance (default 5 minutes) of this machine's clock, in
//!    either direction;
//! 3. one `v1` signature matches one of the verifier's secrets, compared in constant time over
//!    the raw body bytes (verify before parsing the body);
//! 4. its `webhook-id` was not accepted before within the window: a captured request replayed
//!    while its timestamp is still fresh is refused, as [`WebhookError::Replayed`] once the
//!    first delivery was handled, as [`WebhookError::InFlight`] while it is being handled.
//!
//! The replay guard is in memory, bounded and per process: ids are kept until their latest
//! timestamp leaves the tolerance (after which step 2 refuses the request anyway), and a full
//! set refuses new requests ([`WebhookError::Busy`], a 503 the relay retries) rather than
//! forget ids early. It is lost on restart and not shared between replicas. Applying each event
//! once is the inbox's job ([`crate::Processor`]): the guard stops replays, the inbox makes
//! redelivery harmless.
//!
//! An accepted request is *in flight* until the receiver says how handling it ended:
//! [`WebhookVerifier::complete`] once the handler committed (a later request with the id is
//! `Replayed`, answered 200: the event is applied), [`WebhookVerifier::forget`] when it failed
//! (the sender's next attempt is accepted). The relay retries a delivery whose answer it did
//! not get with the same `webhook-id` and a new timestamp; while the first is still in flight
//! that retry is `InFlight`, answered 503, which the relay retries later: a 2xx never
//! acknowledges an event whose handling has not succeeded. A receiver that calls neither (a
//! crash mid-handler) leaves the id in flight until its timestamp leaves the window; the relay's
//! attempts after that are accepted again.
//!
//! ```
//! # use outbox_consumer::webhook::{WebhookVerifier, WebhookError};
//! # fn handle(_: &[u8]) -> Result<(), ()> { Ok(()) }
//! fn receive(verifier: &WebhookVerifier, headers: &http::HeaderMap, body: &[u8]) -> u16 {
//!     match verifier.verify(headers, body) {
//!         Ok(delivery) => match handle(body) {
//!             Ok(()) => {
//!                 verifier.complete(&delivery.id);
//!                 204
//!             }
//!             Err(_) => {
//!                 verifier.forget(&delivery.id);
//!                 500
//!             }
//!         },
//!         Err(refused) => refused.status().as_u16(),
//!     }
//! }
//! ```

use std::{
    collections::{BTreeSet, HashMap},
    sync::Mutex,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use base64::Engine as _;
use hmac::{digest::CtOutput, Hmac, Mac};
use http::{HeaderMap, StatusCode};
use sha2::Sha256;

/// The message id header.
pub const WEBHOOK_ID: &str = "webhook-id";
/// The send time header (unix seconds).
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// The signatures header.
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";

/// How far a request's timestamp may be from now, either way, by default.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);
/// How many accepted ids the replay guard holds at most, by default.
pub const DEFAULT_CAPACITY: usize = 100_000;

/// Prefix of a secret given as base64 key bytes.
const WHSEC_PREFIX: &str = "whsec_";
/// Fewest key bytes accepted (the Standard Webhooks minimum).
const MIN_KEY_BYTES: usize = 24;
/// Longest `webhook-id` accepted.
const MAX_ID_BYTES: usize = 256;

type HmacSha256 = Hmac<Sha256>;

/// Why a request was refused (or a secret was not accepted).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum WebhookError {
    /// A configured secret is malformed; the reason never repeats it.
    #[error("webhook secret {index}: {reason}")]
    Secret {
        /// Its position in the list given.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// No secret was given.
    #[error("a webhook verifier needs at least one secret")]
    NoSecret,
    /// A header is missing.
    #[error("header `{0}` is missing")]
    MissingHeader(&'static str),
    /// A header appears more than once.
    #[error("header `{0}` appears more than once")]
    RepeatedHeader(&'static str),
    /// A header's value is malformed.
    #[error("header `{0}` is malformed")]
    InvalidHeader(&'static str),
    /// The timestamp is older than the tolerance.
    #[error("the request is stale: sent {age}s ago, more than the {tolerance}s tolerated")]
    Stale {
        /// Seconds since it was sent.
        age: i64,
        /// The tolerance, in seconds.
        tolerance: i64,
    },
    /// The timestamp is further ahead than the tolerance.
    #[error(
        "the request is from the future: {ahead}s ahead, more than the {tolerance}s tolerated"
    )]
    Future {
        /// Seconds ahead of this clock.
        ahead: i64,
        /// The tolerance, in seconds.
        tolerance: i64,
    },
    /// No `v1` signature matches any secret.
    #[error("no signature matches")]
    BadSignature,
    /// The id was accepted within the window and its handling completed.
    #[error("webhook-id `{0}` was already handled")]
    Replayed(String),
    /// The id was accepted within the window and is still being handled (neither
    /// [`WebhookVerifier::complete`] nor [`WebhookVerifier::forget`] was called for it).
    #[error("webhook-id `{0}` is being handled")]
    InFlight(String),
    /// The replay guard is full of ids still inside the window.
    #[error("too many requests inside the tolerance window to guard against replays")]
    Busy,
}

impl WebhookError {
    /// The HTTP status to answer with: 200 for [`Self::Replayed`] (handled already, not
    /// handled again), 503 for [`Self::InFlight`] and [`Self::Busy`] (the relay retries later),
    /// 401 for a failed signature or an out-of-window timestamp, 400 for malformed headers, 500
    /// for configuration errors.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Replayed(_) => StatusCode::OK,
            Self::InFlight(_) | Self::Busy => StatusCode::SERVICE_UNAVAILABLE,
            Self::BadSignature | Self::Stale { .. } | Self::Future { .. } => {
                StatusCode::UNAUTHORIZED
            }
            Self::MissingHeader(_) | Self::RepeatedHeader(_) | Self::InvalidHeader(_) => {
                StatusCode::BAD_REQUEST
            }
            Self::Secret { .. } | Self::NoSecret => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// An accepted request's metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// `webhook-id`: the event id (a fan-out copy's own id).
    pub id: String,
    /// `webhook-timestamp`: unix seconds when the relay sent it.
    pub timestamp: i64,
}

/// Checks Standard Webhooks signatures, timestamps and replays (see the module docs).
pub struct WebhookVerifier {
    keys: Vec<HmacSha256>,
    tolerance: i64,
    capacity: usize,
    seen: Mutex<Seen>,
}

impl std::fmt::Debug for WebhookVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookVerifier")
            .field("secrets", &self.keys.len())
            .field("tolerance", &self.tolerance)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl WebhookVerifier {
    /// A verifier accepting a signature by any of `secrets`: `whsec_<base64>` (the decoded
    /// bytes are the key) or any other string (its UTF-8 bytes are the key), at least 24 bytes
    /// of key each: the same forms the relay's `webhook.secrets` takes.
    pub fn new<S: AsRef<str>>(secrets: impl IntoIterator<Item = S>) -> Result<Self, WebhookError> {
        let keys = secrets
            .into_iter()
            .enumerate()
            .map(|(index, s)| {
                key(s.as_ref()).map_err(|reason| WebhookError::Secret { index, reason })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(WebhookError::NoSecret);
        }
        Ok(Self {
            keys,
            tolerance: DEFAULT_TOLERANCE.as_secs() as i64,
            capacity: DEFAULT_CAPACITY,
            seen: Mutex::new(Seen::default()),
        })
    }

    /// How far a timestamp may be from now, either way (default [`DEFAULT_TOLERANCE`]); whole
    /// seconds.
    pub fn with_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
        self
    }

    /// How many accepted ids the replay guard holds (default [`DEFAULT_CAPACITY`]).
    pub fn with_capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    /// Verifies a request by this machine's clock: `body` is the raw body, as received.
    pub fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<Verified, WebhookError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        self.verify_at(headers, body, now)
    }

    /// [`Self::verify`] at `now` (unix seconds).
    pub fn verify_at(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<Verified, WebhookError> {
        let id = single(headers, WEBHOOK_ID)?;
        if id.is_empty() || id.len() > MAX_ID_BYTES || id.contains('.') {
            return Err(WebhookError::InvalidHeader(WEBHOOK_ID));
        }
        let timestamp_text = single(headers, WEBHOOK_TIMESTAMP)?;
        let timestamp = parse_timestamp(timestamp_text)?;
        let signatures = single(headers, WEBHOOK_SIGNATURE)?;
        if now.saturating_sub(timestamp) > self.tolerance {
            return Err(WebhookError::Stale {
                age: now.saturating_sub(timestamp),
                tolerance: self.tolerance,
            });
        }
        if timestamp.saturating_sub(now) > self.tolerance {
            return Err(WebhookError::Future {
                ahead: timestamp.saturating_sub(now),
                tolerance: self.tolerance,
            });
        }
        let expected: Vec<CtOutput<HmacSha256>> = self
            .keys
            .iter()
            .map(|key| {
                let mut mac = key.clone();
                mac.update(id.as_bytes());
                mac.update(b".");
                mac.update(timestamp_text.as_bytes());
                mac.update(b".");
                mac.update(body);
                mac.finalize()
            })
            .collect();
        let matches = signatures
            .split(' ')
            .filter_map(|s| s.strip_prefix("v1,"))
            .filter_map(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
            .filter(|tag| tag.len() == 32)
            .any(|tag| {
                let tag = CtOutput::<HmacSha256>::new(
                    *hmac::digest::generic_array::GenericArray::from_slice(&tag),
                );
                // `CtOutput`'s equality is constant-time.
                expected.contains(&tag)
            });
        if !matches {
            return Err(WebhookError::BadSignature);
        }
        self.seen
            .lock()
            .expect("the replay guard's lock is never held across a panic")
            .admit(
                id,
                timestamp.saturating_add(self.tolerance),
                now,
                self.capacity,
            )?;
        Ok(Verified {
            id: id.to_owned(),
            timestamp,
        })
    }

    /// Records that the accepted request `id` was handled (its change committed): a later
    /// request with the id is [`WebhookError::Replayed`], answered 200.
    pub fn complete(&self, id: &str) {
        self.seen
            .lock()
            .expect("the replay guard's lock is never held across a panic")
            .complete(id);
    }

    /// Forgets an accepted id, so that the sender's next attempt with it is accepted: call it
    /// when handling the request failed.
    pub fn forget(&self, id: &str) {
        self.seen
            .lock()
            .expect("the replay guard's lock is never held across a panic")
            .remove(id);
    }
}

/// The HMAC key of a configured secret.
fn key(secret: &str) -> Result<HmacSha256, String> {
    let bytes = match secret.strip_prefix(WHSEC_PREFIX) {
        Some(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            // The decoder's message names an offending byte: part of the secret.
            .map_err(|_| format!("the part after `{WHSEC_PREFIX}` is not base64"))?,
        None => secret.as_bytes().to_vec(),
    };
    if bytes.len() < MIN_KEY_BYTES {
        return Err(format!(
            "the key is {} bytes, fewer than the {MIN_KEY_BYTES} Standard Webhooks requires",
            bytes.len()
        ));
    }
    Ok(HmacSha256::new_from_slice(&bytes).expect("HMAC takes any key length"))
}

/// The one value of header `name`, as text.
fn single<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, WebhookError> {
    let mut values = headers.get_all(name).iter();
    let value = values.next().ok_or(WebhookError::MissingHeader(name))?;
    if values.next().is_some() {
        return Err(WebhookError::RepeatedHeader(name));
    }
    value
        .to_str()
        .map_err(|_| WebhookError::InvalidHeader(name))
}

/// Unix seconds written as decimal digits only (no sign, no spaces), as the relay writes them.
fn parse_timestamp(text: &str) -> Result<i64, WebhookError> {
    if text.is_empty() || text.len() > 18 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(WebhookError::InvalidHeader(WEBHOOK_TIMESTAMP));
    }
    text.parse()
        .map_err(|_| WebhookError::InvalidHeader(WEBHOOK_TIMESTAMP))
}

/// An accepted id: when it leaves the window, and whether its handling completed.
struct Entry {
    expires: i64,
    done: bool,
}

/// Accepted ids and when each leaves the window.
#[derive(Default)]
struct Seen {
    expiry: HashMap<String, Entry>,
    by_expiry: BTreeSet<(i64, String)>,
}

impl Seen {
    /// Records `id` (in flight) until `expires`, unless it is already held: then it is kept
    /// until the later of its expiry and `expires` (a replay of the newer request is refused
    /// as long as that request is fresh), and refused as replayed or in flight. Drops what
    /// expired by `now`.
    fn admit(
        &mut self,
        id: &str,
        expires: i64,
        now: i64,
        capacity: usize,
    ) -> Result<(), WebhookError> {
        while let Some((at, old)) = self.by_expiry.first().cloned() {
            if at >= now {
                break;
            }
            self.by_expiry.pop_first();
            self.expiry.remove(&old);
        }
        if let Some(entry) = self.expiry.get_mut(id) {
            if expires > entry.expires {
                self.by_expiry.remove(&(entry.expires, id.to_owned()));
                self.by_expiry.insert((expires, id.to_owned()));
                entry.expires = expires;
            }
            return Err(match entry.done {
                true => WebhookError::Replayed(id.to_owned()),
                false => WebhookError::InFlight(id.to_owned()),
            });
        }
        if self.expiry.len() >= capacity {
            return Err(WebhookError::Busy);
        }
        self.expiry.insert(
            id.to_owned(),
            Entry {
                expires,
                done: false,
            },
        );
        self.by_expiry.insert((expires, id.to_owned()));
        Ok(())
    }

    fn complete(&mut self, id: &str) {
        if let Some(entry) = self.expiry.get_mut(id) {
            entry.done = true;
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some(entry) = self.expiry.remove(id) {
            self.by_expiry.remove(&(entry.expires, id.to_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Standard Webhooks reference libraries' test vector.
    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const TIMESTAMP: i64 = 1649367553;
    const BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
    const SIGNATURE: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

    fn headers(id: &str, timestamp: &str, signature: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(WEBHOOK_ID, id.parse().unwrap());
        h.insert(WEBHOOK_TIMESTAMP, timestamp.parse().unwrap());
        h.insert(WEBHOOK_SIGNATURE, signature.parse().unwrap());
        h
    }

    /// A `v1` signature by [`SECRET`].
    fn sign(id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = key(SECRET).unwrap();
        mac.update(format!("{id}.{timestamp}.").as_bytes());
        mac.update(body);
        let tag = mac.finalize().into_bytes();
        format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(tag)
        )
    }

    fn vector() -> HeaderMap {
        headers(ID, &TIMESTAMP.to_string(), SIGNATURE)
    }

    #[test]
    fn accepts_the_standard_webhooks_test_vector() {
        let v = WebhookVerifier::new([SECRET]).unwrap();
        let ok = v.verify_at(&vector(), BODY, TIMESTAMP).unwrap();
        assert_eq!(ok.id, ID);
        assert_eq!(ok.timestamp, TIMESTAMP);
    }

    #[test]
    fn accepts_one_matching_signature_among_several_and_any_of_several_secrets() {
        let other = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let v = WebhookVerifier::new([other, SECRET]).unwrap();
        let list = format!(
            "v1a,hnO3f9T8Ytu9HwrXslvumlUpqtNVqkhqw== v1,Mm7xgUVICxZfQ3bgf0h0Dof65L/IFx+PnZvnDWPCX6Q= {SIGNATURE}"
        );
        v.verify_at(&headers(ID, &TIMESTAMP.to_string(), &list), BODY, TIMESTAMP)
            .unwrap();
    }

    #[test]
    fn refuses_a_changed_body_id_or_timestamp() {
        let v = WebhookVerifier::new([SECRET]).unwrap();
        let refused = |h: &HeaderMap, body: &[u8]| v.verify_at(h, body, TIMESTAMP).unwrap_err();
        assert_eq!(refused(&vector(), b"{}"), WebhookError::BadSignature);
        let other_id = headers("msg_other", &TIMESTAMP.to_string(), SIGNATURE);
        assert_eq!(refused(&other_id, BODY), WebhookError::BadSignature);
        let other_time = headers(ID, &(TIMESTAMP + 1).to_string(), SIGNATURE);
        assert_eq!(refused(&other_time, BODY), WebhookError::BadSignature);
        let wrong_key = WebhookVerifier::new(["x".repeat(24)]).unwrap();
        assert_eq!(
            wrong_key.verify_at(&vector(), BODY, TIMESTAMP).unwrap_err(),
            WebhookError::BadSignature
        );
    }

    #[test]
    fn refuses_stale_and_future_timestamps_outside_the_tolerance() {
        let v = WebhookVerifier::new([SECRET]).unwrap();
        let at = |now| v.verify_at(&vector(), BODY, now);
        assert!(matches!(
            at(TIMESTAMP + 301),
            Err(WebhookError::Stale { age: 301, .. })
        ));
        assert!(matches!(
            at(TIMESTAMP - 301),
            Err(WebhookError::Future { ahead: 301, .. })
        ));
        assert!(at(TIMESTAMP + 300).is_ok());
        let short = WebhookVerifier::new([SECRET])
            .unwrap()
            .with_tolerance(Duration::from_secs(10));
        assert!(matches!(
            short.verify_at(&vector(), BODY, TIMESTAMP + 11),
            Err(WebhookError::Stale { .. })
        ));
    }

    #[test]
    fn refuses_a_replay_inside_the_window_and_forgets_it_after() {
        let v = WebhookVerifier::new([SECRET]).unwrap();
        v.verify_at(&vector(), BODY, TIMESTAMP).unwrap();
        // Still being handled: a retry must not be acknowledged.
        let early = v.verify_at(&vector(), BODY, TIMESTAMP + 30).unwrap_err();
        assert_eq!(early, WebhookError::InFlight(ID.into()));
        assert_eq!(early.status(), StatusCode::SERVICE_UNAVAILABLE);
        v.complete(ID);
        let replay = v.verify_at(&vector(), BODY, TIMESTAMP + 60).unwrap_err();
        assert_eq!(replay, WebhookError::Replayed(ID.into()));
        assert_eq!(replay.status(), StatusCode::OK);
        // Past the window the timestamp refuses it, and the guard lets the id go.
        assert!(matches!(
            v.verify_at(&vector(), BODY, TIMESTAMP + 301),
            Err(WebhookError::Stale { .. })
        ));
        let later = TIMESTAMP + 301;
        let next = headers(
            "msg_next",
            &later.to_string(),
            &sign("msg_next", later, BODY),
        );
        v.verify_at(&next, BODY, later).unwrap();
        let held: Vec<String> = v.seen.lock().unwrap().expiry.keys().cloned().collect();
        assert_eq!(held, ["msg_next"]);
        // A failed handling gives the id back.
        v.verify_at(&vector(), BODY, TIMESTAMP).unwrap();
        v.forget(ID);
        v.verify_at(&vector(), BODY, TIMESTAMP).unwrap();
    }

    /// A retry with a newer timestamp keeps the id held until that timestamp leaves the
    /// window: a capture of the retry cannot be replayed once the first request's window ends.
    #[test]
    fn a_fresher_retry_extends_the_ids_window() {
        let v = WebhookVerifier::new([SECRET]).unwrap();
        v.verify_at(&vector(), BODY, TIMESTAMP).unwrap();
        v.complete(ID);
        let retry_at = TIMESTAMP + 200;
        let retry = headers(ID, &retry_at.to_string(), &sign(ID, retry_at, BODY));
        assert_eq!(
            v.verify_at(&retry, BODY, retry_at).unwrap_err(),
            WebhookError::Replayed(ID.into())
        );
        assert_eq!(
            v.verify_at(&retry, BODY, TIMESTAMP + 400).unwrap_err(),
            WebhookError::Replayed(ID.into()),
            "past the first request's window, inside the retry's"
        );
    }

    #[test]
    fn a_full_guard_refuses_rather_than_forgets() {
        let v = WebhookVerifier::new([SECRET]).unwrap().with_capacity(0);
        let err = v.verify_at(&vector(), BODY, TIMESTAMP).unwrap_err();
        assert_eq!(err, WebhookError::Busy);
        assert_eq!(err.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn refuses_missing_repeated_and_malformed_headers() {
        let v = WebhookVerifier::new([SECRET]).unwrap();
        for name in [WEBHOOK_ID, WEBHOOK_TIMESTAMP, WEBHOOK_SIGNATURE] {
            let mut h = vector();
            h.remove(name);
            assert_eq!(
                v.verify_at(&h, BODY, TIMESTAMP).unwrap_err(),
                WebhookError::MissingHeader(name)
            );
            let mut h = vector();
            h.append(name, "1".parse().unwrap());
            assert_eq!(
                v.verify_at(&h, BODY, TIMESTAMP).unwrap_err(),
                WebhookError::RepeatedHeader(name)
            );
        }
        for timestamp in ["+1649367553", "-1", " 1649367553", "1649367553.0", ""] {
            let h = headers(ID, timestamp, SIGNATURE);
            assert_eq!(
                v.verify_at(&h, BODY, TIMESTAMP).unwrap_err(),
                WebhookError::InvalidHeader(WEBHOOK_TIMESTAMP),
                "{timestamp:?}"
            );
        }
        let dotted = headers("a.b", &TIMESTAMP.to_string(), SIGNATURE);
        assert_eq!(
            v.verify_at(&dotted, BODY, TIMESTAMP).unwrap_err(),
            WebhookError::InvalidHeader(WEBHOOK_ID)
        );
    }

    #[test]
    fn refuses_short_or_malformed_secrets_without_repeating_them() {
        let err = WebhookVerifier::new(["hunter2"]).unwrap_err().to_string();
        assert!(
            err.contains("secret 0") && !err.contains("hunter2"),
            "{err}"
        );
        let err = WebhookVerifier::new([SECRET, "whsec_***"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("secret 1") && err.contains("base64"), "{err}");
        assert_eq!(
            WebhookVerifier::new(Vec::<String>::new()).unwrap_err(),
            WebhookError::NoSecret
        );
    }
}
