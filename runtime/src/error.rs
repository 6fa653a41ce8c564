//! The one error type of the runtime crate.

/// The error a variant wraps, kept as its `source()` so the chain is not lost.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// `message: cause`, the cause alone without a message, the message alone without a cause: the text each
/// variant showed when it carried the cause as a string. For the error types of the crates built on this one
/// too (`#[error("...: {}", with_cause(message, source))]`).
pub fn with_cause(message: &str, source: &Option<Cause>) -> String {
    match source {
        Some(cause) if message.is_empty() => cause.to_string(),
        Some(cause) => format!("{message}: {cause}"),
        None => message.to_owned(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Logging or tracing could not be set up.
    #[error("telemetry: {}", with_cause(message, source))]
    Telemetry {
        message: String,
        #[source]
        source: Option<Cause>,
    },

    /// The Lease could not be created, read or kept.
    #[error("leader election: {}", with_cause(message, source))]
    LeaderElection {
        message: String,
        #[source]
        source: Option<Cause>,
    },

    /// A TLS setting (version, cipher suites) or the TLS configuration built from it is unusable.
    #[error("TLS: {}", with_cause(message, source))]
    Tls {
        message: String,
        #[source]
        source: Option<Cause>,
    },

    /// The secure metrics port has no Kubernetes client to review its callers with.
    #[error("secure metrics: {}", with_cause(message, source))]
    MetricsAuth {
        message: String,
        #[source]
        source: Option<Cause>,
    },

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
            Error::MetricsAuth { .. } => "MetricsAuth",
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_wrapped_error_is_the_source_and_the_text_is_unchanged() {
        let cause = || Some(Cause::from(std::io::Error::other("connection refused")));
        let exporter = Error::Telemetry {
            message: "OTLP exporter".into(),
            source: cause(),
        };
        assert_eq!(
            exporter.to_string(),
            "telemetry: OTLP exporter: connection refused"
        );
        assert_eq!(
            exporter.source().map(ToString::to_string).as_deref(),
            Some("connection refused")
        );
        let bare = Error::Tls {
            message: String::new(),
            source: cause(),
        };
        assert_eq!(bare.to_string(), "TLS: connection refused");
        let own = Error::LeaderElection {
            message: "the Lease call timeout must be above zero".into(),
            source: None,
        };
        assert_eq!(
            own.to_string(),
            "leader election: the Lease call timeout must be above zero"
        );
        assert!(own.source().is_none());
    }
}
