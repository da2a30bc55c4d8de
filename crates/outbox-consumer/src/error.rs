/// Errors that stop a consumer runner (set-up, lost broker connection it cannot recover).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid; the message names the field.
    #[error("invalid consumer configuration: {0}")]
    Config(String),
    /// The broker refused or could not be reached.
    #[error("broker: {context}")]
    Broker {
        /// What was being done, on which broker and destination.
        context: String,
        /// The broker client's error, when one caused it.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl Error {
    /// A broker failure while doing `context`, caused by `source` (kept as the error's source).
    pub(crate) fn broker(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Broker {
            context: context.into(),
            source: Some(source.into()),
        }
    }

    /// A broker failure that no other error caused (a stream that ended, a header missing).
    pub(crate) fn broker_message(context: impl Into<String>) -> Self {
        Self::Broker {
            context: context.into(),
            source: None,
        }
    }
}
