/// Errors that stop the relay from starting or running. Publishing failures are not here: they
/// are [`crate::publisher::PublishError`]s, recorded on the event, never fatal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid; the message names the field.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A setting could not be read: `field` names it, the source says why.
    #[error("invalid configuration: {field}")]
    Setting {
        /// The setting, as the configuration file names it (`redis.url`).
        field: String,
        /// Why it could not be read.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The database refused or could not be reached.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// The outbox schema is missing or from another version.
    #[error(transparent)]
    Outbox(#[from] outbox::Error),
    /// The broker could not be set up (connection, stream or exchange creation).
    #[error("broker set-up failed: {context}")]
    Broker {
        /// What was being set up, on which broker.
        context: String,
        /// The broker client's error, when one caused it.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The metrics/health listener could not start.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address that was asked for.
        addr: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// A broker set-up failure while doing `context`, caused by `source` (kept as the error's
    /// source).
    pub(crate) fn broker(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Broker {
            context: context.into(),
            source: Some(source.into()),
        }
    }
}

/// The text of a caught panic, cut to 200 characters (it is stored in `last_error`).
pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into());
    text.chars().take(200).collect()
}
