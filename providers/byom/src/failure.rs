//! What a failed Kubernetes API call means for this backend (pure): the pool ConfigMap's API is
//! this backend's "cloud", so its answers map to the crate error like any cloud's.

use std::time::Duration;

use http::StatusCode;
use peerpods_provider_core::{Error, Redactor, http::status_error};

/// A failed call, sorted by what the caller does next.
#[derive(Debug)]
pub enum Failure {
    /// 404: the ConfigMap (or its namespace) does not exist.
    NotFound,
    /// 409: the ConfigMap changed since it was read; read it again.
    Conflict,
    /// 408, 5xx, no answer or too slow an answer: worth another try.
    Transient(Error),
    /// Anything else: final.
    Final(Error),
}

impl Failure {
    /// The label of `CloudCalls::record` for this failure.
    pub fn result_label(&self) -> &'static str {
        match self {
            Failure::Final(Error::Throttled { .. }) => "throttled",
            _ => "error",
        }
    }
}

/// Classifies `error` of the call described by `operation` (e.g. `reading ConfigMap ns/name`);
/// every text from the API passes through `redactor`. A failure without the API server's answer
/// keeps kube's error as its source; an answer's status is the cloud's word and needs none.
pub fn classify(error: kube::Error, operation: &str, redactor: &Redactor) -> Failure {
    match &error {
        kube::Error::Api(status) => {
            let code =
                StatusCode::from_u16(status.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            match code {
                StatusCode::NOT_FOUND => return Failure::NotFound,
                StatusCode::CONFLICT => return Failure::Conflict,
                _ => {}
            }
            let retry_after = status
                .details
                .as_ref()
                .map(|d| d.retry_after_seconds)
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(u64::from(s)));
            let message = redactor.redact(&format!("{} ({})", status.message, status.reason));
            let error = status_error(code, retry_after, operation, &message);
            if code == StatusCode::REQUEST_TIMEOUT || code.is_server_error() {
                Failure::Transient(error)
            } else {
                Failure::Final(error)
            }
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) => Failure::Transient(
            Error::unavailable(redactor.redact(&format!("{operation}: {}", chain(&error))))
                .with_source(error),
        ),
        // No source: a credential's error (an exec plugin's output, a token file) may quote the
        // credential, and only the redacted text may be shown.
        kube::Error::Auth(_) => Failure::Final(Error::cloud_unauthenticated(
            redactor.redact(&format!("{operation}: {}", chain(&error))),
        )),
        _ => Failure::Final(
            Error::internal(redactor.redact(&format!("{operation}: {}", chain(&error))))
                .with_source(error),
        ),
    }
}

/// The `cloud_api_attempts` result of one try that failed with `error`: the API server's status
/// (429 is `throttled`), `transport_error` for no answer or an unreadable one; `None` when no
/// request went out (it could not be built, or no credentials for it).
pub fn attempt_result(error: &kube::Error) -> Option<&'static str> {
    match error {
        kube::Error::Api(status) => Some(peerpods_provider_core::attempt_result(Some(status.code))),
        kube::Error::HyperError(_)
        | kube::Error::Service(_)
        | kube::Error::SerdeError(_)
        | kube::Error::FromUtf8(_) => Some("transport_error"),
        _ => None,
    }
}

/// The error for a call that did not answer within its time.
pub fn timed_out(operation: &str, after: Duration) -> Failure {
    Failure::Transient(Error::unavailable(format!(
        "{operation}: no answer within {after:?}"
    )))
}

fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        let next = s.to_string();
        // Wrappers often repeat their source's text; say it once.
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
    use kube::core::Status;
    use kube::core::response::StatusDetails;

    fn api(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Status::failure(message, reason).with_code(code).boxed())
    }

    fn none() -> Redactor {
        Redactor::default()
    }

    #[test]
    fn tries_are_classified_by_the_api_servers_answer() {
        assert_eq!(
            attempt_result(&api(429, "TooManyRequests", "slow down")),
            Some("throttled")
        );
        assert_eq!(
            attempt_result(&api(503, "ServiceUnavailable", "")),
            Some("server_error")
        );
        assert_eq!(
            attempt_result(&api(404, "NotFound", "")),
            Some("client_error")
        );
        let unreadable = serde_json::from_str::<u8>("x").unwrap_err();
        assert_eq!(
            attempt_result(&kube::Error::SerdeError(unreadable)),
            Some("transport_error")
        );
    }

    #[test]
    fn not_found_and_conflict_are_for_the_caller_to_handle() {
        assert!(matches!(
            classify(
                api(404, "NotFound", "configmaps \"x\" not found"),
                "op",
                &none()
            ),
            Failure::NotFound
        ));
        assert!(matches!(
            classify(
                api(409, "Conflict", "the object has been modified"),
                "op",
                &none()
            ),
            Failure::Conflict
        ));
    }

    #[test]
    fn throttling_carries_the_servers_wait() {
        let status = Status::failure(
            "Too many requests, please try again later.",
            "TooManyRequests",
        )
        .with_code(429)
        .with_details(
            serde_json::from_value::<StatusDetails>(serde_json::json!({"retryAfterSeconds": 7}))
                .unwrap(),
        );
        let failure = classify(kube::Error::Api(status.boxed()), "op", &none());
        assert_eq!(failure.result_label(), "throttled");
        assert!(matches!(
            failure,
            Failure::Final(Error::Throttled { retry_after, .. }) if retry_after == Duration::from_secs(7)
        ));
        let failure = classify(api(429, "TooManyRequests", "slow down"), "op", &none());
        assert!(matches!(
            failure,
            Failure::Final(Error::Throttled { retry_after, .. })
                if retry_after == peerpods_provider_core::DEFAULT_RETRY_AFTER
        ));
    }

    #[test]
    fn outages_are_transient_and_refusals_final() {
        for code in [500, 502, 503, 504, 408] {
            let failure = classify(api(code, "InternalError", "etcd is sad"), "op", &none());
            assert!(
                matches!(failure, Failure::Transient(Error::Unavailable { .. })),
                "{code}: {failure:?}"
            );
            assert_eq!(failure.result_label(), "error");
        }
        assert!(matches!(
            classify(api(401, "Unauthorized", "Unauthorized"), "op", &none()),
            Failure::Final(Error::CloudUnauthenticated { .. })
        ));
        assert!(matches!(
            classify(api(403, "Forbidden", "cannot update"), "op", &none()),
            Failure::Final(Error::CloudPermissionDenied { .. })
        ));
        assert!(matches!(
            classify(api(422, "Invalid", "bad"), "op", &none()),
            Failure::Final(Error::Internal { .. })
        ));
        assert!(matches!(
            timed_out("op", Duration::from_secs(1)),
            Failure::Transient(Error::Unavailable { .. })
        ));
    }

    #[test]
    fn texts_from_the_api_are_redacted_and_name_the_operation() {
        let redactor = Redactor::new(["sekret-token-value"]);
        let failure = classify(
            api(401, "Unauthorized", "token sekret-token-value is not valid"),
            "reading ConfigMap ns/pool",
            &redactor,
        );
        let Failure::Final(error) = failure else {
            panic!("final expected");
        };
        let text = format!("{error} {error:?}");
        assert!(!text.contains("sekret-token-value"), "{text}");
        assert!(
            text.contains("reading ConfigMap ns/pool: HTTP 401"),
            "{text}"
        );
    }
}
