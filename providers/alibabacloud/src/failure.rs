//! What an error answer of an Alibaba Cloud RPC API means for the caller (pure), decided from
//! the error `Code` of the body first and the HTTP status second: ECS answers
//! `IncorrectInstanceStatus` with 403, which is not a permission problem, and refuses a wrong
//! signature with 400 (`SignatureDoesNotMatch`), which is a credential problem.

use std::time::Duration;

use peerpods_provider_core::{DEFAULT_RETRY_AFTER, Error, http::status_error};
use reqwest::StatusCode;

/// A failed call, classified.
#[derive(Debug)]
pub enum Failure {
    /// `InvalidInstanceId.NotFound`, `InvalidAllocationId.NotFound`, ...: the resource is gone.
    NotFound { code: String },
    /// `IncorrectInstanceStatus`, `IncorrectEipStatus`, ..., and the "busy" codes
    /// ([`BUSY_CODES`]): try again once the state settles.
    WrongState { code: String },
    /// Anything else, as the caller will see it.
    Error(Error),
}

impl Failure {
    /// The caller's error, for failures the flow does not handle itself.
    pub fn into_error(self, operation: &str) -> Error {
        match self {
            Failure::Error(error) => error,
            Failure::NotFound { code } => Error::internal(format!("{operation}: {code}")),
            // Transient by ECS's own account: the caller is told to come back, not that the
            // request was wrong.
            Failure::WrongState { code } => Error::unavailable(format!(
                "{operation}: {code}: the resource is busy with another operation, try again"
            )),
        }
    }

    /// Whether another attempt may succeed at once (server errors, timeouts, no answer).
    pub fn is_transient(&self) -> bool {
        matches!(self, Failure::Error(Error::Unavailable { .. }))
    }
}

/// The codes of "another request holds the resource, try again later" in the ECS and VPC error
/// references: `OperationConflict` ("Request was denied due to conflict with a previous
/// request"), `LastTokenProcessing` (a request with the same `ClientToken` is still being
/// processed) and `Operation.Conflict`. Read, like `Incorrect*Status` and VPC's
/// `IncorrectStatus.*`, as a state that settles.
pub const BUSY_CODES: [&str; 3] = [
    "OperationConflict",
    "LastTokenProcessing",
    "Operation.Conflict",
];

/// Codes that mean the service's own credentials are wrong, inactive or expired.
const UNAUTHENTICATED: [&str; 9] = [
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "InvalidAccessKeyId",
    "InvalidAccessKeyId.NotFound",
    "InvalidAccessKeyId.Inactive",
    "InvalidSecurityToken.Expired",
    "InvalidSecurityToken.Malformed",
    "InvalidSecurityToken.MismatchWithAccessKey",
    // A temporary (STS) key sent without its token.
    "MissingSecurityToken",
];

/// Classifies an error answer. `message` is the cloud's text, already redacted.
pub fn classify(
    status: StatusCode,
    code: Option<&str>,
    message: &str,
    retry_after: Option<Duration>,
    operation: &str,
) -> Failure {
    let Some(code) = code.filter(|c| !c.is_empty()) else {
        return Failure::Error(status_error(status, retry_after, operation, message));
    };
    let text = format!("{operation}: HTTP {}: {code}: {message}", status.as_u16());
    if code.starts_with("Throttling") || status == StatusCode::TOO_MANY_REQUESTS {
        return Failure::Error(Error::throttled(
            retry_after.unwrap_or(DEFAULT_RETRY_AFTER),
            text,
        ));
    }
    if UNAUTHENTICATED.contains(&code) {
        return Failure::Error(Error::cloud_unauthenticated(text));
    }
    if code == "Forbidden" || code.starts_with("Forbidden.") || code == "NoPermission" {
        return Failure::Error(Error::cloud_permission_denied(text));
    }
    if code.ends_with(".NotFound") {
        return Failure::NotFound {
            code: code.to_owned(),
        };
    }
    if (code.starts_with("Incorrect") && code.ends_with("Status"))
        || code.starts_with("IncorrectStatus.")
        || BUSY_CODES.contains(&code)
    {
        return Failure::WrongState {
            code: code.to_owned(),
        };
    }
    if matches!(
        code,
        "ServiceUnavailable" | "InternalError" | "UnknownError"
    ) {
        return Failure::Error(Error::unavailable(text));
    }
    Failure::Error(status_error(
        status,
        retry_after,
        operation,
        &format!("{code}: {message}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(status: u16, code: &str) -> &'static str {
        match classify(
            StatusCode::from_u16(status).expect("status"),
            Some(code),
            "text",
            None,
            "op",
        ) {
            Failure::NotFound { .. } => "NotFound",
            Failure::WrongState { .. } => "WrongState",
            Failure::Error(e) => e.reason(),
        }
    }

    #[test]
    fn codes_decide_before_statuses() {
        assert_eq!(reason(404, "InvalidInstanceId.NotFound"), "NotFound");
        assert_eq!(reason(404, "InvalidAllocationId.NotFound"), "NotFound");
        assert_eq!(reason(403, "IncorrectInstanceStatus"), "WrongState");
        assert_eq!(reason(400, "IncorrectEipStatus"), "WrongState");
        assert_eq!(reason(403, "OperationConflict"), "WrongState");
        assert_eq!(reason(403, "LastTokenProcessing"), "WrongState");
        assert_eq!(reason(400, "IncorrectStatus.Eip"), "WrongState");
        assert_eq!(reason(400, "Throttling"), "Throttled");
        assert_eq!(reason(400, "SignatureDoesNotMatch"), "CloudUnauthenticated");
        assert_eq!(
            reason(404, "InvalidAccessKeyId.NotFound"),
            "CloudUnauthenticated"
        );
        assert_eq!(reason(403, "Forbidden.RAM"), "CloudPermissionDenied");
        assert_eq!(reason(400, "Throttling.User"), "Throttled");
        assert_eq!(reason(503, "ServiceUnavailable"), "CloudUnavailable");
        assert_eq!(reason(500, "SomethingNew"), "CloudUnavailable");
        assert_eq!(reason(400, "InvalidParameter"), "Internal");
    }

    #[test]
    fn throttling_keeps_the_clouds_wait() {
        let wait = Duration::from_secs(7);
        let failure = classify(StatusCode::TOO_MANY_REQUESTS, None, "", Some(wait), "op");
        assert!(
            matches!(failure, Failure::Error(Error::Throttled { retry_after, .. }) if retry_after == wait)
        );
        let failure = classify(StatusCode::BAD_REQUEST, Some("Throttling"), "", None, "op");
        assert!(
            matches!(failure, Failure::Error(Error::Throttled { retry_after, .. }) if retry_after == DEFAULT_RETRY_AFTER)
        );
    }

    #[test]
    fn a_busy_resource_the_flow_cannot_wait_for_is_retryable_for_the_caller() {
        let failure = classify(
            StatusCode::FORBIDDEN,
            Some("OperationConflict"),
            "Request was denied due to conflict with a previous request, please try again later.",
            None,
            "ReleaseEipAddress",
        );
        assert!(matches!(
            failure.into_error("ReleaseEipAddress"),
            Error::Unavailable { .. }
        ));
    }

    #[test]
    fn statuses_decide_without_a_code() {
        let failure = classify(StatusCode::UNAUTHORIZED, None, "", None, "op");
        assert!(matches!(
            failure,
            Failure::Error(Error::CloudUnauthenticated { .. })
        ));
        assert!(classify(StatusCode::BAD_GATEWAY, None, "", None, "op").is_transient());
    }
}
