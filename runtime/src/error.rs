//! The one error type of the runtime crate.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Logging or tracing could not be set up.
    #[error("telemetry: {message}")]
    Telemetry { message: String },

    /// The Lease could not be created, read or kept.
    #[error("leader election: {message}")]
    LeaderElection { message: String },

    /// A TLS setting (version, cipher suites) or the TLS configuration built from it is unusable.
    #[error("TLS: {message}")]
    Tls { message: String },

    /// Reading a file or binding a socket failed.
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
            Error::Telemetry { .. } => "Telemetry",
            Error::Io { .. } => "Io",
            Error::LeaderElection { .. } => "LeaderElection",
            Error::Tls { .. } => "Tls",
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}
