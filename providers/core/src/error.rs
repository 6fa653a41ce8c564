//! The one error type of the domain and every cloud backend. Each variant maps to one gRPC status
//! code (see provider-service's `error::status`); [`Error::reason`] is a stable label for logs and
//! metrics. The server's own errors (caller authentication, its TLS certificate) are provider-service's,
//! not here: every backend compiles this crate.

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

    /// The configuration is unusable. Never carries a credential's value: only the key, and for a number, a
    /// duration or a switch the bad value ([`crate::ProviderConfig::number`] and its kin).
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
        match self {
            Error::InvalidArgument { .. } => "InvalidArgument",
            Error::UnknownProvider { .. } => "UnknownProvider",
            Error::ProviderNotConfigured { .. } => "ProviderNotConfigured",
            Error::Config { .. } => "InvalidConfig",
            Error::Throttled { .. } => "Throttled",
            Error::Unavailable { .. } => "CloudUnavailable",
            Error::CloudPermissionDenied { .. } => "CloudPermissionDenied",
            Error::CloudUnauthenticated { .. } => "CloudUnauthenticated",
            Error::NotOwnedByCluster { .. } => "NotOwnedByCluster",
            Error::DoNotDelete { .. } => "DoNotDelete",
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
