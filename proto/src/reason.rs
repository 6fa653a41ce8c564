//! The `google.rpc.ErrorInfo.reason` values provider-service answers with (provider.proto) that a
//! client acts on. They travel as strings; both sides spell them through [`ErrorReason`], so a
//! renamed reason is a compile error on the reader's side rather than a silent fallback.

use std::fmt;

/// A reason provider-service names in its `ErrorInfo`. [`ErrorReason::Unknown`] keeps any other
/// string as it came: a reader treats it by the status code alone, as before it knew the reason.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
    /// Any other reason, as it was sent.
    Unknown(String),
}

impl ErrorReason {
    /// Every reason with a name of its own (all but [`ErrorReason::Unknown`]).
    pub const KNOWN: [ErrorReason; 7] = [
        ErrorReason::DoNotDelete,
        ErrorReason::NotOwnedByCluster,
        ErrorReason::ProviderNotConfigured,
        ErrorReason::CloudUnauthenticated,
        ErrorReason::CloudPermissionDenied,
        ErrorReason::CloudUnavailable,
        ErrorReason::Throttled,
    ];

    /// The string on the wire.
    pub fn as_str(&self) -> &str {
        match self {
            ErrorReason::Unknown(other) => other,
            known => known.known().unwrap_or_default(),
        }
    }

    /// The wire string of a reason with a name of its own; `None` for [`ErrorReason::Unknown`].
    pub fn known(&self) -> Option<&'static str> {
        Some(match self {
            ErrorReason::DoNotDelete => "DoNotDelete",
            ErrorReason::NotOwnedByCluster => "NotOwnedByCluster",
            ErrorReason::ProviderNotConfigured => "ProviderNotConfigured",
            ErrorReason::CloudUnauthenticated => "CloudUnauthenticated",
            ErrorReason::CloudPermissionDenied => "CloudPermissionDenied",
            ErrorReason::CloudUnavailable => "CloudUnavailable",
            ErrorReason::Throttled => "Throttled",
            ErrorReason::Unknown(_) => return None,
        })
    }

    /// The reason a wire string names; [`ErrorReason::Unknown`] for any other.
    pub fn parse(reason: &str) -> ErrorReason {
        ErrorReason::KNOWN
            .into_iter()
            .find(|known| known.as_str() == reason)
            .unwrap_or_else(|| ErrorReason::Unknown(reason.to_owned()))
    }
}

impl fmt::Display for ErrorReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_reason_keeps_its_wire_string_and_reads_back() {
        let wire: Vec<&str> = ErrorReason::KNOWN.iter().map(ErrorReason::as_str).collect();
        // The strings are the protocol (provider.proto): a change here breaks every deployed reader.
        assert_eq!(
            wire,
            [
                "DoNotDelete",
                "NotOwnedByCluster",
                "ProviderNotConfigured",
                "CloudUnauthenticated",
                "CloudPermissionDenied",
                "CloudUnavailable",
                "Throttled",
            ]
        );
        for known in ErrorReason::KNOWN {
            assert_eq!(ErrorReason::parse(known.as_str()), known);
            assert_eq!(known.known(), Some(known.as_str()));
            assert_eq!(known.to_string(), known.as_str());
        }
    }

    #[test]
    fn an_unknown_reason_is_kept_as_sent() {
        for other in ["Overloaded", "doNotDelete", ""] {
            let reason = ErrorReason::parse(other);
            assert_eq!(reason, ErrorReason::Unknown(other.to_owned()));
            assert_eq!(reason.as_str(), other);
            assert_eq!(reason.known(), None);
        }
    }
}
