//! The one error type of the provider-service client.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint or the TLS settings are unusable (an https endpoint without a CA file, a CA file that holds
    /// no certificate).
    #[error("provider client: {message}")]
    Config { message: String },

    /// tonic refused the endpoint address or the TLS configuration built for it.
    #[error("provider client: {context}: {source}")]
    Transport {
        context: String,
        #[source]
        source: tonic::transport::Error,
    },

    /// Reading the CA file failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Stable, low-cardinality name of the variant.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Config { .. } | Error::Transport { .. } => "ProviderClient",
            Error::Io { .. } => "Io",
        }
    }
}
