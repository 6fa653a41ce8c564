//! The ECS and VPC RPC calls, each signed, bounded, retried on server errors and counted.
//!
//! No official Alibaba Cloud SDK for Rust exists, so this is reqwest (rustls with ring) and the
//! documented RPC API: `POST https://<endpoint>/?<parameters>` with the action and version in
//! `x-acs-*` headers, signed with V3 (see `signature`). Every HTTP attempt is counted in
//! [`CloudCalls`] by action and result, as a call and as an attempt (`cloud_api_attempts`); a
//! failure becomes a [`Failure`] with secrets removed.

use std::sync::Arc;
use std::time::Duration;

use peerpods_provider_core::{
    CloudCalls, Error, ExposeSecret, Redactor, attempt_result, http as cloud_http,
};
use reqwest::header::RETRY_AFTER;
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::Value;

use super::NAME;
use super::failure::{Failure, classify};
use super::settings::{AccessKey, Settings};
use super::signature::{SigningInput, sha256_hex, sign};

/// Which API answers an action: each has its endpoint and version.
#[derive(Clone, Copy, Debug)]
pub enum Service {
    Ecs,
    Vpc,
}

impl Service {
    fn version(self) -> &'static str {
        match self {
            Service::Ecs => "2014-05-26",
            Service::Vpc => "2016-04-28",
        }
    }
}

const RESULT_OK: &str = "ok";
const RESULT_ERROR: &str = "error";
const RESULT_THROTTLED: &str = "throttled";

/// Pause before the second attempt; doubled for each further one.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

pub struct Api {
    http: reqwest::Client,
    access_key: AccessKey,
    ecs_endpoint: reqwest::Url,
    vpc_endpoint: reqwest::Url,
    max_attempts: u32,
    calls: CloudCalls,
    redactor: Redactor,
    random: SystemRandom,
}

impl Api {
    /// The client for these settings; a configuration error names the key to fix.
    pub fn new(settings: &Settings, calls: CloudCalls) -> Result<Self, Error> {
        let tls_problem = |what: &str, e: rustls::Error| {
            Error::config(super::settings::ECS_ENDPOINT, format!("{what}: {e}")).with_source(e)
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls_platform_verifier::Verifier::new(Arc::clone(&provider))
            .map_err(|e| tls_problem("TLS roots", e))?;
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_problem("TLS", e))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth();
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .timeout(settings.request_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| {
                Error::config(super::settings::ECS_ENDPOINT, e.to_string()).with_source(e)
            })?;
        let url = |key: &'static str, text: &str| {
            reqwest::Url::parse(text).map_err(|e| Error::config(key, e.to_string()).with_source(e))
        };
        Ok(Api {
            http,
            ecs_endpoint: url(super::settings::ECS_ENDPOINT, &settings.ecs_endpoint)?,
            vpc_endpoint: url(super::settings::VPC_ENDPOINT, &settings.vpc_endpoint)?,
            redactor: Redactor::new([settings.access_key.secret.expose_secret().to_owned()]),
            access_key: settings.access_key.clone(),
            max_attempts: settings.max_attempts,
            calls,
            random: SystemRandom::new(),
        })
    }

    /// Calls `action` with `params`; retries server errors and unanswered requests up to
    /// `max_attempts` times with exponential backoff. Throttling is not retried here: the
    /// caller gets [`Error::Throttled`] with the cloud's wait.
    pub async fn call(
        &self,
        service: Service,
        action: &'static str,
        params: &[(String, String)],
    ) -> Result<Value, Failure> {
        let mut attempt = 1;
        loop {
            let result = self.attempt(service, action, params).await;
            match result {
                Err(failure) if failure.is_transient() && attempt < self.max_attempts => {
                    tracing::debug!(action, attempt, "retrying a failed Alibaba Cloud call");
                    tokio::time::sleep(FIRST_BACKOFF * 2u32.pow(attempt - 1)).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn attempt(
        &self,
        service: Service,
        action: &'static str,
        params: &[(String, String)],
    ) -> Result<Value, Failure> {
        let started = std::time::Instant::now();
        // `attempt`: the `cloud_api_attempts` result, `None` when nothing was sent.
        let (result, attempt) = match self.request(service, action, params) {
            Err(failure) => (Err(failure), None),
            Ok(request) => match self.send(request, action).await {
                Err(failure) => (Err(failure), Some("transport_error")),
                Ok(answer) => {
                    let status = answer.status.as_u16();
                    let result = self.read(action, answer);
                    // Throttling as `classify` reads it (a `Throttling*` code whatever the
                    // status, or 429); anything else by its status.
                    let attempt = match &result {
                        Err(Failure::Error(Error::Throttled { .. })) => "throttled",
                        _ => attempt_result(Some(status)),
                    };
                    (result, Some(attempt))
                }
            },
        };
        let label = match &result {
            Ok(_) => RESULT_OK,
            Err(Failure::Error(Error::Throttled { .. })) => RESULT_THROTTLED,
            Err(_) => RESULT_ERROR,
        };
        self.calls
            .record_timed(NAME, action, label, started.elapsed());
        if let Some(attempt) = attempt {
            self.calls.record_attempt(NAME, action, attempt);
        }
        result
    }

    /// The signed request of one attempt; a failure here sends nothing.
    fn request(
        &self,
        service: Service,
        action: &'static str,
        params: &[(String, String)],
    ) -> Result<reqwest::RequestBuilder, Failure> {
        let endpoint = match service {
            Service::Ecs => &self.ecs_endpoint,
            Service::Vpc => &self.vpc_endpoint,
        };
        let host = match (endpoint.host_str(), endpoint.port()) {
            (Some(host), Some(port)) => format!("{host}:{port}"),
            (Some(host), None) => host.to_owned(),
            (None, _) => {
                return Err(Failure::Error(Error::internal("endpoint without host")));
            }
        };
        let payload_sha256 = sha256_hex(b"");
        let headers = [
            ("host", host),
            ("x-acs-action", action.to_owned()),
            ("x-acs-version", service.version().to_owned()),
            ("x-acs-date", now_iso8601()),
            ("x-acs-signature-nonce", self.nonce()?),
            ("x-acs-content-sha256", payload_sha256.clone()),
        ];
        let signed = sign(
            &SigningInput {
                method: "POST",
                query: params,
                headers: &headers,
                payload_sha256: &payload_sha256,
            },
            &self.access_key.id,
            self.access_key.secret.expose_secret(),
        );
        let mut url = endpoint.clone();
        url.set_query(
            Some(&signed.canonical_query)
                .filter(|q| !q.is_empty())
                .map(String::as_str),
        );
        let mut request = self
            .http
            .post(url)
            .header("accept", "application/json")
            .header("authorization", signed.authorization);
        for (name, value) in headers.iter().filter(|(name, _)| *name != "host") {
            request = request.header(*name, value);
        }
        Ok(request)
    }

    /// Sends one attempt; a failure is no answer (connect, TLS, timeout, a cut body).
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        action: &'static str,
    ) -> Result<Answered, Failure> {
        let no_answer = |e: reqwest::Error| {
            Failure::Error(self.redacted(cloud_http::transport_error(action, e)))
        };
        let response = request.send().await.map_err(no_answer)?;
        let status = response.status();
        let retry_after = cloud_http::retry_after(
            response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok()),
            jiff::Timestamp::now(),
        );
        let body = response.bytes().await.map_err(no_answer)?.to_vec();
        Ok(Answered {
            status,
            retry_after,
            body,
        })
    }

    /// What the cloud's answer means: its JSON, or the classified failure.
    fn read(&self, action: &'static str, answer: Answered) -> Result<Value, Failure> {
        let Answered {
            status,
            retry_after,
            body,
        } = answer;
        let json = serde_json::from_slice::<Value>(&body);
        if status.is_success() {
            return json.map_err(|e| {
                Failure::Error(
                    Error::internal(format!("{action}: the answer is not JSON")).with_source(e),
                )
            });
        }
        // An error answer need not be JSON: its text then stands in for the cloud's message.
        let json = json.ok();
        let field = |name: &str| {
            json.as_ref()
                .and_then(|j| j.get(name))
                .and_then(Value::as_str)
                .map(|s| self.redactor.redact(s))
        };
        let code = field("Code");
        let message = field("Message").unwrap_or_else(|| {
            self.redactor.redact(
                &String::from_utf8_lossy(&body)
                    .chars()
                    .take(200)
                    .collect::<String>(),
            )
        });
        let failure = classify(status, code.as_deref(), &message, retry_after, action);
        if let Failure::Error(error) = &failure {
            tracing::debug!(action, reason = error.reason(), "Alibaba Cloud call failed");
        }
        Err(failure)
    }

    fn nonce(&self) -> Result<String, Failure> {
        let mut bytes = [0u8; 16];
        self.random.fill(&mut bytes).map_err(|_| {
            Failure::Error(Error::internal("no randomness for the signature nonce"))
        })?;
        Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// The message redacted; the source is reqwest's error, whose text names only the URL (the
    /// signature travels in a header, the secret never), so it stays.
    fn redacted(&self, error: Error) -> Error {
        match error {
            Error::Unavailable { message, source } => Error::Unavailable {
                message: self.redactor.redact(&message),
                source,
            },
            other => other,
        }
    }
}

/// One answer of the cloud, whatever its status.
struct Answered {
    status: reqwest::StatusCode,
    retry_after: Option<Duration>,
    body: Vec<u8>,
}

/// `x-acs-date`: UTC, ISO 8601 to the second, e.g. `2023-10-26T10:22:32Z`.
fn now_iso8601() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates_are_whole_seconds_in_utc() {
        let date = super::now_iso8601();
        assert_eq!(date.len(), "2023-10-26T10:22:32Z".len(), "{date}");
        assert!(date.ends_with('Z'));
    }
}
