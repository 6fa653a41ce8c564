//! The one error type of provider-service and its backends. Each variant maps to one gRPC status
//! code (see provider-service's `grpc::status`); [`Error::reason`] is a stable label for logs and metrics.

use std::time::Duration;

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

    /// The configuration is unusable. Never carries a secret value, only the key.
    #[error("config {key}: {message}")]
    Config { key: String, message: String },

    /// The cloud throttled us; try again after `retry_after`.
    #[error("cloud throttled the call, retry after {retry_after:?}: {message}")]
    Throttled {
        retry_after: Duration,
        message: String,
    },

    /// The cloud (or hypervisor) cannot be reached now.
    #[error("cloud unavailable: {message}")]
    Unavailable { message: String },

    /// The cloud refused this service's own credentials as lacking a permission.
    #[error("cloud refused the service's credentials: {message}")]
    CloudPermissionDenied { message: String },

    /// The cloud does not accept this service's credentials at all (wrong, expired or revoked):
    /// a deployment problem the caller cannot fix, so not the caller's PERMISSION_DENIED.
    #[error("cloud rejected the service's credentials (check the provider secret): {message}")]
    CloudUnauthenticated { message: String },

    /// The caller presented no valid token.
    #[error("unauthenticated: {message}")]
    Unauthenticated { message: String },

    /// The caller's token cannot be checked now (the Kubernetes API does not answer).
    #[error("cannot verify the caller's token now: {message}")]
    AuthUnavailable { message: String },

    /// The caller is authenticated but not in the allow-list.
    #[error("caller {caller} is not allowed")]
    CallerNotAllowed { caller: String },

    /// The instance exists but does not carry this cluster's tag: deleting it is refused.
    #[error("not this cluster's instance: {message}")]
    NotOwnedByCluster { message: String },

    /// The caller is allowed, but not to call this method.
    #[error("caller {caller} is not allowed to call {method}")]
    MethodNotAllowed {
        caller: String,
        method: &'static str,
    },

    /// TLS certificate or key cannot be loaded.
    #[error("tls: {message}")]
    Tls { message: String },

    /// Reading or binding something local failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// Anything else went wrong; the message says what.
    #[error("internal: {message}")]
    Internal { message: String },
}

impl Error {
    /// Stable, low-cardinality name of the variant, for metric labels and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::InvalidArgument { .. } => "InvalidArgument",
            Error::UnknownProvider { .. } => "UnknownProvider",
            Error::ProviderNotConfigured { .. } => "ProviderNotConfigured",
            Error::Config { .. } => "InvalidConfig",
            Error::Throttled { .. } => "Throttled",
            Error::Unavailable { .. } => "CloudUnavailable",
            Error::CloudPermissionDenied { .. } => "CloudPermissionDenied",
            Error::CloudUnauthenticated { .. } => "CloudUnauthenticated",
            Error::Unauthenticated { .. } => "Unauthenticated",
            Error::AuthUnavailable { .. } => "AuthUnavailable",
            Error::CallerNotAllowed { .. } => "CallerNotAllowed",
            Error::MethodNotAllowed { .. } => "MethodNotAllowed",
            Error::NotOwnedByCluster { .. } => "NotOwnedByCluster",
            Error::Tls { .. } => "Tls",
            Error::Io { .. } => "Io",
            Error::Internal { .. } => "Internal",
        }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field,
            message: message.into(),
        }
    }

    /// Shorthand for [`Error::Io`].
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}
