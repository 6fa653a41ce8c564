//! provider-service's one error type: a backend's [`ProviderError`] (the domain's, shared with every
//! cloud crate), or one of the server's own (caller authentication, its TLS certificate, a
//! configuration that leaves nothing to serve). Each maps to one gRPC status code ([`status`]);
//! [`Error::reason`] is a stable label for logs, metrics and `google.rpc.ErrorInfo`.

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

pub use peerpods_provider_core::Error as ProviderError;

/// `ErrorInfo.domain` of every error detail this service sends.
pub const ERROR_DOMAIN: &str = "provider.peerpods.io";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// What a backend or the domain layer reported (bad input, the cloud's answer, a bad key).
    #[error(transparent)]
    Provider(#[from] ProviderError),

    /// No cloud is served: the configuration names none (`CLOUD_PROVIDER` unset outside
    /// development mode) or was refused. `reason` is the stable reason of the cause
    /// (`ProviderNotConfigured`, `InvalidConfig`, ...), `why` says what to fix.
    #[error("provider-service serves no cloud: {why}")]
    NotServing { reason: &'static str, why: String },

    /// The caller presented no valid token.
    #[error("unauthenticated: {message}")]
    Unauthenticated { message: String },

    /// The caller's token cannot be checked now (the Kubernetes API does not answer).
    #[error("cannot verify the caller's token now: {message}")]
    AuthUnavailable { message: String },

    /// The caller is authenticated but not in the allow-list.
    #[error("caller {caller} is not allowed")]
    CallerNotAllowed { caller: String },

    /// The caller is allowed, but not to call this method.
    #[error("caller {caller} is not allowed to call {method}")]
    MethodNotAllowed {
        caller: String,
        method: &'static str,
    },

    /// The gRPC port's certificate or key cannot be loaded.
    #[error("tls: {message}")]
    Tls { message: String },

    /// The service is shutting down: it finishes the deletes it runs but starts no new one.
    #[error("provider-service is shutting down; ask another replica or again later")]
    ShuttingDown,

    /// The delete runs on (see [`crate::deletes`]) but is not confirmed yet, answered to a caller
    /// that did not say it understands DELETE_RESULT_IN_PROGRESS.
    #[error("the delete of {instance_id} is still in progress; ask again in {} s", retry_after.as_secs().max(1))]
    DeleteInProgress {
        instance_id: String,
        retry_after: std::time::Duration,
    },
}

impl Error {
    /// Stable, low-cardinality name of the variant, for metric labels and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Provider(e) => e.reason(),
            Error::NotServing { reason, .. } => reason,
            Error::Unauthenticated { .. } => "Unauthenticated",
            Error::AuthUnavailable { .. } => "AuthUnavailable",
            Error::CallerNotAllowed { .. } => "CallerNotAllowed",
            Error::MethodNotAllowed { .. } => "MethodNotAllowed",
            Error::Tls { .. } => "Tls",
            Error::ShuttingDown => "ShuttingDown",
            Error::DeleteInProgress { .. } => "DeleteInProgress",
        }
    }

    /// Whether this is the service's own fault (logged as an error, not a warning).
    pub fn is_internal(&self) -> bool {
        matches!(
            self,
            Error::Tls { .. }
                | Error::Provider(ProviderError::Internal { .. } | ProviderError::Io { .. })
        )
    }

    /// Shorthand for a [`ProviderError::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        Error::Provider(ProviderError::Internal {
            message: message.into(),
        })
    }

    /// Shorthand for a [`ProviderError::Io`].
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Provider(ProviderError::io(context, source))
    }
}

/// The status code and details for an error. Throttling carries `google.rpc.RetryInfo`; every
/// error carries `google.rpc.ErrorInfo` with the stable reason.
pub fn status(e: &Error) -> Status {
    let code = match e {
        Error::Provider(p) => provider_code(p),
        Error::NotServing { .. } => Code::FailedPrecondition,
        Error::AuthUnavailable { .. } => Code::Unavailable,
        Error::CallerNotAllowed { .. } | Error::MethodNotAllowed { .. } => Code::PermissionDenied,
        Error::Unauthenticated { .. } => Code::Unauthenticated,
        Error::Tls { .. } => Code::Internal,
        Error::ShuttingDown | Error::DeleteInProgress { .. } => Code::Unavailable,
    };
    let mut details = ErrorDetails::with_error_info(e.reason(), ERROR_DOMAIN, HashMap::new());
    if let Error::Provider(ProviderError::Throttled { retry_after, .. })
    | Error::DeleteInProgress { retry_after, .. } = e
    {
        details.set_retry_info(Some(*retry_after));
    }
    Status::with_error_details(code, e.to_string(), details)
}

fn provider_code(e: &ProviderError) -> Code {
    match e {
        ProviderError::InvalidArgument { .. } | ProviderError::UnknownProvider { .. } => {
            Code::InvalidArgument
        }
        // The caller cannot fix another cluster's instance, a protected one or this service's
        // configuration and cloud credentials: none is the caller's PERMISSION_DENIED.
        ProviderError::ProviderNotConfigured { .. }
        | ProviderError::Config { .. }
        | ProviderError::NotOwnedByCluster { .. }
        | ProviderError::DoNotDelete { .. }
        | ProviderError::CloudUnauthenticated { .. } => Code::FailedPrecondition,
        ProviderError::Throttled { .. } => Code::ResourceExhausted,
        ProviderError::Unavailable { .. } => Code::Unavailable,
        ProviderError::CloudPermissionDenied { .. } => Code::PermissionDenied,
        // Anything else a backend reports (its own TLS set-up, I/O, internal trouble) is ours.
        _ => Code::Internal,
    }
}
