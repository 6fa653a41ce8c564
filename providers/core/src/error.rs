//! The one error type of the domain and every cloud backend. Each variant maps to one gRPC status
//! code (see provider-service's `error::status`); [`Error::reason`] is a stable label for logs and
//! metrics. The server's own errors (caller authentication, its TLS certificate) are provider-service's,
//! not here: every backend compiles this crate.

use peerpods_proto::ErrorReason;
use std::time::Duration;

/// The error another library gave us, kept so [`std::error::Error::source`] walks to the original cause
/// (a transport failure, an SDK error, a parse error) while the message stays this service's words.
pub type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field is malformed, empty or too long. `field` is the proto field name.
    #[error("{field}: {message}")]
    InvalidArgument {
        field: &'static str,
        message: String,
    },

    /// `cloud_provider` is not a provider name cloud-api-adaptor knows.
    #[error("cloud_provider: unknown provider {name:?}")]
    UnknownProvider { name: String },

    /// `cloud_provider` is a known name, but this service has no configuration for it.
    #[error("cloud_provider: provider {name:?} is not configured on this service")]
    ProviderNotConfigured { name: String },

    /// The configuration is unusable. Never carries a credential's value: only the key, and for a number, a
    /// duration or a switch the bad value ([`crate::ProviderConfig::number`] and its kin).
    #[error("config {key}: {message}")]
    Config {
        key: String,
        message: String,
        #[source]
        source: Option<Source>,
    },

    /// The cloud throttled us; try again after `retry_after`.
    #[error("cloud throttled the call, retry after {retry_after:?}: {message}")]
    Throttled {
        retry_after: Duration,
        message: String,
        #[source]
        source: Option<Source>,
    },

    /// The cloud (or hypervisor) cannot be reached now.
    #[error("cloud unavailable: {message}")]
    Unavailable {
        message: String,
        #[source]
        source: Option<Source>,
    },

    /// The cloud refused this service's own credentials as lacking a permission.
    #[error("cloud refused the service's credentials: {message}")]
    CloudPermissionDenied {
        message: String,
        #[source]
        source: Option<Source>,
    },

    /// The cloud does not accept this service's credentials at all (wrong, expired or revoked):
    /// a deployment problem the caller cannot fix, so not the caller's PERMISSION_DENIED.
    #[error("cloud rejected the service's credentials (check the provider secret): {message}")]
    CloudUnauthenticated {
        message: String,
        #[source]
        source: Option<Source>,
    },

    /// The instance exists but does not carry this cluster's tag: deleting it is refused.
    #[error("not this cluster's instance: {message}")]
    NotOwnedByCluster { message: String },

    /// The instance carries the do-not-delete tag ([`crate::DO_NOT_DELETE_TAG`]): deleting it is
    /// refused on every path until someone removes the tag (or sets it to `false`).
    #[error("instance {instance_id} is marked do-not-delete (tag {tag}={value:?})")]
    DoNotDelete {
        instance_id: String,
        tag: &'static str,
        value: String,
    },

    /// A backend's TLS client set-up failed (e.g. a CA bundle that cannot be read as certificates).
    #[error("tls: {message}")]
    Tls {
        message: String,
        #[source]
        source: Option<Source>,
    },

    /// Reading or binding something local failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// Anything else went wrong; the message says what.
    #[error("internal: {message}")]
    Internal {
        message: String,
        #[source]
        source: Option<Source>,
    },
}

impl Error {
    /// What a backend's own settings problem says about a key this error refused: a config error's message
    /// (the key is the caller's to name), any other error's whole text.
    pub fn into_config_reason(self) -> String {
        match self {
            Error::Config { message, .. } => message,
            other => other.to_string(),
        }
    }

    /// Stable, low-cardinality name of the variant, for metric labels and logs.
    pub fn reason(&self) -> &'static str {
        self.error_reason().as_str()
    }

    /// The reason provider-service sends for this error (`ErrorInfo.reason`, provider.proto).
    pub fn error_reason(&self) -> ErrorReason {
        match self {
            Error::InvalidArgument { .. } => ErrorReason::InvalidArgument,
            Error::UnknownProvider { .. } => ErrorReason::UnknownProvider,
            Error::ProviderNotConfigured { .. } => ErrorReason::ProviderNotConfigured,
            Error::Config { .. } => ErrorReason::InvalidConfig,
            Error::Throttled { .. } => ErrorReason::Throttled,
            Error::Unavailable { .. } => ErrorReason::CloudUnavailable,
            Error::CloudPermissionDenied { .. } => ErrorReason::CloudPermissionDenied,
            Error::CloudUnauthenticated { .. } => ErrorReason::CloudUnauthenticated,
            Error::NotOwnedByCluster { .. } => ErrorReason::NotOwnedByCluster,
            Error::DoNotDelete { .. } => ErrorReason::DoNotDelete,
            Error::Tls { .. } => ErrorReason::Tls,
            Error::Io { .. } => ErrorReason::Io,
            Error::Internal { .. } => ErrorReason::Internal,
        }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field,
            message: message.into(),
        }
    }

    /// Shorthand for [`Error::Config`] about `key`, with no underlying error.
    pub fn config(key: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config {
            key: key.into(),
            message: message.into(),
            source: None,
        }
    }

    /// Shorthand for [`Error::Throttled`], with no underlying error.
    pub fn throttled(retry_after: Duration, message: impl Into<String>) -> Self {
        Error::Throttled {
            retry_after,
            message: message.into(),
            source: None,
        }
    }

    /// Shorthand for [`Error::Unavailable`], with no underlying error.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::Unavailable {
            message: message.into(),
            source: None,
        }
    }

    /// Shorthand for [`Error::CloudPermissionDenied`], with no underlying error.
    pub fn cloud_permission_denied(message: impl Into<String>) -> Self {
        Error::CloudPermissionDenied {
            message: message.into(),
            source: None,
        }
    }

    /// Shorthand for [`Error::CloudUnauthenticated`], with no underlying error.
    pub fn cloud_unauthenticated(message: impl Into<String>) -> Self {
        Error::CloudUnauthenticated {
            message: message.into(),
            source: None,
        }
    }

    /// Shorthand for [`Error::Tls`], with no underlying error.
    pub fn tls(message: impl Into<String>) -> Self {
        Error::Tls {
            message: message.into(),
            source: None,
        }
    }

    /// Shorthand for [`Error::Internal`], with no underlying error.
    pub fn internal(message: impl Into<String>) -> Self {
        Error::Internal {
            message: message.into(),
            source: None,
        }
    }

    /// The same error, caused by `cause`: [`std::error::Error::source`] then returns it, and the Display
    /// text stays the message alone. Only the variants that can wrap another error keep it; the request's
    /// own faults (an invalid argument, an unknown provider, an instance not ours) are never caused by
    /// another error, so they come back unchanged, and [`Error::Io`] already names its cause.
    pub fn with_source(mut self, cause: impl Into<Source>) -> Self {
        match &mut self {
            Error::Config { source, .. }
            | Error::Throttled { source, .. }
            | Error::Unavailable { source, .. }
            | Error::CloudPermissionDenied { source, .. }
            | Error::CloudUnauthenticated { source, .. }
            | Error::Tls { source, .. }
            | Error::Internal { source, .. } => *source = Some(cause.into()),
            Error::InvalidArgument { .. }
            | Error::UnknownProvider { .. }
            | Error::ProviderNotConfigured { .. }
            | Error::NotOwnedByCluster { .. }
            | Error::DoNotDelete { .. }
            | Error::Io { .. } => {}
        }
        self
    }

    /// Shorthand for [`Error::Io`].
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
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
    fn a_wrapped_error_is_the_source_and_the_message_is_unchanged() {
        let cause = std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset by peer",
        );
        let error = Error::unavailable(format!("describe instances: {cause}")).with_source(cause);

        assert_eq!(
            error.to_string(),
            "cloud unavailable: describe instances: connection reset by peer"
        );
        let source = error.source().expect("the wrapped error is the source");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("the source is the io error itself");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
    }

    #[test]
    fn every_wrapping_variant_keeps_its_source() {
        let wrapping = [
            Error::config("KEY", "bad"),
            Error::throttled(Duration::from_secs(1), "slow down"),
            Error::unavailable("down"),
            Error::cloud_permission_denied("no"),
            Error::cloud_unauthenticated("who"),
            Error::tls("pem"),
            Error::internal("oops"),
        ];
        for error in wrapping {
            let text = error.to_string();
            let reason = error.reason();
            assert!(
                error.source().is_none(),
                "{reason} has no source until given one"
            );
            let error = error.with_source("the cause");
            assert_eq!(error.to_string(), text, "{reason}: Display does not change");
            assert_eq!(
                error.source().map(|s| s.to_string()).as_deref(),
                Some("the cause"),
                "{reason} keeps its source"
            );
        }
    }

    #[test]
    fn an_answer_parsed_from_the_cloud_has_no_source() {
        // Built from the cloud's error body, not from another error: nothing to walk to.
        assert!(
            Error::cloud_permission_denied("UnauthorizedOperation: no")
                .source()
                .is_none()
        );
    }
}
