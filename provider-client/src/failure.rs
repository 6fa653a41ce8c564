//! What an error answer of provider-service says, read once for both controllers: who failed (the caller's
//! request, provider-service, or the cloud behind it) and whether it can change by itself, from the status code
//! and the `google.rpc.ErrorInfo` reason as provider.proto's status contract names them. Pure: a status in, a
//! [`Failure`] out. A call the circuit breaker held back is a [`Held`] of its [`Scope`].

use std::time::Duration;

use peerpods_proto::{ErrorReason, ProviderName};
use tonic::Code;

/// Who failed, and how, when provider-service answered with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The VM carries the do-not-delete mark (FAILED_PRECONDITION, reason `DoNotDelete`): a deliberate hold.
    Protected,
    /// A refusal provider-service named with its status code: a configuration or a guard, which does not change
    /// by itself.
    Refused(Refusal),
    /// provider-service works; the cloud behind it failed, as its ErrorInfo names it.
    Cloud {
        failure: CloudFailure,
        retry_after: Option<Duration>,
    },
    /// The request is malformed (INVALID_ARGUMENT) or too large (OUT_OF_RANGE): the same request fails the same
    /// way every time.
    Rejected,
    /// provider-service cannot act in its current configuration (an unnamed FAILED_PRECONDITION).
    Precondition,
    /// provider-service sheds load (RESOURCE_EXHAUSTED without the cloud's reason).
    Throttled { retry_after: Option<Duration> },
    /// provider-service is not reachable or not ready: UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, and an
    /// UNKNOWN or INTERNAL made by this side's transport (without provider-service's ErrorInfo).
    Unavailable,
    /// provider-service refused the caller's credentials (UNAUTHENTICATED, or PERMISSION_DENIED not named as the
    /// cloud's).
    Unauthorized,
    /// Anything else, including an answer this client cannot read.
    Failed,
}

/// The refusals provider-service names that get a word of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The VM lacks this cluster's tag.
    NotOwnedByCluster,
    /// provider-service has no configuration for the asked cloud.
    ProviderNotConfigured,
    /// The cloud rejected provider-service's credentials.
    CloudUnauthenticated,
    /// The cloud refused provider-service's own credentials a permission: its policy needs fixing.
    CloudPermissionDenied,
}

/// How the cloud behind provider-service failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloudFailure {
    /// Unreachable, or answering 5xx.
    Unavailable,
    /// Throttling.
    Throttled,
}

impl Refusal {
    /// The refusal an ErrorInfo reason names, if it comes with the status code provider-service sends it with.
    pub fn read(code: Code, reason: ErrorReason) -> Option<Refusal> {
        use ErrorReason as R;
        let (refused_with, refusal) = match reason {
            R::NotOwnedByCluster => (Code::FailedPrecondition, Refusal::NotOwnedByCluster),
            R::ProviderNotConfigured => (Code::FailedPrecondition, Refusal::ProviderNotConfigured),
            R::CloudUnauthenticated => (Code::FailedPrecondition, Refusal::CloudUnauthenticated),
            R::CloudPermissionDenied => (Code::PermissionDenied, Refusal::CloudPermissionDenied),
            // A hold (read before any refusal), the cloud's failures, and what the status code alone says.
            R::DoNotDelete
            | R::CloudUnavailable
            | R::Throttled
            | R::InvalidArgument
            | R::UnknownProvider
            | R::InvalidConfig
            | R::Unauthenticated
            | R::AuthUnavailable
            | R::CallerNotAllowed
            | R::MethodNotAllowed
            | R::UnknownMethod
            | R::NodeNotBound
            | R::NotOnCallersNode
            | R::PlacementUnavailable
            | R::DeleteInProgress
            | R::NotYetVisible
            | R::TooManyDeletes
            | R::ShuttingDown
            | R::Overloaded
            | R::MethodNotFound
            | R::MalformedRequest
            | R::MessageTooLarge
            | R::Timeout
            | R::Tls
            | R::Io
            | R::Internal => return None,
        };
        (code == refused_with).then_some(refusal)
    }

    /// provider-service's word for it.
    pub fn reason(self) -> ErrorReason {
        match self {
            Refusal::NotOwnedByCluster => ErrorReason::NotOwnedByCluster,
            Refusal::ProviderNotConfigured => ErrorReason::ProviderNotConfigured,
            Refusal::CloudUnauthenticated => ErrorReason::CloudUnauthenticated,
            Refusal::CloudPermissionDenied => ErrorReason::CloudPermissionDenied,
        }
    }
}

impl Failure {
    /// Reads an error answer. `retry_after` is the answer's RetryInfo, kept where a wait makes sense.
    pub fn read(status: &tonic::Status) -> Failure {
        use tonic_types::StatusExt;
        let code = status.code();
        let info = status.get_error_details().error_info().cloned();
        let reason = info.as_ref().and_then(|i| ErrorReason::parse(&i.reason));
        let retry_after = || crate::retry_after(status);
        if reason == Some(ErrorReason::DoNotDelete) {
            return Failure::Protected;
        }
        // Only named refusals of a precondition or of the cloud's permission: a caller's PERMISSION_DENIED stays
        // Unauthorized, and INVALID_ARGUMENT stays Rejected.
        if let Some(refusal) = reason.and_then(|r| Refusal::read(code, r)) {
            return Failure::Refused(refusal);
        }
        match (code, reason) {
            (Code::Unavailable, Some(ErrorReason::CloudUnavailable)) => {
                return Failure::Cloud {
                    failure: CloudFailure::Unavailable,
                    retry_after: retry_after(),
                };
            }
            (Code::ResourceExhausted, Some(ErrorReason::Throttled)) => {
                return Failure::Cloud {
                    failure: CloudFailure::Throttled,
                    retry_after: retry_after(),
                };
            }
            _ => {}
        }
        match code {
            Code::InvalidArgument | Code::OutOfRange => Failure::Rejected,
            Code::FailedPrecondition => Failure::Precondition,
            Code::ResourceExhausted => Failure::Throttled {
                retry_after: retry_after(),
            },
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => Failure::Unavailable,
            Code::Unauthenticated | Code::PermissionDenied => Failure::Unauthorized,
            // provider-service puts an ErrorInfo on every error it answers (provider.proto), its framework's
            // included: an UNKNOWN or INTERNAL without one was made on this side of the connection, by the
            // transport (a connection cut mid-call, a broken HTTP/2 stream). provider-service is not reachable
            // then, it did not fail.
            Code::Unknown | Code::Internal if info.is_none() => Failure::Unavailable,
            _ => Failure::Failed,
        }
    }
}

/// A call to provider-service that did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// provider-service answered with an error, or could not be reached: what the answer says ([`Failure`]),
    /// its code and message as a person reads them, and the status itself (absent when the answer came but
    /// could not be read).
    #[error("{message}")]
    Failed {
        failure: Failure,
        /// `<code>: <message>` of the answer, or what was wrong with an answer that could not be read.
        message: String,
        /// The status as it came: one made on this side of the connection carries the transport's error under
        /// it.
        #[source]
        status: Option<tonic::Status>,
    },
    /// Not made: the circuit breaker holds calls back while provider-service or the cloud is down (see
    /// [`crate::breaker`]). Not a failure of what the call was for.
    #[error(transparent)]
    Held(#[from] Held),
}

impl From<tonic::Status> for CallError {
    fn from(status: tonic::Status) -> Self {
        CallError::Failed {
            failure: Failure::read(&status),
            message: format!("{:?}: {}", status.code(), status.message()),
            status: Some(status),
        }
    }
}

impl CallError {
    /// An answer that came but says nothing this client can act on: a failure of provider-service.
    pub fn unreadable(message: impl Into<String>) -> Self {
        CallError::Failed {
            failure: Failure::Failed,
            message: message.into(),
            status: None,
        }
    }

    /// What provider-service's answer said; `None` for a call the breaker held back.
    pub fn failure(&self) -> Option<Failure> {
        match self {
            CallError::Failed { failure, .. } => Some(*failure),
            CallError::Held(_) => None,
        }
    }
}

/// Who failed, in a few words (the cause of an open circuit breaker, in its logs and messages).
impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Failure::Protected => "the VM is protected",
            Failure::Refused(_) => "provider-service refused the call",
            Failure::Cloud {
                failure: CloudFailure::Unavailable,
                ..
            } => "the cloud is unavailable",
            Failure::Cloud {
                failure: CloudFailure::Throttled,
                ..
            } => "the cloud throttles",
            Failure::Rejected => "the request is malformed",
            Failure::Precondition => "provider-service cannot act in its configuration",
            Failure::Throttled { .. } => "provider-service sheds load",
            Failure::Unavailable => "provider-service unreachable",
            Failure::Unauthorized => "provider-service refused our credentials",
            Failure::Failed => "provider-service failed",
        })
    }
}

/// What the circuit breaker ([`crate::breaker`]) guards.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// provider-service itself.
    ProviderService,
    /// One cloud, by its provider name as the caller gave it.
    Cloud(String),
}

impl Scope {
    /// For logs and metric labels: a cloud by its canonical name, `other` for a name no cloud has (bounded).
    pub fn label(&self) -> String {
        match self {
            Scope::ProviderService => "provider-service".to_owned(),
            Scope::Cloud(name) => match name.parse::<ProviderName>() {
                Ok(known) => known.as_str().to_owned(),
                Err(_) => "other".to_owned(),
            },
        }
    }
}

/// A call held back: `scope` is open because of failures like `cause`; ask again in `retry_in`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} is down ({cause}); the call waits for the circuit breaker's probe", scope.label())]
pub struct Held {
    pub scope: Scope,
    pub cause: Failure,
    pub retry_in: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::ErrorDetails;

    fn with_info(code: Code, reason: &str, retry: Option<Duration>) -> tonic::Status {
        use tonic_types::StatusExt;
        let mut details = ErrorDetails::with_error_info(
            reason,
            "provider.peerpods.io",
            std::collections::HashMap::new(),
        );
        if retry.is_some() {
            details.set_retry_info(retry);
        }
        tonic::Status::with_error_details(code, "from provider-service", details)
    }

    #[test]
    fn a_named_refusal_is_read_only_with_its_code_and_keeps_provider_services_word() {
        let codes = [
            Code::FailedPrecondition,
            Code::PermissionDenied,
            Code::Unavailable,
            Code::ResourceExhausted,
            Code::InvalidArgument,
        ];
        let mut read = Vec::new();
        for reason in ErrorReason::ALL {
            for code in codes {
                if let Some(refusal) = Refusal::read(code, reason) {
                    assert_eq!(refusal.reason(), reason);
                    read.push((code, refusal));
                }
            }
        }
        assert_eq!(
            read,
            [
                (Code::FailedPrecondition, Refusal::NotOwnedByCluster),
                (Code::FailedPrecondition, Refusal::ProviderNotConfigured),
                (Code::FailedPrecondition, Refusal::CloudUnauthenticated),
                (Code::PermissionDenied, Refusal::CloudPermissionDenied),
            ]
        );
    }

    #[test]
    fn each_answer_says_who_failed() {
        let secs = |s| Some(Duration::from_secs(s));
        for (status, want) in [
            (
                with_info(Code::FailedPrecondition, "DoNotDelete", None),
                Failure::Protected,
            ),
            (
                with_info(Code::FailedPrecondition, "NotOwnedByCluster", None),
                Failure::Refused(Refusal::NotOwnedByCluster),
            ),
            (
                with_info(Code::PermissionDenied, "CloudPermissionDenied", None),
                Failure::Refused(Refusal::CloudPermissionDenied),
            ),
            // The caller refused: provider-service's word for this controller's credentials.
            (
                with_info(Code::PermissionDenied, "CallerNotAllowed", None),
                Failure::Unauthorized,
            ),
            (
                tonic::Status::unauthenticated("no token"),
                Failure::Unauthorized,
            ),
            (
                with_info(Code::Unavailable, "CloudUnavailable", secs(2)),
                Failure::Cloud {
                    failure: CloudFailure::Unavailable,
                    retry_after: secs(2),
                },
            ),
            (
                with_info(Code::ResourceExhausted, "Throttled", secs(3)),
                Failure::Cloud {
                    failure: CloudFailure::Throttled,
                    retry_after: secs(3),
                },
            ),
            // A cloud's reason with another code is read by its code.
            (
                with_info(Code::Internal, "CloudUnavailable", None),
                Failure::Failed,
            ),
            (
                with_info(Code::ResourceExhausted, "Overloaded", secs(7)),
                Failure::Throttled {
                    retry_after: secs(7),
                },
            ),
            (
                with_info(Code::Unavailable, "ShuttingDown", None),
                Failure::Unavailable,
            ),
            (
                tonic::Status::unavailable("tcp connect error"),
                Failure::Unavailable,
            ),
            (
                tonic::Status::deadline_exceeded("slow"),
                Failure::Unavailable,
            ),
            (tonic::Status::cancelled("gone"), Failure::Unavailable),
            // Made by this side's transport (no ErrorInfo): provider-service is not reachable.
            (
                tonic::Status::unknown("transport error: connection reset by peer"),
                Failure::Unavailable,
            ),
            (
                tonic::Status::internal("h2 protocol error"),
                Failure::Unavailable,
            ),
            // provider-service's own INTERNAL carries its ErrorInfo: it failed.
            (with_info(Code::Internal, "Internal", None), Failure::Failed),
            (
                with_info(Code::Unknown, "SomethingNew", None),
                Failure::Failed,
            ),
            (
                with_info(Code::InvalidArgument, "UnknownProvider", None),
                Failure::Rejected,
            ),
            (
                tonic::Status::out_of_range("instance_id: longer than 1024 bytes"),
                Failure::Rejected,
            ),
            (
                tonic::Status::failed_precondition("not configured"),
                Failure::Precondition,
            ),
            (
                with_info(Code::FailedPrecondition, "SomethingNew", None),
                Failure::Precondition,
            ),
            // NOT_FOUND is not in the delete contract; it must never be mistaken for "gone".
            (tonic::Status::not_found("x"), Failure::Failed),
        ] {
            assert_eq!(Failure::read(&status), want, "{status:?}");
        }
    }

    #[test]
    fn a_call_error_keeps_the_status_and_says_its_code() {
        use std::error::Error as _;
        let error = CallError::from(tonic::Status::unavailable("down"));
        assert_eq!(error.to_string(), "Unavailable: down");
        assert_eq!(error.failure(), Some(Failure::Unavailable));
        assert!(
            error
                .source()
                .and_then(|s| s.downcast_ref::<tonic::Status>())
                .is_some()
        );
        let unreadable = CallError::unreadable("DeleteInstance answered without a result");
        assert_eq!(unreadable.failure(), Some(Failure::Failed));
        assert!(unreadable.source().is_none());
    }
}
