use std::time::{SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use reqwest::{redirect, StatusCode};

use super::{
    headers::{self, IDEMPOTENCY_KEY, WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP},
    secret::{signature_header, SigningKey},
    url_template::UrlTemplate,
    WebhookConfig,
};
use crate::{
    error::Error, publisher::check_payload_size, publisher::PublishError, publisher::Publisher,
    wire::message::header, wire::message::Message,
};

/// POSTs each event to an HTTP endpoint.
pub struct WebhookPublisher {
    client: reqwest::Client,
    config: WebhookConfig,
    url: UrlTemplate,
    keys: Vec<SigningKey>,
}

impl WebhookPublisher {
    /// Checks the configuration and builds the HTTP client (no request is made). The client
    /// follows no redirect and sends no `Referer`.
    pub fn new(config: WebhookConfig) -> Result<Self, Error> {
        config.validate().map_err(Error::Config)?;
        let url = UrlTemplate::parse(&config.url).map_err(Error::Config)?;
        let keys = config
            .secrets
            .iter()
            .map(|s| SigningKey::parse(s))
            .collect::<Result<_, _>>()
            .map_err(Error::Config)?;
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .user_agent(concat!("outbox-relay/", env!("CARGO_PKG_VERSION")))
            // A redirect would take the body, its signature and the writer's headers to a URL
            // the operator never configured; a 3xx is answered as a failure instead.
            .redirect(redirect::Policy::none())
            .referer(false)
            .build()
            .map_err(|e| Error::broker("webhook", e))?;
        Ok(Self {
            client,
            config,
            url,
            keys,
        })
    }
}

/// Classifies an HTTP status: the one place webhook outcomes become retry decisions. A 3xx is
/// a permanent failure like other 4xx: the endpoint is misconfigured (redirects are never
/// followed), and no retry of the same URL changes that.
fn classify(status: StatusCode) -> Result<(), PublishError> {
    if status.is_success() {
        Ok(())
    } else if status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
    {
        Err(PublishError::transient(format!("webhook: HTTP {status}")))
    } else if status.is_redirection() {
        Err(PublishError::permanent(format!(
            "webhook: HTTP {status}: redirects are not followed; set webhook.url to the final \
             endpoint"
        )))
    } else {
        Err(PublishError::permanent(format!("webhook: HTTP {status}")))
    }
}

/// Unix seconds now, for `webhook-timestamp`.
fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl Publisher for WebhookPublisher {
    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            check_payload_size(message, self.config.max_payload_bytes)?;
            // A destination that cannot be sent never will be: dead-letter it, and never send
            // the request anywhere else.
            let url = self
                .url
                .render(&message.destination)
                .map_err(|e| PublishError::permanent(format!("webhook: {e}")))?;
            let id = message.message_id.to_string();
            let timestamp = unix_now();
            let mut own = vec![
                (header::CONTENT_TYPE, message.content_type.clone()),
                (IDEMPOTENCY_KEY, id.clone()),
                (WEBHOOK_TIMESTAMP, timestamp.to_string()),
            ];
            if !self.keys.is_empty() {
                own.push((
                    WEBHOOK_SIGNATURE,
                    signature_header(&self.keys, &id, timestamp, &message.payload),
                ));
            }
            own.push((WEBHOOK_ID, id));
            let headers = headers::request_headers(own, message)
                .map_err(|e| PublishError::permanent(format!("webhook: {e}")))?;
            let request = self
                .client
                .post(url)
                .headers(headers)
                .body(message.payload.clone());
            match request.send().await {
                Ok(response) => classify(response.status()),
                // The request could not be built: no retry changes that.
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
        let mut m = crate::wire::message::sample(1, "a1");
        m.headers.insert("note".into(), "bell\u{7}".into());
        let err = publisher.publish(&m).await.unwrap_err();
        assert!(!err.is_transient(), "{err}");
        m.headers.clear();
        m.destination = "..".into();
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
        for s in [300, 301, 302, 303, 307, 308, 400, 401, 404, 410, 422] {
            let e = classify(StatusCode::from_u16(s).unwrap()).unwrap_err();
            assert!(!e.is_transient(), "{s}");
        }
    }
}
