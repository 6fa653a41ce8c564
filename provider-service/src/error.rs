//! provider-service's one error type: a backend's [`ProviderError`] (the domain's, shared with every
//! cloud crate), or one of the server's own (caller authentication, its TLS certificate, a
//! configuration that leaves nothing to serve). Each maps to one gRPC status code ([`status`]);
//! [`Error::reason`] is a stable label for logs, metrics and `google.rpc.ErrorInfo`.

use std::collections::HashMap;
use std::sync::Arc;

use peerpods_proto::ErrorReason;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

pub use peerpods_provider_core::Error as ProviderError;

/// `ErrorInfo.domain` of every error detail this service sends.
pub const ERROR_DOMAIN: &str = "provider.peerpods.io";

/// The error a variant wraps, kept as its `source()`. Shared: one token review's failure answers every
/// caller waiting on that review.
pub type Cause = Arc<dyn std::error::Error + Send + Sync>;

/// `message: cause`, the cause alone without a message, the message alone without a cause: the text the
/// variant showed when it carried the cause only as a string.
fn with_cause(message: &str, source: &Option<Cause>) -> String {
    match source {
        Some(cause) if message.is_empty() => cause.to_string(),
        Some(cause) => format!("{message}: {cause}"),
        None => message.to_owned(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// What a backend or the domain layer reported (bad input, the cloud's answer, a bad key).
    #[error(transparent)]
    Provider(#[from] ProviderError),

    /// No cloud is served: the configuration names none (`CLOUD_PROVIDER` unset outside
    /// development mode) or was refused. `reason` is the stable reason of the cause
    /// (`ProviderNotConfigured`, `InvalidConfig`, ...), `why` says what to fix.
    #[error("provider-service serves no cloud: {why}")]
    NotServing { reason: ErrorReason, why: String },

    /// The caller presented no valid token.
    #[error("unauthenticated: {message}")]
    Unauthenticated { message: String },

    /// The caller's token cannot be checked now (the Kubernetes API does not answer).
    #[error(
        "cannot verify the caller's token now: {}",
        with_cause(message, source)
    )]
    AuthUnavailable {
        message: String,
        #[source]
        source: Option<Cause>,
    },

    /// The caller is authenticated but not in the allow-list.
    #[error("caller {caller} is not allowed")]
    CallerNotAllowed { caller: String },

    /// The caller is allowed, but not to call this method.
    #[error("caller {caller} is not allowed to call {method}")]
    MethodNotAllowed {
        caller: String,
        method: &'static str,
    },

    /// A path under this service that names none of its methods: refused before any token is reviewed, so a
    /// method added to the service is served only once the method table (and so every grant) knows it.
    #[error("{path:?} is not a method of this service")]
    UnknownMethod { path: String },

    /// The caller's grant binds it to its node (`@node`), but its token is bound to no node: a plain
    /// ServiceAccount token instead of the projected one of a Pod (or a Node).
    #[error(
        "caller {caller} must present a token bound to its node (its Pod's projected token); this one names no node"
    )]
    NodeNotBound { caller: String },

    /// A node-bound caller asked to delete an instance that is not its node's: `why` says which PeerPod
    /// names it and where that PeerPod's Pod runs.
    #[error("caller {caller} on node {node} may not delete instance {instance_id}: {why}")]
    NotOnCallersNode {
        caller: String,
        node: String,
        instance_id: String,
        why: String,
    },

    /// Which node an instance belongs to cannot be looked up now (the Kubernetes API does not answer):
    /// a node-bound caller's delete is refused until it can.
    #[error(
        "cannot tell now which node instance {instance_id} belongs to: {}",
        with_cause(message, source)
    )]
    PlacementUnavailable {
        instance_id: String,
        message: String,
        #[source]
        source: Option<Cause>,
    },

    /// The gRPC port's certificate or key cannot be loaded.
    #[error("tls: {}", with_cause(message, source))]
    Tls {
        message: String,
        #[source]
        source: Option<Cause>,
    },

    /// The server itself failed (its task, its listener's address, gRPC reflection, the gRPC server):
    /// this service's fault, reported as a provider's [`ProviderError::Internal`] is.
    #[error("internal: {context}: {source}")]
    Internal {
        context: String,
        #[source]
        source: Cause,
    },

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

    /// The cloud does not show the instance, for less than its consistency window: possibly a new
    /// instance it does not show everywhere yet. A wait, not an outage, answered so to a caller
    /// that did not say it understands DELETE_RESULT_IN_PROGRESS.
    #[error(
        "the cloud does not show instance {instance_id} yet ({} s of its {} s consistency window, \
         {setting}); ask again in {} s",
        unknown_for.as_secs(),
        window.as_secs(),
        retry_after.as_secs().max(1)
    )]
    NotYetVisible {
        instance_id: String,
        unknown_for: std::time::Duration,
        window: std::time::Duration,
        setting: &'static str,
        retry_after: std::time::Duration,
    },

    /// A new delete past a cap of the deletes running (see [`crate::deletes::DeleteCaps`]): `by`
    /// (a caller, or all callers) runs `running`, the most `setting` allows.
    #[error(
        "{by} run {running} deletes already, the most {setting} allows ({limit}); ask again in {} s",
        retry_after.as_secs().max(1)
    )]
    TooManyDeletes {
        by: String,
        running: usize,
        limit: usize,
        setting: &'static str,
        retry_after: std::time::Duration,
    },
}

impl peerpods_runtime::service::StopReason for Error {
    fn reason(&self) -> &'static str {
        Error::reason(self)
    }
}

impl Error {
    /// Stable, low-cardinality name of the variant, for metric labels and logs.
    pub fn reason(&self) -> &'static str {
        self.error_reason().as_str()
    }

    /// The reason sent in this error's `ErrorInfo` (provider.proto).
    pub fn error_reason(&self) -> ErrorReason {
        match self {
            Error::Provider(e) => e.error_reason(),
            Error::NotServing { reason, .. } => *reason,
            Error::Unauthenticated { .. } => ErrorReason::Unauthenticated,
            Error::AuthUnavailable { .. } => ErrorReason::AuthUnavailable,
            Error::CallerNotAllowed { .. } => ErrorReason::CallerNotAllowed,
            Error::MethodNotAllowed { .. } => ErrorReason::MethodNotAllowed,
            Error::UnknownMethod { .. } => ErrorReason::UnknownMethod,
            Error::NodeNotBound { .. } => ErrorReason::NodeNotBound,
            Error::NotOnCallersNode { .. } => ErrorReason::NotOnCallersNode,
            Error::PlacementUnavailable { .. } => ErrorReason::PlacementUnavailable,
            Error::Tls { .. } => ErrorReason::Tls,
            Error::Internal { .. } => ErrorReason::Internal,
            Error::ShuttingDown => ErrorReason::ShuttingDown,
            Error::DeleteInProgress { .. } => ErrorReason::DeleteInProgress,
            Error::NotYetVisible { .. } => ErrorReason::NotYetVisible,
            Error::TooManyDeletes { .. } => ErrorReason::TooManyDeletes,
        }
    }

    /// Whether this only says to wait: the delete goes on, or the cloud does not show the instance
    /// yet. Nothing failed (logged at debug level, not as a warning).
    pub fn is_wait(&self) -> bool {
        matches!(
            self,
            Error::DeleteInProgress { .. } | Error::NotYetVisible { .. }
        )
    }

    /// Whether this is the service's own fault (logged as an error, not a warning).
    pub fn is_internal(&self) -> bool {
        matches!(
            self,
            Error::Tls { .. }
                | Error::Internal { .. }
                | Error::Provider(ProviderError::Internal { .. } | ProviderError::Io { .. })
        )
    }

    /// Shorthand for a [`ProviderError::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        Error::Provider(ProviderError::internal(message))
    }

    /// An [`Error::Internal`]: `context` says what failed, `source` why.
    pub fn internal_from(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Internal {
            context: context.into(),
            source: Arc::new(source),
        }
    }

    /// An [`Error::Tls`] for `source`; `message` says which part (empty: the cause says it all).
    pub fn tls(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Tls {
            message: message.into(),
            source: Some(Arc::new(source)),
        }
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
        Error::AuthUnavailable { .. } | Error::PlacementUnavailable { .. } => Code::Unavailable,
        Error::CallerNotAllowed { .. }
        | Error::MethodNotAllowed { .. }
        | Error::UnknownMethod { .. }
        | Error::NodeNotBound { .. }
        | Error::NotOnCallersNode { .. } => Code::PermissionDenied,
        Error::Unauthenticated { .. } => Code::Unauthenticated,
        Error::Tls { .. } | Error::Internal { .. } => Code::Internal,
        Error::ShuttingDown | Error::DeleteInProgress { .. } | Error::NotYetVisible { .. } => {
            Code::Unavailable
        }
        Error::TooManyDeletes { .. } => Code::ResourceExhausted,
    };
    let mut details = ErrorDetails::with_error_info(e.reason(), ERROR_DOMAIN, HashMap::new());
    if let Error::Provider(ProviderError::Throttled { retry_after, .. })
    | Error::DeleteInProgress { retry_after, .. }
    | Error::NotYetVisible { retry_after, .. }
    | Error::TooManyDeletes { retry_after, .. } = e
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_wrapped_error_is_the_source_and_the_text_is_unchanged() {
        let cause = || std::io::Error::other("bad PEM");
        let tls = Error::tls("key file", cause());
        assert_eq!(tls.to_string(), "tls: key file: bad PEM");
        assert_eq!(
            tls.source().map(ToString::to_string).as_deref(),
            Some("bad PEM")
        );
        let whole = Error::tls("", cause());
        assert_eq!(whole.to_string(), "tls: bad PEM");
        let alone = Error::Tls {
            message: "certificate file holds no certificate".into(),
            source: None,
        };
        assert_eq!(
            alone.to_string(),
            "tls: certificate file holds no certificate"
        );
        assert!(alone.source().is_none());

        let internal = Error::internal_from("gRPC server", cause());
        assert_eq!(internal.to_string(), "internal: gRPC server: bad PEM");
        assert_eq!(internal.reason(), "Internal");
        assert!(internal.is_internal());
        assert_eq!(status(&internal).code(), Code::Internal);
        assert!(internal.source().is_some());

        let review = Error::AuthUnavailable {
            message: "TokenReview failed".into(),
            source: Some(Arc::new(cause())),
        };
        assert_eq!(
            review.to_string(),
            "cannot verify the caller's token now: TokenReview failed: bad PEM"
        );
        assert!(review.source().is_some());
    }

    /// An error of this service that answers with `reason` (provider.proto), and the status code the
    /// protocol pairs the reason with. An exhaustive match: a new reason must say who sends it.
    fn sent_with(reason: ErrorReason) -> Option<(Error, Code)> {
        use ErrorReason as R;
        let secs = std::time::Duration::from_secs;
        let caller = || "system:serviceaccount:x:y".to_owned();
        let (error, code) = match reason {
            R::DoNotDelete => (
                ProviderError::DoNotDelete {
                    instance_id: "i-1".into(),
                    tag: peerpods_provider_core::DO_NOT_DELETE_TAG,
                    value: "true".into(),
                }
                .into(),
                Code::FailedPrecondition,
            ),
            R::NotOwnedByCluster => (
                ProviderError::NotOwnedByCluster {
                    message: "no cluster tag".into(),
                }
                .into(),
                Code::FailedPrecondition,
            ),
            R::ProviderNotConfigured => (
                ProviderError::ProviderNotConfigured { name: "aws".into() }.into(),
                Code::FailedPrecondition,
            ),
            R::CloudUnauthenticated => (
                ProviderError::cloud_unauthenticated("HTTP 401").into(),
                Code::FailedPrecondition,
            ),
            R::CloudPermissionDenied => (
                ProviderError::cloud_permission_denied("HTTP 403").into(),
                Code::PermissionDenied,
            ),
            R::CloudUnavailable => (
                ProviderError::unavailable("HTTP 503").into(),
                Code::Unavailable,
            ),
            R::Throttled => (
                ProviderError::throttled(secs(1), "RequestLimitExceeded").into(),
                Code::ResourceExhausted,
            ),
            R::InvalidArgument => (
                ProviderError::invalid("instance_id", "empty").into(),
                Code::InvalidArgument,
            ),
            R::UnknownProvider => (
                ProviderError::UnknownProvider {
                    name: "nimbus".into(),
                }
                .into(),
                Code::InvalidArgument,
            ),
            R::InvalidConfig => (
                ProviderError::config("AWS_REGION", "empty").into(),
                Code::FailedPrecondition,
            ),
            R::Unauthenticated => (
                Error::Unauthenticated {
                    message: "no token".into(),
                },
                Code::Unauthenticated,
            ),
            R::AuthUnavailable => (
                Error::AuthUnavailable {
                    message: "TokenReview failed".into(),
                    source: None,
                },
                Code::Unavailable,
            ),
            R::CallerNotAllowed => (
                Error::CallerNotAllowed { caller: caller() },
                Code::PermissionDenied,
            ),
            R::MethodNotAllowed => (
                Error::MethodNotAllowed {
                    caller: caller(),
                    method: "DeleteInstance",
                },
                Code::PermissionDenied,
            ),
            R::UnknownMethod => (
                Error::UnknownMethod { path: "/x".into() },
                Code::PermissionDenied,
            ),
            R::NodeNotBound => (
                Error::NodeNotBound { caller: caller() },
                Code::PermissionDenied,
            ),
            R::NotOnCallersNode => (
                Error::NotOnCallersNode {
                    caller: caller(),
                    node: "n".into(),
                    instance_id: "i-1".into(),
                    why: "it runs elsewhere".into(),
                },
                Code::PermissionDenied,
            ),
            R::PlacementUnavailable => (
                Error::PlacementUnavailable {
                    instance_id: "i-1".into(),
                    message: "no answer".into(),
                    source: None,
                },
                Code::Unavailable,
            ),
            R::DeleteInProgress => (
                Error::DeleteInProgress {
                    instance_id: "i-1".into(),
                    retry_after: secs(5),
                },
                Code::Unavailable,
            ),
            R::NotYetVisible => (
                Error::NotYetVisible {
                    instance_id: "i-1".into(),
                    unknown_for: secs(1),
                    window: secs(60),
                    setting: "X",
                    retry_after: secs(5),
                },
                Code::Unavailable,
            ),
            R::TooManyDeletes => (
                Error::TooManyDeletes {
                    by: "all callers".into(),
                    running: 1,
                    limit: 1,
                    setting: "X",
                    retry_after: secs(5),
                },
                Code::ResourceExhausted,
            ),
            R::ShuttingDown => (Error::ShuttingDown, Code::Unavailable),
            R::Tls => (
                Error::Tls {
                    message: "bad PEM".into(),
                    source: None,
                },
                Code::Internal,
            ),
            R::Io => (
                ProviderError::Io {
                    context: "reading".into(),
                    source: std::io::Error::other("x"),
                }
                .into(),
                Code::Internal,
            ),
            R::Internal => (Error::internal("x"), Code::Internal),
            // Sent by the server's layers around the service, not by an Error (server.rs, load.rs); their
            // tests check them.
            R::Overloaded
            | R::MethodNotFound
            | R::MalformedRequest
            | R::MessageTooLarge
            | R::Timeout => return None,
        };
        Some((error, code))
    }

    #[test]
    fn every_reason_an_error_sends_is_spelled_by_the_protocol_with_its_code() {
        for reason in ErrorReason::ALL {
            let Some((error, code)) = sent_with(reason) else {
                continue;
            };
            assert_eq!(error.error_reason(), reason);
            let s = status(&error);
            assert_eq!(s.code(), code, "{reason}");
            assert_eq!(
                s.get_details_error_info()
                    .and_then(|i| ErrorReason::parse(&i.reason)),
                Some(reason)
            );
        }
    }
}
