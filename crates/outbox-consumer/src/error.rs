/// Errors that stop a consumer runner (set-up, lost broker connection it cannot recover).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid; the message names the field.
    #[error("invalid consumer configuration: {0}")]
    Config(String),
    /// The broker refused or could not be reached.
    #[error("broker: {0}")]
    Broker(String),
}
