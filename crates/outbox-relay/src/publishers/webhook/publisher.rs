use futures::future::BoxFuture;
use hmac::{Hmac, Mac};
use reqwest::StatusCode;
use sha2::Sha256;

use super::WebhookConfig;
use crate::{check_payload_size, Error, Message, PublishError, Publisher};

/// Header carrying the body's signature: `sha256=<lowercase hex HMAC-SHA256(secret, body)>`.
pub const SIGNATURE_HEADER: &str = "x-outbox-signature";

/// POSTs each event to an HTTP endpoint.
pub struct WebhookPublisher {
    client: reqwest::Client,
    config: WebhookConfig,
}

impl WebhookPublisher {
    /// Builds the HTTP client (no request is made).
    pub fn new(config: WebhookConfig) -> Result<Self, Error> {
        config.validate().map_err(Error::Config)?;
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .user_agent(concat!("outbox-relay/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::Broker(format!("webhook: {e}")))?;
        Ok(Self { client, config })
    }
}

/// `sha256=<hex>` of the HMAC-SHA256 of `body` under `secret`.
pub fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// Classifies an HTTP status: the one place webhook outcomes become retry decisions.
fn classify(status: StatusCode) -> Result<(), PublishError> {
    if status.is_success() {
        Ok(())
    } else if status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
    {
        Err(PublishError::transient(format!("webhook: HTTP {status}")))
    } else {
        Err(PublishError::permanent(format!("webhook: HTTP {status}")))
    }
}

impl Publisher for WebhookPublisher {
    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            check_payload_size(message, self.config.max_payload_bytes)?;
            let url = self
                .config
                .url
                .replace("{destination}", &message.destination);
            let mut request = self
                .client
                .post(&url)
                .header(reqwest::header::CONTENT_TYPE, &message.content_type)
                .header("idempotency-key", message.message_id.to_string())
                .body(message.payload.clone());
            for (name, value) in message.broker_headers() {
                if name != "content-type" {
                    request = request.header(name, value);
                }
            }
            if let Some(secret) = &self.config.secret {
                request = request.header(SIGNATURE_HEADER, sign(secret, &message.payload));
            }
            match request.send().await {
                Ok(response) => classify(response.status()),
                // The request could not be built (a header value or a destination that HTTP
                // cannot carry): no retry changes that.
                Err(e) if e.is_builder() => Err(PublishError::permanent(format!(
                    "webhook: {}",
                    e.without_url()
                ))),
                // Connection refused, reset, DNS, timeout: the receiver may come back.
                Err(e) => Err(PublishError::transient(format!(
                    "webhook: {}",
                    e.without_url()
                ))),
            }
        })
    }

    fn name(&self) -> &'static str {
        "webhook"
    }

    fn max_payload_bytes(&self) -> usize {
        self.config.max_payload_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_like_rfc_4231_test_case_2() {
        // RFC 4231, test case 2: key "Jefe", data "what do ya want for nothing?".
        assert_eq!(
            sign("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    /// A header value HTTP cannot carry (a control character, which rows may hold) used to be
    /// a transient error: retried forever, pausing the whole publisher each time.
    #[tokio::test]
    async fn a_request_that_cannot_be_built_is_a_permanent_error() {
        // Nothing listens there; the request fails before any connection is tried.
        let publisher = WebhookPublisher::new(WebhookConfig {
            url: "http://127.0.0.1:9/{destination}".into(),
            ..Default::default()
        })
        .unwrap();
        let mut m = crate::message::sample(1, "a1");
        m.headers.insert("note".into(), "bell\u{7}".into());
        let err = publisher.publish(&m).await.unwrap_err();
        assert!(!err.is_transient(), "{err}");
    }

    #[test]
    fn classifies_statuses() {
        assert!(classify(StatusCode::NO_CONTENT).is_ok());
        for s in [408, 429, 500, 503] {
            let e = classify(StatusCode::from_u16(s).unwrap()).unwrap_err();
            assert!(e.is_transient(), "{s}");
        }
        for s in [400, 401, 404, 410, 422] {
            let e = classify(StatusCode::from_u16(s).unwrap()).unwrap_err();
            assert!(!e.is_transient(), "{s}");
        }
    }
}
