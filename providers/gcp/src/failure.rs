//! What a Compute Engine answer means: the SDK's error reduced to plain facts ([`Failure`]),
//! which pure functions turn into the crate's [`Error`] and the retry decision.

use std::time::Duration;

use google_cloud_gax::error::Error as GaxError;
use google_cloud_gax::error::rpc::StatusDetails;
use http::StatusCode;
use peerpods_provider_core::{Error, Redactor, http as cloud_http};

/// Compute Engine's reasons for "another operation on this resource is still running": the
/// `errors[].reason` of an answer (`resourceNotReady`) and the code of a failed operation or
/// the `ErrorInfo` reason of newer answers (`RESOURCE_NOT_READY`).
pub const NOT_READY_REASONS: [&str; 2] = ["resourceNotReady", "RESOURCE_NOT_READY"];

/// The reasons with which Google APIs refuse a call for its rate rather than for a permission,
/// whatever the HTTP status. Compute Engine answers an exceeded rate quota with **403** and
/// `rateLimitExceeded` ("Compute Engine rate quotas": wait for the next minute's refill), too
/// frequent operations on one resource with `RESOURCE_OPERATION_RATE_EXCEEDED` (an `ErrorInfo`
/// reason, or the code of a failed operation); `userRateLimitExceeded` and
/// `RATE_LIMIT_EXCEEDED` are the same refusals in Google's per-user and `ErrorInfo` spellings.
pub const RATE_LIMIT_REASONS: [&str; 4] = [
    "rateLimitExceeded",
    "userRateLimitExceeded",
    "RATE_LIMIT_EXCEEDED",
    "RESOURCE_OPERATION_RATE_EXCEEDED",
];

/// The facts of one failed call, taken from the SDK's error.
#[derive(Debug)]
pub struct Failure {
    /// HTTP status of the answer; `None` when there was no answer (connect, timeout, token).
    pub status: Option<u16>,
    /// The `Retry-After` header of the answer, as sent.
    pub retry_after: Option<String>,
    /// What the cloud says went wrong: the `reason`s of the answer's `error.details[]`
    /// (`ErrorInfo`) or, without details, of its `error.errors[]` (e.g. `notFound`,
    /// `resourceNotReady`, `rateLimitExceeded`); for a failed operation, its error codes.
    pub reasons: Vec<String>,
    /// The cloud's message (or the transport error), already redacted.
    pub message: String,
    /// The credentials could not produce a token; `transient` when they may later.
    pub credentials: Option<CredentialsFailure>,
    /// The SDK's error of a call that got no answer (connect, timeout), kept as the source of the
    /// crate's error. Not kept for an answer (its status and message say it all) nor for a
    /// credentials failure (its text may quote the credentials; only the redacted one is shown).
    pub transport: Option<GaxError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CredentialsFailure {
    pub transient: bool,
}

impl Failure {
    /// Reads the SDK's error; cloud texts pass through `redactor`.
    pub fn from_sdk(sdk_error: GaxError, redactor: &Redactor) -> Self {
        let error = &sdk_error;
        let reasons = reasons(error);
        let message = match error.status() {
            Some(status) => status.message.clone(),
            None => error_chain(error),
        };
        let credentials = error.is_authentication().then(|| CredentialsFailure {
            transient: credentials_transient(error),
        });
        Failure {
            status: error.http_status_code(),
            retry_after: error
                .http_headers()
                .and_then(|headers| headers.get(http::header::RETRY_AFTER))
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned),
            reasons,
            message: redactor.redact(&message),
            credentials,
            transport: None,
        }
        .with_transport(sdk_error)
    }

    /// Keeps `error` when it is a transport failure (see [`Failure::transport`]).
    fn with_transport(mut self, error: GaxError) -> Self {
        if self.status.is_none() && self.credentials.is_none() && error.status().is_none() {
            self.transport = Some(error);
        }
        self
    }

    /// Compute Engine answered 404: the resource does not exist.
    pub fn is_not_found(&self) -> bool {
        self.status == Some(404)
    }

    /// Another operation (e.g. a deletion already under way) holds the resource.
    pub fn is_not_ready(&self) -> bool {
        self.reasons
            .iter()
            .any(|r| NOT_READY_REASONS.contains(&r.as_str()))
    }

    /// The cloud refused the call for its rate (429, or a 403 that says so in its reason).
    pub fn is_rate_limited(&self) -> bool {
        rate_limited(self.status, &self.reasons)
    }

    /// The crate error for this failure; `operation` says what was being done.
    pub fn into_error(mut self, operation: &str) -> Error {
        match self.transport.take() {
            Some(transport) => self.described(operation).with_source(transport),
            None => self.described(operation),
        }
    }

    fn described(self, operation: &str) -> Error {
        if let Some(credentials) = self.credentials {
            let message = format!(
                "{operation}: the credentials cannot produce an access token: {}",
                self.message
            );
            return if credentials.transient {
                Error::unavailable(message)
            } else {
                Error::cloud_unauthenticated(message)
            };
        }
        let now = jiff::Timestamp::now();
        let wait = cloud_http::retry_after(self.retry_after.as_deref(), now);
        // The reason decides before the status: Compute Engine refuses a rate with 403, which
        // by status alone would read as a missing permission and send operators to IAM.
        if self.is_rate_limited() {
            let reasons = match self.reasons.as_slice() {
                [] => String::new(),
                reasons => format!(" ({})", reasons.join(", ")),
            };
            return Error::throttled(
                wait.unwrap_or_else(|| until_quota_refill(now)),
                format!(
                    "{operation}: HTTP {}: rate limit{reasons}: {}",
                    self.status.unwrap_or(429),
                    self.message
                ),
            );
        }
        if self.is_not_ready() {
            return Error::unavailable(format!(
                "{operation}: another operation holds the resource, try again: {}",
                self.message
            ));
        }
        match self.status.and_then(|s| StatusCode::from_u16(s).ok()) {
            Some(status) => cloud_http::status_error(status, wait, operation, &self.message),
            None => Error::unavailable(format!("{operation}: {}", self.message)),
        }
    }
}

/// The `reason`s of an answer's `ErrorInfo` details (see [`Failure::reasons`]).
fn reasons(error: &GaxError) -> Vec<String> {
    error
        .status()
        .map(|status| {
            status
                .details
                .iter()
                .filter_map(|detail| match detail {
                    StatusDetails::ErrorInfo(info) => Some(info.reason.clone()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The `cloud_api_attempts` result of one failed attempt: `throttled` when Compute Engine
/// refused it for its rate as [`Failure::is_rate_limited`] reads it (403 `rateLimitExceeded`
/// included), otherwise by its status (none: no answer). `None` when no request was sent: the
/// credentials produced no token, or the request could not be serialized.
pub fn attempt_result(error: &GaxError) -> Option<&'static str> {
    if error.is_authentication() || error.is_serialization() {
        return None;
    }
    Some(answered_attempt_result(
        error.http_status_code(),
        &reasons(error),
    ))
}

/// [`attempt_result`] of an answer with `status` (`None`: no answer) and `reasons`.
pub fn answered_attempt_result(status: Option<u16>, reasons: &[String]) -> &'static str {
    if rate_limited(status, reasons) {
        "throttled"
    } else {
        peerpods_provider_core::attempt_result(status)
    }
}

/// See [`Failure::is_rate_limited`].
fn rate_limited(status: Option<u16>, reasons: &[String]) -> bool {
    status == Some(429)
        || reasons
            .iter()
            .any(|r| RATE_LIMIT_REASONS.contains(&r.as_str()))
}

/// How long until Compute Engine refills a rate quota: its quotas are per minute and refill at
/// the start of the next synchronized minute ("Compute Engine rate quotas"), so the wait is
/// what is left of the current minute (at least a second).
pub fn until_quota_refill(now: jiff::Timestamp) -> Duration {
    let into_minute = now.as_second().rem_euclid(60).unsigned_abs();
    Duration::from_secs((60 - into_minute).max(1))
}

/// Whether an attempt that failed like this is worth repeating: no answer at all (connect,
/// timeout, broken body) or a server-side 5xx / 408. Never 429 (the caller is told to wait),
/// never a refusal.
pub fn is_transient(status: Option<u16>, no_answer: bool) -> bool {
    match status {
        Some(status) => status == 408 || (500..=599).contains(&status),
        None => no_answer,
    }
}

/// [`is_transient`] for the SDK's error.
pub fn sdk_error_is_transient(error: &GaxError) -> bool {
    if error.is_authentication() {
        return credentials_transient(error);
    }
    let no_answer = error.is_io()
        || error.is_connect()
        || error.is_timeout()
        || error.is_transport()
        || error.is_transient_and_before_rpc();
    is_transient(error.http_status_code(), no_answer)
}

fn credentials_transient(error: &GaxError) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(s) = source {
        if let Some(credentials) = s.downcast_ref::<google_cloud_gax::error::CredentialsError>() {
            return credentials.is_transient();
        }
        source = s.source();
    }
    false
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(status: Option<u16>) -> Failure {
        Failure {
            status,
            retry_after: None,
            reasons: vec![],
            message: "cloud text".into(),
            credentials: None,
            transport: None,
        }
    }

    #[test]
    fn attempts_are_classified_by_what_the_cloud_said() {
        let reasons = |r: &[&str]| r.iter().map(|r| (*r).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            answered_attempt_result(Some(403), &reasons(&["rateLimitExceeded"])),
            "throttled"
        );
        assert_eq!(answered_attempt_result(Some(429), &[]), "throttled");
        assert_eq!(
            answered_attempt_result(Some(403), &reasons(&["forbidden"])),
            "client_error"
        );
        assert_eq!(answered_attempt_result(Some(503), &[]), "server_error");
        assert_eq!(answered_attempt_result(Some(200), &[]), "ok");
        assert_eq!(answered_attempt_result(None, &[]), "transport_error");
    }

    #[test]
    fn only_missing_answers_and_server_errors_are_retried() {
        for status in [500, 502, 503, 504, 408] {
            assert!(is_transient(Some(status), false), "{status}");
        }
        for status in [400, 401, 403, 404, 409, 412, 429] {
            assert!(!is_transient(Some(status), false), "{status}");
        }
        assert!(is_transient(None, true));
        assert!(!is_transient(None, false));
    }

    #[test]
    fn answers_map_to_what_the_caller_can_do() {
        let throttled = Failure {
            retry_after: Some("7".into()),
            ..failure(Some(429))
        }
        .into_error("deleting instance vm-1");
        assert!(
            matches!(throttled, Error::Throttled { retry_after, .. } if retry_after == Duration::from_secs(7))
        );
        assert_eq!(
            failure(Some(401)).into_error("op").reason(),
            "CloudUnauthenticated"
        );
        assert_eq!(
            failure(Some(403)).into_error("op").reason(),
            "CloudPermissionDenied"
        );
        assert_eq!(
            failure(Some(503)).into_error("op").reason(),
            "CloudUnavailable"
        );
        assert_eq!(failure(None).into_error("op").reason(), "CloudUnavailable");
        let refused_token = Failure {
            credentials: Some(CredentialsFailure { transient: false }),
            ..failure(None)
        };
        assert_eq!(
            refused_token.into_error("op").reason(),
            "CloudUnauthenticated"
        );
        let metadata_down = Failure {
            credentials: Some(CredentialsFailure { transient: true }),
            ..failure(None)
        };
        assert_eq!(metadata_down.into_error("op").reason(), "CloudUnavailable");
    }

    #[test]
    fn not_found_and_not_ready_are_recognised() {
        assert!(failure(Some(404)).is_not_found());
        assert!(!failure(Some(400)).is_not_found());
        let busy = Failure {
            reasons: vec!["resourceNotReady".into()],
            ..failure(Some(400))
        };
        assert!(busy.is_not_ready());
        assert!(!failure(Some(400)).is_not_ready());
        let operation_busy = Failure {
            reasons: vec!["RESOURCE_NOT_READY".into()],
            ..failure(Some(400))
        };
        assert!(operation_busy.is_not_ready());
        assert_eq!(
            operation_busy.into_error("deleting instance vm-1").reason(),
            "CloudUnavailable"
        );
    }

    #[test]
    fn a_403_that_says_rate_limit_is_throttling_not_a_permission() {
        for reason in RATE_LIMIT_REASONS {
            let refused = Failure {
                reasons: vec![reason.into()],
                ..failure(Some(403))
            };
            assert!(refused.is_rate_limited(), "{reason}");
            let error = refused.into_error("deleting instance vm-1");
            match &error {
                Error::Throttled { retry_after, .. } => {
                    assert!(
                        (Duration::from_secs(1)..=Duration::from_secs(60)).contains(retry_after),
                        "{reason}: {retry_after:?}"
                    );
                }
                other => panic!("{reason}: {other:?}"),
            }
            assert!(error.to_string().contains(reason), "{error}");
        }
        // A Retry-After, when sent, is the wait.
        let with_header = Failure {
            reasons: vec!["rateLimitExceeded".into()],
            retry_after: Some("3".into()),
            ..failure(Some(403))
        };
        assert!(
            matches!(with_header.into_error("op"), Error::Throttled { retry_after, .. } if retry_after == Duration::from_secs(3))
        );
        // Any other 403 still is a missing permission.
        let forbidden = Failure {
            reasons: vec!["forbidden".into()],
            ..failure(Some(403))
        };
        assert!(!forbidden.is_rate_limited());
        assert_eq!(forbidden.into_error("op").reason(), "CloudPermissionDenied");
    }

    #[test]
    fn rate_quotas_refill_at_the_next_minute() {
        let at = |t: &str| t.parse::<jiff::Timestamp>().expect("timestamp");
        assert_eq!(
            until_quota_refill(at("2026-11-24T10:00:15Z")),
            Duration::from_secs(45)
        );
        assert_eq!(
            until_quota_refill(at("2026-11-24T10:00:00Z")),
            Duration::from_secs(60)
        );
        assert_eq!(
            until_quota_refill(at("2026-11-24T10:00:59.900Z")),
            Duration::from_secs(1)
        );
    }
}
