//! The `google.rpc.ErrorInfo.reason` values provider-service answers with (provider.proto): every
//! reason it sends, its own and its framework's. They travel as strings; both sides spell them
//! through [`ErrorReason`], so a renamed or new reason is a compile error where a sender or a reader
//! matches on it, rather than a silent fallback.

use std::fmt;

/// A reason provider-service names in its `ErrorInfo`. A string that is none of these (another
/// version's) parses to `None`: a reader treats it by the status code alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorReason {
    /// The VM carries the do-not-delete mark ([`crate::DO_NOT_DELETE`]); `FAILED_PRECONDITION`.
    DoNotDelete,
    /// The VM lacks this cluster's tag; `FAILED_PRECONDITION`.
    NotOwnedByCluster,
    /// provider-service has no configuration for the asked cloud; `FAILED_PRECONDITION`.
    ProviderNotConfigured,
    /// The cloud refused provider-service's credentials; `FAILED_PRECONDITION`.
    CloudUnauthenticated,
    /// The cloud refused provider-service's credentials a permission; `PERMISSION_DENIED`.
    CloudPermissionDenied,
    /// The cloud behind provider-service is down; `UNAVAILABLE`.
    CloudUnavailable,
    /// The cloud asked provider-service to slow down; `RESOURCE_EXHAUSTED`.
    Throttled,
    /// A request field is missing or malformed; `INVALID_ARGUMENT`.
    InvalidArgument,
    /// The asked cloud is not one provider-service knows; `INVALID_ARGUMENT`.
    UnknownProvider,
    /// provider-service's configuration of the cloud is unusable; `FAILED_PRECONDITION`.
    InvalidConfig,
    /// The caller presented no valid token; `UNAUTHENTICATED`.
    Unauthenticated,
    /// The caller's token cannot be checked now; `UNAVAILABLE`.
    AuthUnavailable,
    /// The caller's identity may not call provider-service; `PERMISSION_DENIED`.
    CallerNotAllowed,
    /// The caller's identity may not call this method; `PERMISSION_DENIED`.
    MethodNotAllowed,
    /// A method provider-service does not serve to anyone; `PERMISSION_DENIED`.
    UnknownMethod,
    /// The caller's token is not bound to a node; `PERMISSION_DENIED`.
    NodeNotBound,
    /// The instance is not on the calling node; `PERMISSION_DENIED`.
    NotOnCallersNode,
    /// Where instances run cannot be read now; `UNAVAILABLE`.
    PlacementUnavailable,
    /// The delete goes on; ask again after the retry advice; `UNAVAILABLE`.
    DeleteInProgress,
    /// The cloud does not show the instance yet; ask again after the retry advice; `UNAVAILABLE`.
    NotYetVisible,
    /// Too many deletes are running; ask again after the retry advice; `RESOURCE_EXHAUSTED`.
    TooManyDeletes,
    /// provider-service is shutting down; `UNAVAILABLE`.
    ShuttingDown,
    /// provider-service is at its load limit; `RESOURCE_EXHAUSTED`.
    Overloaded,
    /// No such method (tonic's own answer); `UNIMPLEMENTED`.
    MethodNotFound,
    /// Bytes that are not the method's request message; `INVALID_ARGUMENT` or `INTERNAL`.
    MalformedRequest,
    /// A request larger than provider-service takes; `OUT_OF_RANGE`.
    MessageTooLarge,
    /// The call's deadline passed or it was cancelled.
    Timeout,
    /// A TLS setup failure on provider-service's side; `INTERNAL`.
    Tls,
    /// An I/O failure on provider-service's side; `INTERNAL`.
    Io,
    /// Anything else that went wrong on provider-service's side; `INTERNAL`.
    Internal,
}

impl ErrorReason {
    /// Every reason.
    pub const ALL: [ErrorReason; 30] = [
        ErrorReason::DoNotDelete,
        ErrorReason::NotOwnedByCluster,
        ErrorReason::ProviderNotConfigured,
        ErrorReason::CloudUnauthenticated,
        ErrorReason::CloudPermissionDenied,
        ErrorReason::CloudUnavailable,
        ErrorReason::Throttled,
        ErrorReason::InvalidArgument,
        ErrorReason::UnknownProvider,
        ErrorReason::InvalidConfig,
        ErrorReason::Unauthenticated,
        ErrorReason::AuthUnavailable,
        ErrorReason::CallerNotAllowed,
        ErrorReason::MethodNotAllowed,
        ErrorReason::UnknownMethod,
        ErrorReason::NodeNotBound,
        ErrorReason::NotOnCallersNode,
        ErrorReason::PlacementUnavailable,
        ErrorReason::DeleteInProgress,
        ErrorReason::NotYetVisible,
        ErrorReason::TooManyDeletes,
        ErrorReason::ShuttingDown,
        ErrorReason::Overloaded,
        ErrorReason::MethodNotFound,
        ErrorReason::MalformedRequest,
        ErrorReason::MessageTooLarge,
        ErrorReason::Timeout,
        ErrorReason::Tls,
        ErrorReason::Io,
        ErrorReason::Internal,
    ];

    /// The string on the wire (and in provider-service's metric labels and logs).
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorReason::DoNotDelete => "DoNotDelete",
            ErrorReason::NotOwnedByCluster => "NotOwnedByCluster",
            ErrorReason::ProviderNotConfigured => "ProviderNotConfigured",
            ErrorReason::CloudUnauthenticated => "CloudUnauthenticated",
            ErrorReason::CloudPermissionDenied => "CloudPermissionDenied",
            ErrorReason::CloudUnavailable => "CloudUnavailable",
            ErrorReason::Throttled => "Throttled",
            ErrorReason::InvalidArgument => "InvalidArgument",
            ErrorReason::UnknownProvider => "UnknownProvider",
            ErrorReason::InvalidConfig => "InvalidConfig",
            ErrorReason::Unauthenticated => "Unauthenticated",
            ErrorReason::AuthUnavailable => "AuthUnavailable",
            ErrorReason::CallerNotAllowed => "CallerNotAllowed",
            ErrorReason::MethodNotAllowed => "MethodNotAllowed",
            ErrorReason::UnknownMethod => "UnknownMethod",
            ErrorReason::NodeNotBound => "NodeNotBound",
            ErrorReason::NotOnCallersNode => "NotOnCallersNode",
            ErrorReason::PlacementUnavailable => "PlacementUnavailable",
            ErrorReason::DeleteInProgress => "DeleteInProgress",
            ErrorReason::NotYetVisible => "NotYetVisible",
            ErrorReason::TooManyDeletes => "TooManyDeletes",
            ErrorReason::ShuttingDown => "ShuttingDown",
            ErrorReason::Overloaded => "Overloaded",
            ErrorReason::MethodNotFound => "MethodNotFound",
            ErrorReason::MalformedRequest => "MalformedRequest",
            ErrorReason::MessageTooLarge => "MessageTooLarge",
            ErrorReason::Timeout => "Timeout",
            ErrorReason::Tls => "Tls",
            ErrorReason::Io => "Io",
            ErrorReason::Internal => "Internal",
        }
    }

    /// The reason a wire string names; `None` for a string that is none of them.
    pub fn parse(reason: &str) -> Option<ErrorReason> {
        ErrorReason::ALL
            .into_iter()
            .find(|known| known.as_str() == reason)
    }
}

impl fmt::Display for ErrorReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a controller asks provider-service to delete a VM: the `reason` of the request's `Requester`.
/// provider-service only logs it (with the requester's object), so an operator reading its log sees why
/// each VM went; other callers (cloud-api-adaptor) send reasons of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequesterReason {
    /// The PeerPod that names the VM is being deleted and still carries the finalizer.
    PeerPodDeleted,
    /// No PeerPod names the VM (an orphan), and the orphan policy deletes it.
    OrphanInstance,
}

impl RequesterReason {
    /// Every reason.
    pub const ALL: [RequesterReason; 2] = [
        RequesterReason::PeerPodDeleted,
        RequesterReason::OrphanInstance,
    ];

    /// The string on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            RequesterReason::PeerPodDeleted => "PeerPodDeleted",
            RequesterReason::OrphanInstance => "OrphanInstance",
        }
    }
}

impl fmt::Display for RequesterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reasons_clients_act_on_keep_their_wire_strings() {
        // The strings are the protocol (provider.proto): a change here breaks every deployed reader.
        for (reason, wire) in [
            (ErrorReason::DoNotDelete, "DoNotDelete"),
            (ErrorReason::NotOwnedByCluster, "NotOwnedByCluster"),
            (ErrorReason::ProviderNotConfigured, "ProviderNotConfigured"),
            (ErrorReason::CloudUnauthenticated, "CloudUnauthenticated"),
            (ErrorReason::CloudPermissionDenied, "CloudPermissionDenied"),
            (ErrorReason::CloudUnavailable, "CloudUnavailable"),
            (ErrorReason::Throttled, "Throttled"),
            (ErrorReason::Overloaded, "Overloaded"),
        ] {
            assert_eq!(reason.as_str(), wire);
        }
    }

    #[test]
    fn every_reason_reads_back_and_no_two_share_a_string() {
        let mut seen = std::collections::BTreeSet::new();
        for reason in ErrorReason::ALL {
            assert_eq!(ErrorReason::parse(reason.as_str()), Some(reason));
            assert_eq!(reason.to_string(), reason.as_str());
            assert!(seen.insert(reason.as_str()), "{reason} twice");
        }
    }

    #[test]
    fn an_unknown_reason_reads_as_none() {
        for other in ["Overload", "doNotDelete", ""] {
            assert_eq!(ErrorReason::parse(other), None);
        }
    }

    #[test]
    fn requester_reasons_are_spelled_as_provider_service_logs_them() {
        assert_eq!(RequesterReason::PeerPodDeleted.as_str(), "PeerPodDeleted");
        assert_eq!(
            RequesterReason::OrphanInstance.to_string(),
            "OrphanInstance"
        );
        let distinct: std::collections::BTreeSet<_> =
            RequesterReason::ALL.map(RequesterReason::as_str).into();
        assert_eq!(distinct.len(), RequesterReason::ALL.len());
    }
}
