//! What ARM's answers mean (pure): error bodies and the mapping of failures to the crate's
//! [`Error`].

use std::time::Duration;

use http::StatusCode;
use peerpods_provider_core::{Error, Redactor, http::status_error};
use serde::Deserialize;

/// ARM's documented error body: `{"error": {"code": "...", "message": "..."}}`.
#[derive(Debug, Deserialize)]
struct ErrorBody {
    error: Option<ErrorDetail>,
}

#[derive(Debug, Deserialize, PartialEq, Eq)]
pub struct ErrorDetail {
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub message: String,
}

/// The `error` object of an ARM answer, when it has one.
pub fn error_detail(body: &[u8]) -> Option<ErrorDetail> {
    serde_json::from_slice::<ErrorBody>(body).ok()?.error
}

/// The error for a non-success ARM answer to `operation` (e.g. `deleting VM x`). The cloud's
/// text is redacted before it is kept.
pub fn arm_error(
    status: u16,
    retry_after: Option<Duration>,
    operation: &str,
    body: &[u8],
    redactor: &Redactor,
) -> Error {
    let text = match error_detail(body) {
        Some(detail) => format!("{}: {}", detail.code, detail.message),
        None => String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
    };
    let text = redactor.redact(&text);
    let code = error_detail(body).map(|detail| detail.code);
    if let Some(error) = busy_error(status, code.as_deref(), retry_after, operation, &text) {
        return error;
    }
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    status_error(status, retry_after, operation, &text)
}

/// ARM's codes, with 409 Conflict, for "another operation holds the resource": `Conflict`,
/// Network's `AnotherOperationInProgress`, Compute's `OperationPreempted` (a more recent
/// operation took over) and `OperationNotAllowed` (e.g. "not allowed since the VM is marked for
/// deletion"). Each ends when that operation does, so the call is worth repeating.
pub const CONFLICT_CODES: [&str; 4] = [
    "Conflict",
    "AnotherOperationInProgress",
    "OperationPreempted",
    "OperationNotAllowed",
];

/// Compute's code for a failure it says is worth repeating, whatever the status.
pub const RETRYABLE_CODE: &str = "RetryableError";

/// The retryable error for ARM's documented "busy, try again" answers (see [`CONFLICT_CODES`],
/// [`RETRYABLE_CODE`]); `None` for any other answer. ARM's `Retry-After`, when sent, is named
/// in the message. Throttling (429, whatever its code) is the status mapping's.
fn busy_error(
    status: u16,
    code: Option<&str>,
    retry_after: Option<Duration>,
    operation: &str,
    text: &str,
) -> Option<Error> {
    let code = code?;
    let conflict = status == 409 && CONFLICT_CODES.iter().any(|c| c.eq_ignore_ascii_case(code));
    let retryable = code.eq_ignore_ascii_case(RETRYABLE_CODE) && status != 429;
    if !(conflict || retryable) {
        return None;
    }
    let wait = retry_after.map_or_else(String::new, |wait| {
        format!(" (ARM asks to wait {} s)", wait.as_secs())
    });
    Some(Error::unavailable(format!(
        "{operation}: HTTP {status}: another operation holds the resource, try again{wait}: {text}"
    )))
}

/// Whether `url` points at the configured ARM endpoint (scheme, host and port): a bearer token
/// is never sent anywhere else, whatever URL an answer names.
pub fn same_origin(url: &str, endpoint: &str) -> bool {
    fn origin(url: &str) -> Option<&str> {
        let rest = url.strip_prefix("https://")?;
        Some(&url[..8 + rest.find('/').unwrap_or(rest.len())])
    }
    matches!((origin(url), origin(endpoint)), (Some(a), Some(b)) if a.eq_ignore_ascii_case(b))
}

/// The error for a transport failure or a credential that Entra ID refused, from azure_core's
/// error (its kind and HTTP status), with the text redacted. A transport failure keeps
/// azure_core's error as its source.
pub fn sdk_error(operation: &str, error: azure_core::Error, redactor: &Redactor) -> Error {
    let text = redactor.redact(&chain(&error));
    let message = format!("{operation}: {text}");
    let mapped = match error.kind() {
        // No source: a credential's error may quote what it was given, and only the redacted
        // text may be shown.
        azure_core::error::ErrorKind::Credential => return credential_error(&error, message),
        azure_core::error::ErrorKind::HttpResponse { status, .. } => {
            let status = StatusCode::from_u16(u16::from(*status))
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            status_error(status, None, operation, &text)
        }
        azure_core::error::ErrorKind::Io | azure_core::error::ErrorKind::Connection => {
            Error::unavailable(message)
        }
        _ => Error::internal(message),
    };
    mapped.with_source(error)
}

/// Entra ID's answer to the token request decides: 429 is throttling, 5xx or no answer an
/// outage, anything else (400 invalid_client, 401, a missing token file) means the configured
/// credentials do not work.
fn credential_error(error: &azure_core::Error, message: String) -> Error {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(inner) = current.downcast_ref::<azure_core::Error>() {
            match inner.kind() {
                azure_core::error::ErrorKind::HttpResponse { status, .. } => {
                    let status = u16::from(*status);
                    if status == 429 {
                        return Error::throttled(
                            peerpods_provider_core::DEFAULT_RETRY_AFTER,
                            message,
                        );
                    }
                    if status >= 500 {
                        return Error::unavailable(message);
                    }
                    return Error::cloud_unauthenticated(message);
                }
                azure_core::error::ErrorKind::Io | azure_core::error::ErrorKind::Connection => {
                    return Error::unavailable(message);
                }
                _ => {}
            }
        }
        source = current.source();
    }
    Error::cloud_unauthenticated(message)
}

fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arm(status: u16, code: &str, retry_after: Option<Duration>) -> Error {
        let body = format!(r#"{{"error":{{"code":"{code}","message":"m"}}}}"#);
        arm_error(
            status,
            retry_after,
            "deleting VM v",
            body.as_bytes(),
            &Redactor::new(Vec::<String>::new()),
        )
    }

    #[test]
    fn arms_busy_answers_are_retryable_and_throttling_keeps_its_wait() {
        for code in CONFLICT_CODES {
            assert_eq!(arm(409, code, None).reason(), "CloudUnavailable", "{code}");
        }
        assert_eq!(
            arm(500, "RetryableError", None).reason(),
            "CloudUnavailable"
        );
        assert_eq!(
            arm(409, "RetryableError", None).reason(),
            "CloudUnavailable"
        );
        let e = arm(409, "Conflict", Some(Duration::from_secs(7)));
        assert!(e.to_string().contains("wait 7 s"), "{e}");
        // A conflict ARM does not say will end (a lock, a policy) is not retried.
        assert_eq!(arm(409, "ScopeLocked", None).reason(), "Internal");
        assert_eq!(
            arm(409, "RequestDisallowedByPolicy", None).reason(),
            "Internal"
        );
        // OperationNotAllowed outside a 409 (e.g. a 400 quota refusal) is not a conflict.
        assert_eq!(arm(400, "OperationNotAllowed", None).reason(), "Internal");
        for code in [
            "TooManyRequests",
            "SubscriptionRequestsThrottled",
            "OperationNotAllowed",
        ] {
            let e = arm(429, code, Some(Duration::from_secs(17)));
            assert!(
                matches!(e, Error::Throttled { retry_after, .. } if retry_after == Duration::from_secs(17)),
                "{code}: {e:?}"
            );
        }
    }

    #[test]
    fn arm_error_bodies_are_read_and_redacted() {
        let body = br#"{"error":{"code":"AuthorizationFailed","message":"client 'x' with secret hunter2hunter2 lacks write"}}"#;
        let redactor = Redactor::new(["hunter2hunter2"]);
        let error = arm_error(403, None, "deleting VM vm-1", body, &redactor);
        assert_eq!(error.reason(), "CloudPermissionDenied");
        let text = error.to_string();
        assert!(text.contains("AuthorizationFailed"), "{text}");
        assert!(!text.contains("hunter2hunter2"), "{text}");

        let throttled = arm_error(
            429,
            Some(Duration::from_secs(17)),
            "op",
            br#"{"error":{"code":"TooManyRequests","message":"slow"}}"#,
            &redactor,
        );
        assert!(
            matches!(throttled, Error::Throttled { retry_after, .. } if retry_after == Duration::from_secs(17))
        );
        assert_eq!(
            arm_error(401, None, "op", b"", &redactor).reason(),
            "CloudUnauthenticated"
        );
        assert_eq!(
            arm_error(503, None, "op", b"not json", &redactor).reason(),
            "CloudUnavailable"
        );
        assert_eq!(error_detail(b"{}"), None);
    }

    #[test]
    fn tokens_only_go_to_the_configured_endpoint() {
        let arm = "https://management.azure.com";
        assert!(same_origin(
            "https://management.azure.com/subscriptions/x/operations/1?api-version=1",
            arm
        ));
        assert!(same_origin("https://MANAGEMENT.azure.com", arm));
        assert!(!same_origin(
            "https://management.azure.com.evil.example/x",
            arm
        ));
        assert!(!same_origin("http://management.azure.com/x", arm));
        assert!(!same_origin("https://127.0.0.1:1/x", "https://127.0.0.1:2"));
    }
}
