//! Every HTTP call of both backends: bounded, retried on 5xx and lost answers, counted (each
//! attempt too, in `cloud_api_attempts`), and turned into the crate's error with secrets redacted.
//!
//! IBM has no official Rust SDK, so the backends speak IBM's documented REST APIs (VPC, Power
//! Cloud, IAM identity, Global Tagging) through `reqwest`, with rustls and ring.

use std::sync::Arc;
use std::time::Duration;

use peerpods_provider_core::http::{retry_after, status_error, transport_error};
use peerpods_provider_core::{CloudCalls, Error, Redactor, attempt_result};
use reqwest::StatusCode;

use crate::settings::CallPolicy;

/// One answer of the cloud, read in full.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: String,
    pub retry_after: Option<Duration>,
}

impl Answer {
    pub fn is_success(&self) -> bool {
        self.status.is_success()
    }

    /// 404 Not Found, or 410 Gone (which the Power Cloud API reference lists for deleting a
    /// PVM instance): either way the resource is not, or no longer, there.
    pub fn is_gone(&self) -> bool {
        self.status == StatusCode::NOT_FOUND || self.status == StatusCode::GONE
    }

    /// The crate's error for this (non-success) answer.
    pub fn into_error(self, what: &str, http: &Http) -> Error {
        let message = http.cloud_message(&self.body);
        if let Some(error) = conflict_error(self.status, self.retry_after, what, &message) {
            return error;
        }
        status_error(self.status, self.retry_after, what, &message)
    }

    /// The body as `T`, or an internal error naming the call.
    pub fn json<T: serde::de::DeserializeOwned>(&self, what: &str) -> Result<T, Error> {
        serde_json::from_str(&self.body)
            .map_err(|e| Error::internal(format!("{what}: unreadable answer: {e}")).with_source(e))
    }
}

/// IBM's 409 Conflict: the resource's status does not allow the request now (VPC: "You can't
/// invoke certain instance actions if the status of your instance is in conflict with the
/// action"; Power Virtual Server: an instance in a transitional state such as a capture, a
/// resize or its creation). The status moves on, so the call is worth repeating: retryable,
/// with IBM's `Retry-After` named when sent. `None` for any other status.
pub fn conflict_error(
    status: StatusCode,
    retry_after: Option<Duration>,
    what: &str,
    message: &str,
) -> Option<Error> {
    if status != StatusCode::CONFLICT {
        return None;
    }
    let wait = retry_after.map_or_else(String::new, |wait| {
        format!(" (the cloud asks to wait {} s)", wait.as_secs())
    });
    Some(Error::unavailable(format!(
        "{what}: HTTP 409: the resource's status does not allow it yet, try again{wait}: {message}"
    )))
}

/// What to do after one attempt (pure).
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Hand the answer to the caller.
    Answer,
    /// Wait this long and try again.
    Retry(Duration),
}

/// After attempt `attempt` (1-based) answered `status` (`None`: no answer at all): 5xx, 408 and
/// lost answers are retried with exponential backoff up to `policy.max_retries` times;
/// everything else (429 included: the caller is told to come back later) is the answer.
pub fn next_step(status: Option<StatusCode>, attempt: u32, policy: &CallPolicy) -> Next {
    let retryable = match status {
        None => true,
        Some(s) => s.is_server_error() || s == StatusCode::REQUEST_TIMEOUT,
    };
    if retryable && attempt <= policy.max_retries {
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(16));
        Next::Retry(
            policy
                .backoff
                .saturating_mul(factor)
                .min(Duration::from_secs(10)),
        )
    } else {
        Next::Answer
    }
}

/// The metric result of one answer.
pub fn result_label(status: StatusCode) -> &'static str {
    if status.is_success() {
        "ok"
    } else if status == StatusCode::TOO_MANY_REQUESTS {
        "throttled"
    } else {
        "error"
    }
}

/// The cloud's own explanation in an error body, whichever IBM API sent it: VPC and Global
/// Tagging (`errors[].code/message`), IAM (`errorCode`/`errorMessage`), Power
/// (`description`/`error`); otherwise the start of the body.
pub fn explanation(body: &str) -> String {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(body) else {
        return body.chars().take(200).collect();
    };
    let text = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_str()).map(str::to_owned);
    if let Some(errors) = value.get("errors").and_then(|e| e.as_array()) {
        let parts: Vec<String> = errors
            .iter()
            .map(|e| {
                format!(
                    "{}: {}",
                    text(e.get("code")).unwrap_or_default(),
                    text(e.get("message")).unwrap_or_default()
                )
            })
            .collect();
        return parts.join("; ");
    }
    if let Some(code) = text(value.get("errorCode")) {
        return format!(
            "{code}: {}",
            text(value.get("errorMessage")).unwrap_or_default()
        );
    }
    text(value.get("description"))
        .or_else(|| text(value.get("error")))
        .or_else(|| text(value.get("message")))
        .unwrap_or_else(|| body.chars().take(200).collect())
}

/// The HTTP client of one backend.
pub struct Http {
    client: reqwest::Client,
    calls: CloudCalls,
    provider: &'static str,
    redactor: Redactor,
    policy: CallPolicy,
}

impl Http {
    pub fn new(
        provider: &'static str,
        calls: CloudCalls,
        redactor: Redactor,
        policy: CallPolicy,
    ) -> Result<Self, Error> {
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::tls(e.to_string()).with_source(e))?;
        let tls = rustls_platform_verifier::BuilderVerifierExt::with_platform_verifier(tls)
            .map_err(|e| Error::tls(e.to_string()).with_source(e))?
            .with_no_client_auth();
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .timeout(policy.request_timeout)
            .connect_timeout(policy.request_timeout.min(Duration::from_secs(10)))
            .build()
            .map_err(|e| {
                Error::internal(format!("building the HTTP client: {e}")).with_source(e)
            })?;
        Ok(Http {
            client,
            calls,
            provider,
            redactor,
            policy,
        })
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// The cloud's explanation of an error body, without secrets.
    pub fn cloud_message(&self, body: &str) -> String {
        self.redactor.redact(&explanation(body))
    }

    /// Sends the request `build` makes until it gets an answer worth handing back (see
    /// [`next_step`]); counts each attempt as `operation`. `what` names the call in errors.
    pub async fn send(
        &self,
        operation: &'static str,
        what: &str,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<Answer, Error> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let started = std::time::Instant::now();
            let outcome = match build().send().await {
                Ok(response) => {
                    let status = response.status();
                    let wait = retry_after(
                        response
                            .headers()
                            .get(reqwest::header::RETRY_AFTER)
                            .and_then(|v| v.to_str().ok()),
                        jiff::Timestamp::now(),
                    );
                    match response.text().await {
                        Ok(body) => Ok(Answer {
                            status,
                            body,
                            retry_after: wait,
                        }),
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            };
            let status = outcome.as_ref().ok().map(|a| a.status);
            self.calls.record_timed(
                self.provider,
                operation,
                status.map_or("error", result_label),
                started.elapsed(),
            );
            // Every attempt, classified by its status: IBM's APIs (VPC, Power Cloud, IAM,
            // Global Tagging) throttle with 429; an answer whose body was cut is no answer.
            let result = attempt_result(status.map(|s| s.as_u16()));
            self.calls.record_attempt(self.provider, operation, result);
            match (next_step(status, attempt, &self.policy), outcome) {
                (Next::Retry(wait), outcome) => {
                    tracing::debug!(
                        provider = self.provider,
                        operation,
                        attempt,
                        result,
                        status = status.map(|s| s.as_u16()),
                        error = outcome.err().map(|e| self.redactor.redact(&e.to_string())),
                        "retrying an IBM Cloud call"
                    );
                    tokio::time::sleep(wait).await;
                }
                (Next::Answer, Ok(answer)) => return Ok(answer),
                (Next::Answer, Err(e)) => {
                    // The message is redacted; the transport's error stays its source (it never
                    // carries the API key, which goes in a request body).
                    return Err(match transport_error(what, e) {
                        Error::Unavailable { message, source } => Error::Unavailable {
                            message: self.redactor.redact(&message),
                            source,
                        },
                        other => other,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_answer_keeps_the_parse_error_as_its_source() {
        let answer = Answer {
            status: StatusCode::OK,
            body: "{not json".into(),
            retry_after: None,
        };
        let error = answer
            .json::<serde_json::Value>("reading instance i-1")
            .expect_err("not JSON");
        assert!(matches!(error, Error::Internal { .. }), "{error:?}");
        let source = std::error::Error::source(&error).expect("the parse error");
        assert!(source.is::<serde_json::Error>(), "{source:?}");
    }

    #[test]
    fn a_conflict_is_retryable_and_names_the_clouds_wait() {
        let e = conflict_error(
            StatusCode::CONFLICT,
            Some(Duration::from_secs(4)),
            "deleting instance i",
            "busy",
        );
        assert!(
            matches!(&e, Some(Error::Unavailable { message, .. }) if message.contains("wait 4 s")),
            "{e:?}"
        );
        assert!(conflict_error(StatusCode::BAD_REQUEST, None, "op", "").is_none());
        assert!(conflict_error(StatusCode::TOO_MANY_REQUESTS, None, "op", "").is_none());
    }

    fn policy() -> CallPolicy {
        CallPolicy {
            max_retries: 2,
            backoff: Duration::from_millis(100),
            ..CallPolicy::default()
        }
    }

    #[test]
    fn server_errors_and_lost_answers_are_retried_with_backoff_then_answered() {
        let p = policy();
        assert_eq!(
            next_step(Some(StatusCode::SERVICE_UNAVAILABLE), 1, &p),
            Next::Retry(Duration::from_millis(100))
        );
        assert_eq!(
            next_step(None, 2, &p),
            Next::Retry(Duration::from_millis(200))
        );
        assert_eq!(
            next_step(Some(StatusCode::INTERNAL_SERVER_ERROR), 3, &p),
            Next::Answer
        );
    }

    #[test]
    fn throttling_and_client_errors_are_answered_at_once() {
        let p = policy();
        for status in [
            StatusCode::OK,
            StatusCode::NOT_FOUND,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::UNAUTHORIZED,
            StatusCode::FORBIDDEN,
        ] {
            assert_eq!(next_step(Some(status), 1, &p), Next::Answer, "{status}");
        }
        assert_eq!(result_label(StatusCode::NO_CONTENT), "ok");
        assert_eq!(result_label(StatusCode::TOO_MANY_REQUESTS), "throttled");
        assert_eq!(result_label(StatusCode::NOT_FOUND), "error");
    }

    #[test]
    fn explanations_are_read_from_each_apis_error_shape() {
        assert_eq!(
            explanation(
                r#"{"errors":[{"code":"not_found","message":"Instance not found"}],"trace":"t"}"#
            ),
            "not_found: Instance not found"
        );
        assert_eq!(
            explanation(
                r#"{"errorCode":"BXNIM0415E","errorMessage":"Provided API key could not be found"}"#
            ),
            "BXNIM0415E: Provided API key could not be found"
        );
        assert_eq!(
            explanation(
                r#"{"code":0,"description":"pvm-instance does not exist","error":"not found"}"#
            ),
            "pvm-instance does not exist"
        );
        assert_eq!(
            explanation("<html>bad gateway</html>"),
            "<html>bad gateway</html>"
        );
    }
}
