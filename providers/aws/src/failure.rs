//! What a failed EC2 call means for the caller, decided from EC2's error code (pure).
//!
//! One batched call can fail for hundreds of callers at once, so a failure has to be cheap to
//! copy to each of them ([`Failure`] is `Clone`); it becomes the crate's error only at the
//! provider boundary, once per caller.

use std::sync::Arc;
use std::time::Duration;

use peerpods_provider_core::Error;

pub use peerpods_provider_core::Redactor;

/// How long a throttled caller is asked to wait. EC2 sends no Retry-After; its token buckets
/// refill within seconds, and the SDK has already retried with backoff before we give up.
pub const THROTTLE_RETRY_AFTER: Duration = Duration::from_secs(2);

/// The SDK's error behind a failure that got no answer, shared by every caller of the batch it
/// failed; it becomes the source of each caller's error. Two causes are equal when they are the
/// same error.
#[derive(Clone, Debug)]
pub struct Cause(pub Arc<dyn std::error::Error + Send + Sync>);

impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Cause {}

/// A failed EC2 call, classified. Texts are redacted (see [`Redactor`]) before they get here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// `InvalidInstanceID.NotFound`: EC2 does not know (some of) the ids; `message` names them.
    InstanceNotFound { message: String },
    /// `InvalidInstanceID.Malformed`: EC2 rejects the syntax of (some of) the ids.
    InstanceMalformed { message: String },
    /// Another `*.NotFound` code, e.g. an Elastic IP association that is already gone.
    ResourceNotFound { code: String, message: String },
    /// EC2 asks us to slow down.
    Throttled { retry_after: Duration },
    /// EC2 could not be reached or did not answer in time (`cause`: the SDK's error), or answered
    /// with a server error.
    Unavailable {
        detail: String,
        cause: Option<Cause>,
    },
    /// The credentials are missing, wrong, expired or lack the permission.
    PermissionDenied { code: String, message: String },
    /// EC2 refuses the operation for this instance or address: termination protection
    /// (`OperationNotPermitted`, until someone lifts it), or a state in transition
    /// (`IncorrectInstanceState`, an address still in use: [`is_transitional_state`], retryable
    /// once it settles).
    Refused { code: String, message: String },
    /// Anything else: a bug on our side (`cause`: the SDK's error, if it gave one) or an EC2
    /// answer we do not understand.
    Internal {
        detail: String,
        cause: Option<Cause>,
    },
}

impl Failure {
    /// The failure, with the SDK's `error` as the cause when it is one that keeps a cause (no
    /// answer, or an unexpected one); a classified answer of EC2 needs none.
    pub fn caused_by(self, error: impl std::error::Error + Send + Sync + 'static) -> Self {
        match self {
            Failure::Unavailable {
                detail,
                cause: None,
            } => Failure::Unavailable {
                detail,
                cause: Some(Cause(Arc::new(error))),
            },
            Failure::Internal {
                detail,
                cause: None,
            } => Failure::Internal {
                detail,
                cause: Some(Cause(Arc::new(error))),
            },
            other => other,
        }
    }
}

/// EC2's codes for "the instance is in an incorrect state for the requested operation" and "the
/// address is in use" (EC2 API reference, "Error codes"): the state moves on (a pending or
/// stopping instance, an address EC2 is still disassociating from a terminated instance), so the
/// call is worth repeating, unlike termination protection.
pub fn is_transitional_state(code: &str) -> bool {
    matches!(
        code,
        "IncorrectInstanceState" | "IncorrectState" | "InvalidIPAddress.InUse"
    )
}

/// Classifies an error answer of EC2 by its error code (and HTTP status when the code is unknown).
pub fn classify_service_error(code: Option<&str>, message: &str, http_status: u16) -> Failure {
    let message = message.to_owned();
    let Some(code) = code else {
        return by_status(http_status, format!("HTTP {http_status}: {message}"));
    };
    match code {
        "InvalidInstanceID.NotFound" => Failure::InstanceNotFound { message },
        "InvalidInstanceID.Malformed" => Failure::InstanceMalformed { message },
        "RequestLimitExceeded"
        | "Throttling"
        | "ThrottlingException"
        | "RequestThrottled"
        | "RequestThrottledException"
        | "TooManyRequestsException"
        | "PriorRequestNotComplete" => Failure::Throttled {
            retry_after: THROTTLE_RETRY_AFTER,
        },
        "AuthFailure"
        | "UnauthorizedOperation"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "ExpiredToken"
        | "RequestExpired"
        | "AccessDenied"
        | "AccessDeniedException"
        | "OptInRequired"
        | "PendingVerification"
        | "Blocked"
        | "MissingAuthenticationToken" => Failure::PermissionDenied {
            code: code.to_owned(),
            message,
        },
        "OperationNotPermitted"
        | "IncorrectInstanceState"
        | "IncorrectState"
        | "InvalidIPAddress.InUse" => Failure::Refused {
            code: code.to_owned(),
            message,
        },
        code if code.ends_with(".NotFound") => Failure::ResourceNotFound {
            code: code.to_owned(),
            message,
        },
        "Unavailable" | "ServiceUnavailable" | "InternalError" | "InternalFailure" => {
            Failure::Unavailable {
                detail: format!("{code}: {message}"),
                cause: None,
            }
        }
        _ => by_status(http_status, format!("{code}: {message}")),
    }
}

fn by_status(http_status: u16, detail: String) -> Failure {
    match http_status {
        429 => Failure::Throttled {
            retry_after: THROTTLE_RETRY_AFTER,
        },
        401 | 403 => Failure::PermissionDenied {
            code: format!("HTTP{http_status}"),
            message: detail,
        },
        500..=599 => Failure::Unavailable {
            detail,
            cause: None,
        },
        _ => Failure::Internal {
            detail,
            cause: None,
        },
    }
}

/// The ids an `InvalidInstanceID.NotFound` message names, e.g.
/// `The instance IDs 'i-1, i-2' do not exist` or `The instance ID 'i-1' does not exist`.
/// Returns nothing if the text has another shape: callers then ask per id.
pub fn ids_named_not_found(message: &str) -> Vec<String> {
    let (Some(start), Some(end)) = (message.find('\''), message.rfind('\'')) else {
        return Vec::new();
    };
    if end <= start {
        return Vec::new();
    }
    let quoted = &message[start + 1..end];
    let ids: Vec<String> = quoted
        .split(',')
        .map(str::trim)
        .map(str::to_owned)
        .collect();
    // Anything that is not an instance id means we misread the message: trust none of it.
    if ids.iter().all(|id| super::instance_id::is_valid(id)) {
        ids
    } else {
        Vec::new()
    }
}

/// The crate error for one caller. An id EC2 calls unknown (`InvalidInstanceID.NotFound`) does not
/// get here from a delete: the ports hand it to the deletion engine as NotFound, which judges it
/// by the consistency window (`NotYetVisible` until then). An `InstanceNotFound` that gets here
/// anyway is an answer we did not expect: internal.
pub fn into_error(failure: Failure) -> Error {
    match failure {
        Failure::InstanceMalformed { message } => Error::invalid("instance_id", message),
        Failure::Throttled { retry_after } => {
            Error::throttled(retry_after, "EC2 request limit exceeded")
        }
        Failure::Unavailable { detail, cause } => with_cause(Error::unavailable(detail), cause),
        Failure::PermissionDenied { code, message } => {
            Error::cloud_permission_denied(format!("{code}: {message}"))
        }
        // Id-specific (a batch splits per id on it), and for a state in transition retryable.
        Failure::Refused { code, message } if is_transitional_state(&code) => {
            Error::unavailable(format!(
                "EC2: the instance is in a state that does not allow it yet, try again: {code}: {message}"
            ))
        }
        Failure::Refused { code, message } => {
            Error::internal(format!("EC2 refused the operation: {code}: {message}"))
        }
        Failure::InstanceNotFound { message } => {
            Error::internal(format!("EC2 reported unknown instances: {message}"))
        }
        Failure::ResourceNotFound { code, message } => {
            Error::internal(format!("{code}: {message}"))
        }
        Failure::Internal { detail, cause } => with_cause(Error::internal(detail), cause),
    }
}

/// `error` caused by the SDK's error of the failure, if it had one.
fn with_cause(error: Error, cause: Option<Cause>) -> Error {
    match cause {
        Some(Cause(cause)) => error.with_source(cause),
        None => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_and_malformed_are_recognised() {
        assert_eq!(
            classify_service_error(Some("InvalidInstanceID.NotFound"), "gone", 400),
            Failure::InstanceNotFound {
                message: "gone".into()
            }
        );
        assert!(matches!(
            classify_service_error(Some("InvalidInstanceID.Malformed"), "bad", 400),
            Failure::InstanceMalformed { .. }
        ));
    }

    #[test]
    fn other_not_found_codes_are_resource_not_found() {
        assert!(matches!(
            classify_service_error(Some("InvalidAssociationID.NotFound"), "gone", 400),
            Failure::ResourceNotFound { .. }
        ));
    }

    #[test]
    fn throttling_codes_ask_to_retry_later() {
        for code in ["RequestLimitExceeded", "Throttling", "ThrottlingException"] {
            assert_eq!(
                classify_service_error(Some(code), "slow down", 503),
                Failure::Throttled {
                    retry_after: THROTTLE_RETRY_AFTER
                },
                "{code}"
            );
        }
        assert!(matches!(
            classify_service_error(None, "", 429),
            Failure::Throttled { .. }
        ));
    }

    #[test]
    fn auth_codes_are_permission_denied() {
        for code in [
            "AuthFailure",
            "UnauthorizedOperation",
            "InvalidClientTokenId",
            "SignatureDoesNotMatch",
        ] {
            assert!(
                matches!(
                    classify_service_error(Some(code), "no", 403),
                    Failure::PermissionDenied { .. }
                ),
                "{code}"
            );
        }
    }

    #[test]
    fn server_errors_are_unavailable_and_unknown_codes_internal() {
        assert!(matches!(
            classify_service_error(Some("InternalError"), "oops", 500),
            Failure::Unavailable { .. }
        ));
        assert!(matches!(
            classify_service_error(Some("SomethingNew"), "?", 502),
            Failure::Unavailable { .. }
        ));
        assert!(matches!(
            classify_service_error(Some("SomethingNew"), "?", 400),
            Failure::Internal { .. }
        ));
        assert!(matches!(
            classify_service_error(Some("OperationNotPermitted"), "protected", 400),
            Failure::Refused { .. }
        ));
        // Id-specific like termination protection, but a state that moves on.
        assert!(matches!(
            classify_service_error(Some("IncorrectInstanceState"), "pending", 400),
            Failure::Refused { ref code, .. } if is_transitional_state(code)
        ));
        assert!(!is_transitional_state("OperationNotPermitted"));
    }

    #[test]
    fn not_found_message_names_ids() {
        assert_eq!(
            ids_named_not_found("The instance IDs 'i-0123456789abcdef0, i-0123abcd' do not exist"),
            vec!["i-0123456789abcdef0", "i-0123abcd"]
        );
        assert_eq!(
            ids_named_not_found("The instance ID 'i-0123abcd' does not exist"),
            vec!["i-0123abcd"]
        );
    }

    #[test]
    fn unreadable_not_found_message_names_nothing() {
        assert!(ids_named_not_found("The instance does not exist").is_empty());
        assert!(ids_named_not_found("'").is_empty());
        assert!(
            ids_named_not_found("The instance IDs 'i-0123abcd, vol-1' do not exist").is_empty()
        );
    }

    #[test]
    fn redactor_hides_secrets_but_not_short_values() {
        let redactor = Redactor::new(["wJalrXUtnFEMI/K7MDENG", "ab"]);
        assert_eq!(
            redactor.redact("key wJalrXUtnFEMI/K7MDENG in about"),
            "key [redacted] in about"
        );
        assert!(!format!("{redactor:?}").contains("wJalr"));
    }

    #[test]
    fn failures_map_to_the_crate_error_without_losing_the_field() {
        let error = into_error(Failure::InstanceMalformed {
            message: "bad id".into(),
        });
        assert!(matches!(
            error,
            Error::InvalidArgument {
                field: "instance_id",
                ..
            }
        ));
        let error = into_error(Failure::Throttled {
            retry_after: THROTTLE_RETRY_AFTER,
        });
        assert!(
            matches!(error, Error::Throttled { retry_after, .. } if retry_after == THROTTLE_RETRY_AFTER)
        );
        assert_eq!(
            into_error(Failure::Unavailable {
                detail: "refused".into(),
                cause: None
            })
            .reason(),
            "CloudUnavailable"
        );
        assert_eq!(
            into_error(Failure::PermissionDenied {
                code: "AuthFailure".into(),
                message: "no".into()
            })
            .reason(),
            "CloudPermissionDenied"
        );
    }
}
