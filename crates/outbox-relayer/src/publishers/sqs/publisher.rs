use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use aws_config::{meta::region::RegionProviderChain, BehaviorVersion, SdkConfig};
use aws_sdk_sqs::{
    config::{retry::RetryConfig, timeout::TimeoutConfig, Region},
    error::{ProvideErrorMetadata, SdkError},
    types::{MessageAttributeValue, SendMessageBatchRequestEntry},
    Client,
};
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
use futures::future::BoxFuture;

use super::{
    batch::{Batcher, EntryResult, Limits, SendBatch, MAX_ENTRIES},
    encode::{encode, Entry},
    SqsConfig,
};
use crate::{
    error::Error, publisher::check_payload_size, publisher::PublishError, publisher::Publisher,
    wire::message::Message,
};

/// Attempts the SDK makes for one request before the error reaches the relay (which retries
/// with its own backoff).
const SDK_MAX_ATTEMPTS: u32 = 3;

/// Longest connection attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Publishes to AWS SQS queues (standard and FIFO) in `SendMessageBatch` requests, one entry
/// per message, and returns `Ok` once SQS accepted the message's entry.
pub struct SqsPublisher {
    client: Client,
    config: SqsConfig,
    /// The region requests go to, which a queue URL destination must name.
    region: String,
    urls: Arc<QueueUrls>,
    batcher: Batcher<SdkSender>,
}

/// Queue URLs found with `GetQueueUrl`, by queue name.
#[derive(Default)]
struct QueueUrls(Mutex<HashMap<String, String>>);

impl QueueUrls {
    fn get(&self, name: &str) -> Option<String> {
        self.0.lock().expect("queue urls").get(name).cloned()
    }

    fn insert(&self, name: &str, url: &str) {
        self.0
            .lock()
            .expect("queue urls")
            .insert(name.to_owned(), url.to_owned());
    }

    /// Forgets a URL whose queue is gone, so a queue created again is looked up again.
    fn forget_url(&self, url: &str) {
        self.0.lock().expect("queue urls").retain(|_, u| u != url);
    }
}

impl SqsPublisher {
    /// Builds the client from the standard AWS chain (credentials, and the region unless
    /// `config.region` is set). No request is made: an unreachable endpoint shows as transient
    /// publish failures.
    pub async fn connect(config: SqsConfig) -> Result<Self, Error> {
        config.validate().map_err(Error::Config)?;
        let mut loader =
            aws_config::defaults(BehaviorVersion::latest()).http_client(https_client());
        if !config.region.is_empty() {
            loader = loader.region(Region::new(config.region.clone()));
        } else if !config.endpoint_url.is_empty() {
            // Emulators ignore the region; the SDK needs one to sign.
            loader = loader.region(RegionProviderChain::default_provider().or_else("us-east-1"));
        }
        Self::from_sdk_config(config, &loader.load().await)
    }

    /// Builds the client from an SDK configuration the caller loaded (its credentials, region
    /// and HTTP client); `config`'s region, endpoint and timeouts override it.
    pub fn from_sdk_config(config: SqsConfig, sdk: &SdkConfig) -> Result<Self, Error> {
        config.validate().map_err(Error::Config)?;
        let mut builder = aws_sdk_sqs::config::Builder::from(sdk)
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(CONNECT_TIMEOUT.min(config.request_timeout))
                    .operation_attempt_timeout(config.request_timeout)
                    .operation_timeout(config.request_timeout)
                    .build(),
            )
            .retry_config(
                RetryConfig::standard()
                    .with_max_attempts(SDK_MAX_ATTEMPTS)
                    .with_max_backoff(Duration::from_secs(2)),
            );
        if sdk.behavior_version().is_none() {
            builder = builder.behavior_version(BehaviorVersion::latest());
        }
        if sdk.http_client().is_none() {
            builder = builder.http_client(https_client());
        }
        let region = if !config.region.is_empty() {
            Some(Region::new(config.region.clone()))
        } else if let Some(region) = sdk.region() {
            Some(region.clone())
        } else if !config.endpoint_url.is_empty() {
            // Emulators ignore the region; the SDK needs one to sign.
            Some(Region::new("us-east-1"))
        } else {
            None
        };
        let Some(region) = region else {
            return Err(Error::Config(
                "sqs.region: no region: set sqs.region, use the broker URL sqs://REGION, or set \
                 AWS_REGION"
                    .into(),
            ));
        };
        builder = builder.region(region.clone());
        if !config.endpoint_url.is_empty() {
            builder = builder.endpoint_url(config.endpoint_url.clone());
        }
        let client = Client::from_conf(builder.build());
        let urls = Arc::new(QueueUrls::default());
        let batcher = Batcher::new(
            SdkSender {
                client: client.clone(),
                urls: urls.clone(),
            },
            Limits {
                linger: config.batch_linger,
                max_bytes: config.max_message_bytes,
            },
        );
        tracing::info!(region = %config.region, endpoint = %crate::redact::url(&config.endpoint_url),
            "sqs publisher ready");
        Ok(Self {
            client,
            config,
            region: region.to_string(),
            urls,
            batcher,
        })
    }

    /// The queue URL of `destination`: itself when it is a URL, else found with `GetQueueUrl`
    /// once and cached.
    async fn queue_url(&self, destination: &str) -> Result<String, PublishError> {
        if is_url(destination) {
            return Ok(destination.to_owned());
        }
        if let Some(url) = self.urls.get(destination) {
            return Ok(url);
        }
        let answer = self
            .client
            .get_queue_url()
            .queue_name(destination)
            .send()
            .await
            .map_err(|e| {
                classify(
                    failure_of(&e),
                    format!("sqs: GetQueueUrl {destination:?}: {}", describe(&e)),
                )
            })?;
        let url = answer.queue_url().ok_or_else(|| {
            PublishError::transient(format!("sqs: GetQueueUrl {destination:?} returned no URL"))
        })?;
        self.urls.insert(destination, url);
        Ok(url.to_owned())
    }
}

/// The HTTPS client: hyper and rustls with ring, the roots of the operating system.
fn https_client() -> aws_sdk_sqs::config::SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

impl Publisher for SqsPublisher {
    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            check_payload_size(message, self.max_payload_bytes())?;
            self.check_destination(&message.destination)?;
            let url = self.queue_url(&message.destination).await?;
            let entry = encode(message, is_fifo(&message.destination));
            let size = entry.size();
            if size > self.config.max_message_bytes {
                return Err(PublishError::permanent(format!(
                    "sqs: message is {size} bytes with its attributes (body {} bytes), over the \
                     limit of {} bytes",
                    entry.body.len(),
                    self.config.max_message_bytes
                )));
            }
            self.batcher.submit(&url, entry).await
        })
    }

    fn name(&self) -> &'static str {
        "sqs"
    }

    fn max_payload_bytes(&self) -> usize {
        self.config.max_payload_bytes()
    }

    fn check_destination(&self, destination: &str) -> Result<(), PublishError> {
        check_destination(destination, &self.config, &self.region)
    }
}

/// Refuses, as permanent, a destination the relay may not send to; the error names it and the
/// rule. A destination is a queue name (1 to 80 of `A-Za-z0-9_-`, `.fifo` may follow and
/// counts in the 80), resolved in the relay's own account, or a queue URL
/// `ENDPOINT/ACCOUNT/NAME` on the endpoint in use (`config.endpoint_url`, else
/// `https://sqs.REGION.amazonaws.com` of `region`, the region in use) whose account is in
/// `sqs.queue_url_accounts`: a writer cannot send the event, with the relay's credentials, to
/// a queue of another account (one it owns and opened to anyone), another region or another
/// host. The queue's name must start with one of `sqs.queue_prefixes` when that is set.
fn check_destination(
    destination: &str,
    config: &SqsConfig,
    region: &str,
) -> Result<(), PublishError> {
    let name = match is_url(destination) {
        true => queue_url_name(destination, config, region)?,
        false => destination,
    };
    let stem = name.strip_suffix(".fifo").unwrap_or(name);
    let ok = !stem.is_empty()
        && name.len() <= 80
        && stem
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !ok {
        return Err(PublishError::permanent(format!(
            "sqs: {destination:?} is not a valid SQS queue name (1 to 80 characters of A-Z a-z \
             0-9 _ -, optionally ending in .fifo) nor a queue URL"
        )));
    }
    crate::wire::routing::check_prefixes("sqs.queue_prefixes", name, &config.queue_prefixes)
}

/// The queue name of queue URL `url`, once the URL is found on the endpoint in use and in an
/// allowed account.
fn queue_url_name<'a>(
    url: &'a str,
    config: &SqsConfig,
    region: &str,
) -> Result<&'a str, PublishError> {
    let refused = |rule: String| {
        Err(PublishError::permanent(format!(
            "sqs: queue URL {url:?} refused: {rule}"
        )))
    };
    let endpoint = match config.endpoint_url.as_str() {
        "" => format!("https://sqs.{region}.amazonaws.com"),
        endpoint => endpoint.trim_end_matches('/').to_owned(),
    };
    let path = url
        .strip_prefix(endpoint.as_str())
        .and_then(|rest| rest.strip_prefix('/'));
    let Some(path) = path else {
        return refused(format!("it is not on the endpoint in use, {endpoint}"));
    };
    let Some((account, name)) = path.split_once('/') else {
        return refused("it is not ENDPOINT/ACCOUNT/QUEUE".into());
    };
    if !config.queue_url_accounts.iter().any(|a| a == account) {
        return refused(format!(
            "account {account:?} is not in sqs.queue_url_accounts {:?}",
            config.queue_url_accounts
        ));
    }
    Ok(name)
}

fn is_url(destination: &str) -> bool {
    destination.starts_with("https://") || destination.starts_with("http://")
}

/// FIFO queues' names end in `.fifo` (for a URL, its last segment does).
fn is_fifo(destination: &str) -> bool {
    destination.trim_end_matches('/').ends_with(".fifo")
}

/// Sends batches with the SDK.
struct SdkSender {
    client: Client,
    urls: Arc<QueueUrls>,
}

impl SendBatch for SdkSender {
    fn send(
        &self,
        queue_url: String,
        entries: Vec<Entry>,
    ) -> BoxFuture<'_, Result<Vec<EntryResult>, PublishError>> {
        Box::pin(async move {
            let count = entries.len();
            debug_assert!(count <= MAX_ENTRIES);
            tracing::debug!(queue = %queue_url, entries = count, "sending SendMessageBatch");
            let mut request = self.client.send_message_batch().queue_url(&queue_url);
            for (i, entry) in entries.into_iter().enumerate() {
                request = request.entries(batch_entry(i, entry)?);
            }
            let output = match request.send().await {
                Ok(output) => output,
                Err(e) => {
                    let failure = failure_of(&e);
                    if let Failure::Service { code, .. } = failure {
                        if is_missing_queue(code) {
                            self.urls.forget_url(&queue_url);
                        }
                    }
                    return Err(classify(
                        failure,
                        format!("sqs: SendMessageBatch: {}", describe(&e)),
                    ));
                }
            };
            let mut results: Vec<EntryResult> = vec![
                Err(PublishError::transient(
                    "sqs: SendMessageBatch reported neither success nor failure for this entry"
                ));
                count
            ];
            let slot = |id: &str| id.parse::<usize>().ok().filter(|&i| i < count);
            for ok in output.successful() {
                if let Some(i) = slot(ok.id()) {
                    results[i] = Ok(());
                }
            }
            for failed in output.failed() {
                if let Some(i) = slot(failed.id()) {
                    results[i] = Err(classify(
                        Failure::Service {
                            code: failed.code(),
                            status: None,
                            sender_fault: Some(failed.sender_fault()),
                        },
                        format!(
                            "sqs: entry rejected: {}: {}",
                            failed.code(),
                            failed.message().unwrap_or("no message")
                        ),
                    ));
                }
            }
            Ok(results)
        })
    }
}

fn batch_entry(i: usize, entry: Entry) -> Result<SendMessageBatchRequestEntry, PublishError> {
    let build = |e: aws_sdk_sqs::error::BuildError| {
        PublishError::permanent(format!("sqs: building the batch entry: {e}"))
    };
    let mut builder = SendMessageBatchRequestEntry::builder()
        .id(i.to_string())
        .message_body(entry.body)
        .set_message_group_id(entry.group_id)
        .set_message_deduplication_id(entry.deduplication_id);
    for (name, value) in entry.attributes {
        let value = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(value)
            .build()
            .map_err(build)?;
        builder = builder.message_attributes(name, value);
    }
    builder.build().map_err(build)
}

/// What failed, as far as the class goes: the SDK's errors and a batch's failed entries both
/// come down to this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure<'a> {
    /// SQS answered with an error code (`status` for a whole request, `sender_fault` for an
    /// entry of a batch).
    Service {
        code: &'a str,
        status: Option<u16>,
        sender_fault: Option<bool>,
    },
    /// No answer in time (connect, attempt or operation timeout).
    Timeout,
    /// No answer at all: connection refused or reset, DNS, TLS, credentials not found.
    Dispatch,
    /// An answer the SDK could not read.
    Response,
    /// The SDK could not build the request.
    Construction,
}

fn failure_of<E: ProvideErrorMetadata>(
    error: &SdkError<E, aws_sdk_sqs::config::http::HttpResponse>,
) -> Failure<'_> {
    match error {
        SdkError::ServiceError(e) => Failure::Service {
            code: e.err().code().unwrap_or(""),
            status: Some(e.raw().status().as_u16()),
            sender_fault: None,
        },
        SdkError::TimeoutError(_) => Failure::Timeout,
        SdkError::DispatchFailure(e) if e.is_timeout() => Failure::Timeout,
        SdkError::DispatchFailure(_) => Failure::Dispatch,
        SdkError::ResponseError(_) => Failure::Response,
        SdkError::ConstructionFailure(_) => Failure::Construction,
        _ => Failure::Dispatch,
    }
}

/// A one-line account of an SDK error for `last_error`: the service's code and message, or the
/// chain of causes (the SDK's `Debug` output would carry whole responses).
fn describe<E>(error: &SdkError<E, aws_sdk_sqs::config::http::HttpResponse>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    if let SdkError::ServiceError(e) = error {
        return format!(
            "{} (HTTP {}): {}",
            e.err().code().unwrap_or("unknown error"),
            e.raw().status().as_u16(),
            e.err().message().unwrap_or("no message")
        );
    }
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

fn is_missing_queue(code: &str) -> bool {
    matches!(
        code,
        "QueueDoesNotExist" | "AWS.SimpleQueueService.NonExistentQueue"
    )
}

/// Classifies a failure: the one place SQS outcomes become retry decisions.
///
/// Transient: throttling, SQS's own faults (5xx), timeouts, no connection, unreadable answers,
/// requests the SDK could not build (credentials or region missing: the operator fixes the
/// environment; no event is at fault), and authentication failures (bad or expired keys, clock
/// skew: every event fails alike, so the relay backs off instead of dead-lettering them all).
/// Permanent: the queue does not exist, the message is invalid or too large, a parameter is
/// invalid, access to the queue (or its KMS key) is denied. Unknown codes: a sender fault or a
/// 4xx is permanent, anything else transient.
fn classify(failure: Failure<'_>, text: String) -> PublishError {
    match failure {
        Failure::Timeout | Failure::Dispatch | Failure::Response | Failure::Construction => {
            PublishError::transient(text)
        }
        Failure::Service {
            code,
            status,
            sender_fault,
        } => match code.strip_prefix("AWS.SimpleQueueService.").unwrap_or(code) {
            "ThrottlingException"
            | "Throttling"
            | "RequestThrottled"
            | "ThrottledException"
            | "RequestLimitExceeded"
            | "KmsThrottled"
            | "OverLimit"
            | "ServiceUnavailable"
            | "InternalError"
            | "InternalFailure"
            | "InternalServerError"
            | "RequestTimeout"
            | "RequestTimeoutException"
            | "ExpiredToken"
            | "ExpiredTokenException"
            | "RequestExpired"
            | "InvalidClientTokenId"
            | "UnrecognizedClientException"
            | "SignatureDoesNotMatch"
            | "IncompleteSignature"
            | "MissingAuthenticationToken" => PublishError::transient(text),
            "QueueDoesNotExist"
            | "NonExistentQueue"
            | "InvalidMessageContents"
            | "MessageTooLong"
            | "BatchRequestTooLong"
            | "InvalidParameterValue"
            | "InvalidParameterValueException"
            | "InvalidParameterCombination"
            | "MissingParameter"
            | "InvalidAttributeName"
            | "InvalidAttributeValue"
            | "InvalidBatchEntryId"
            | "BatchEntryIdsNotDistinct"
            | "EmptyBatchRequest"
            | "TooManyEntriesInBatchRequest"
            | "UnsupportedOperation"
            | "InvalidAddress"
            | "InvalidSecurity"
            | "ValidationError"
            | "ValidationException"
            | "AccessDenied"
            | "AccessDeniedException"
            | "OptInRequired"
            | "KmsAccessDenied"
            | "KmsDisabled"
            | "KmsInvalidKeyUsage"
            | "KmsInvalidState"
            | "KmsNotFound"
            | "KmsOptInRequired" => PublishError::permanent(text),
            _ => match (sender_fault, status) {
                (_, Some(408 | 429)) => PublishError::transient(text),
                (Some(true), _) => PublishError::permanent(text),
                (_, Some(400..=499)) => PublishError::permanent(text),
                _ => PublishError::transient(text),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publisher::FailureClass::{self, Permanent, Transient};

    fn service(code: &str, status: Option<u16>, sender_fault: Option<bool>) -> Failure<'_> {
        Failure::Service {
            code,
            status,
            sender_fault,
        }
    }

    fn class(failure: Failure<'_>) -> FailureClass {
        classify(failure, "x".into()).class
    }

    #[test]
    fn classifies_failures() {
        let cases = [
            (service("ThrottlingException", Some(400), None), Transient),
            (service("RequestThrottled", None, Some(false)), Transient),
            (service("KmsThrottled", None, Some(false)), Transient),
            (service("InternalError", Some(500), None), Transient),
            (service("ServiceUnavailable", Some(503), None), Transient),
            (service("SomethingNew", Some(502), None), Transient),
            (service("SomethingNew", None, Some(false)), Transient),
            (service("SomethingNew", Some(429), None), Transient),
            (service("InvalidClientTokenId", Some(403), None), Transient),
            (service("QueueDoesNotExist", Some(400), None), Permanent),
            (
                service("AWS.SimpleQueueService.NonExistentQueue", Some(400), None),
                Permanent,
            ),
            (
                service("InvalidMessageContents", None, Some(true)),
                Permanent,
            ),
            (service("MessageTooLong", None, Some(true)), Permanent),
            (
                service(
                    "AWS.SimpleQueueService.BatchRequestTooLong",
                    Some(400),
                    None,
                ),
                Permanent,
            ),
            (
                service("InvalidParameterValue", None, Some(true)),
                Permanent,
            ),
            (service("AccessDenied", Some(403), None), Permanent),
            (service("KmsAccessDenied", None, Some(true)), Permanent),
            (service("SomethingNew", None, Some(true)), Permanent),
            (service("SomethingNew", Some(400), None), Permanent),
            (Failure::Timeout, Transient),
            (Failure::Dispatch, Transient),
            (Failure::Response, Transient),
            (Failure::Construction, Transient),
        ];
        for (failure, expected) in cases {
            assert_eq!(class(failure), expected, "{failure:?}");
        }
    }

    #[test]
    fn validates_destinations() {
        let config = SqsConfig::default();
        for ok in [
            "orders",
            "orders-v2_x",
            "orders.fifo",
            &"a".repeat(80),
            &format!("{}.fifo", "a".repeat(75)),
        ] {
            check_destination(ok, &config, "eu-west-1").unwrap();
        }
        for bad in [
            "",
            ".fifo",
            "a b",
            "orders.v2",
            "ordérs",
            &"a".repeat(81),
            &format!("{}.fifo", "a".repeat(76)),
            "https://",
            "http://127.0.0.1:4566/000000000000/q",
            "arn:aws:sqs:eu-west-1:123456789012:orders",
        ] {
            let error = check_destination(bad, &config, "eu-west-1").unwrap_err();
            assert_eq!(error.class, Permanent, "{bad:?}");
            assert!(error.message.contains(&format!("{bad:?}")), "{error}");
        }
    }

    /// A queue URL must be on the endpoint in use, in an allowed account, and a name inside
    /// the allowed prefixes; each refusal names the URL and the rule.
    #[test]
    fn queue_urls_stay_in_the_configured_accounts_region_and_prefixes() {
        let own = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders";
        let refused = |destination: &str, config: &SqsConfig, rule: &str| {
            let error = check_destination(destination, config, "eu-west-1").unwrap_err();
            assert_eq!(error.class, Permanent, "{destination}");
            assert!(
                error.message.contains(&format!("{destination:?}")) && error.message.contains(rule),
                "{error}"
            );
        };
        // No account allowed: no URL at all.
        refused(own, &SqsConfig::default(), "sqs.queue_url_accounts");
        let config = SqsConfig {
            queue_url_accounts: vec!["123456789012".into()],
            ..Default::default()
        };
        check_destination(own, &config, "eu-west-1").unwrap();
        refused(
            "https://sqs.eu-west-1.amazonaws.com/999999999999/drop",
            &config,
            "account \"999999999999\"",
        );
        refused(
            "https://sqs.us-east-1.amazonaws.com/123456789012/orders",
            &config,
            "endpoint in use",
        );
        refused(
            "https://sqs.eu-west-1.amazonaws.com.evil.example/123456789012/orders",
            &config,
            "endpoint in use",
        );
        refused(
            "https://evil.example/123456789012/orders",
            &config,
            "endpoint in use",
        );
        refused(
            "https://sqs.eu-west-1.amazonaws.com/123456789012/a/b",
            &config,
            "not a valid",
        );
        let emulator = SqsConfig {
            endpoint_url: "http://127.0.0.1:4566".into(),
            queue_url_accounts: vec!["000000000000".into()],
            queue_prefixes: vec!["orders-".into()],
            ..Default::default()
        };
        check_destination(
            "http://127.0.0.1:4566/000000000000/orders-placed",
            &emulator,
            "us-east-1",
        )
        .unwrap();
        check_destination("orders-placed.fifo", &emulator, "us-east-1").unwrap();
        refused("billing", &emulator, "sqs.queue_prefixes");
        let error = check_destination(
            "http://127.0.0.1:4566/000000000000/billing",
            &emulator,
            "us-east-1",
        )
        .unwrap_err();
        assert!(error.message.contains("sqs.queue_prefixes"), "{error}");
    }

    #[test]
    fn recognises_fifo_queues() {
        assert!(is_fifo("orders.fifo"));
        assert!(is_fifo("https://sqs.x.amazonaws.com/1/orders.fifo"));
        assert!(!is_fifo("orders"));
    }

    #[test]
    fn batch_entries_carry_everything() {
        let message = crate::wire::message::sample(3, "a1");
        let built = batch_entry(4, encode(&message, true)).unwrap();
        assert_eq!(built.id(), "4");
        assert_eq!(built.message_body(), "{}");
        assert_eq!(built.message_group_id(), Some("order:a1"));
        assert_eq!(
            built.message_deduplication_id(),
            Some(message.event_id.to_string().as_str())
        );
        let attributes = built.message_attributes().unwrap();
        assert_eq!(
            attributes["event-id"].string_value(),
            Some(message.event_id.to_string().as_str())
        );
        assert!(attributes.len() <= 10);
    }
}
