//! The ECS and VPC RPC calls, each signed, bounded, retried on server errors and counted.
//!
//! No official Alibaba Cloud SDK for Rust exists, so this is reqwest (rustls with ring) and the
//! documented RPC API: `POST https://<endpoint>/?<parameters>` with the action and version in
//! `x-acs-*` headers, signed with V3 (see `signature`) by the key `credentials` describes (for
//! RRSA, STS's `AssumeRoleWithOIDC` is called here too, anonymous as STS documents it). Every
//! HTTP attempt is counted in [`CloudCalls`] by action and result, as a call and as an attempt
//! (`cloud_api_attempts`); a failure becomes a [`Failure`] with secrets removed.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use peerpods_provider_core::{
    CloudCalls, Error, ExposeSecret, Redactor, attempt_result, http as cloud_http,
};
use reqwest::header::RETRY_AFTER;
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::Value;
use tokio::sync::Mutex;

use super::credentials::{
    ASSUME_ROLE_WITH_OIDC, RrsaError, STS_VERSION, SigningKey, exchange_form, read_answer,
    read_token, refresh_at,
};
use super::failure::{Failure, classify};
use super::settings::{Credential, NAME, Rrsa, Settings};
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

/// The error code of a temporary key past its `Expiration` (the gateway's common codes).
const KEY_EXPIRED: &str = "InvalidSecurityToken.Expired";

/// RRSA's temporary key and when to exchange it again.
struct Cached {
    key: SigningKey,
    refresh_at: Timestamp,
}

pub struct Api {
    http: reqwest::Client,
    credential: Credential,
    /// RRSA's current key; `None` until the first exchange (and with static keys).
    cached: Mutex<Option<Cached>>,
    ecs_endpoint: reqwest::Url,
    vpc_endpoint: reqwest::Url,
    sts_endpoint: reqwest::Url,
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
            sts_endpoint: url(super::settings::STS_ENDPOINT, &settings.sts_endpoint)?,
            // RRSA's temporary secrets are never echoed by the cloud; the static one is the
            // one a misconfiguration could put in a message.
            redactor: Redactor::new(match &settings.credential {
                Credential::AccessKey(key) => vec![key.secret.expose_secret().to_owned()],
                Credential::Rrsa(_) => vec![],
            }),
            credential: settings.credential.clone(),
            cached: Mutex::new(None),
            max_attempts: settings.max_attempts,
            calls,
            random: SystemRandom::new(),
        })
    }

    /// Calls `action` with `params`; retries server errors and unanswered requests up to
    /// `max_attempts` times with exponential backoff. Throttling is not retried here: the
    /// caller gets [`Error::Throttled`] with the cloud's wait. A temporary key the cloud calls
    /// expired (its clock ahead of ours, or the key revoked early) is exchanged again and the
    /// call repeated once.
    pub async fn call(
        &self,
        service: Service,
        action: &'static str,
        params: &[(String, String)],
    ) -> Result<Value, Failure> {
        let mut attempt = 1;
        let mut exchanged_again = false;
        loop {
            let (result, key_expired) = self.attempt(service, action, params).await;
            if key_expired && !exchanged_again {
                tracing::info!(
                    action,
                    "the temporary key expired early; exchanging it again"
                );
                exchanged_again = true;
                continue;
            }
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

    /// One attempt, and whether the cloud refused its temporary key as expired (then that key
    /// is forgotten, so the next attempt exchanges again).
    async fn attempt(
        &self,
        service: Service,
        action: &'static str,
        params: &[(String, String)],
    ) -> (Result<Value, Failure>, bool) {
        let key = match self.signing_key().await {
            Ok(key) => key,
            Err(error) => return (Err(Failure::Error(error)), false),
        };
        let started = std::time::Instant::now();
        let mut key_expired = false;
        // `attempt`: the `cloud_api_attempts` result, `None` when nothing was sent.
        let (result, attempt) = match self.request(service, action, params, &key) {
            Err(failure) => (Err(failure), None),
            Ok(request) => match self.send(request, action).await {
                Err(failure) => (Err(failure), Some("transport_error")),
                Ok(answer) => {
                    let status = answer.status.as_u16();
                    key_expired = key.security_token.is_some()
                        && !answer.status.is_success()
                        && error_code(&answer.body).as_deref() == Some(KEY_EXPIRED);
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
        if key_expired {
            self.forget(&key).await;
        }
        (result, key_expired)
    }

    /// The key to sign with: the static pair, or RRSA's temporary key, exchanged when the cached
    /// one is due.
    async fn signing_key(&self) -> Result<SigningKey, Error> {
        let rrsa = match &self.credential {
            Credential::AccessKey(key) => {
                return Ok(SigningKey {
                    id: key.id.clone(),
                    secret: key.secret.clone(),
                    security_token: None,
                });
            }
            Credential::Rrsa(rrsa) => rrsa,
        };
        let mut cached = self.cached.lock().await;
        if let Some(c) = cached.as_ref()
            && Timestamp::now() < c.refresh_at
        {
            return Ok(c.key.clone());
        }
        let obtained = Timestamp::now();
        let (key, expires) = self.exchange(rrsa).await?;
        *cached = Some(Cached {
            key: key.clone(),
            refresh_at: refresh_at(obtained, expires),
        });
        Ok(key)
    }

    /// Forgets `used` if it is still the cached key.
    async fn forget(&self, used: &SigningKey) {
        let mut cached = self.cached.lock().await;
        if cached.as_ref().is_some_and(|c| c.key.id == used.id) {
            *cached = None;
        }
    }

    /// STS `AssumeRoleWithOIDC` with the token as the kubelet last wrote it; counted as that
    /// action. Anonymous (STS authenticates the token, no signature): the V3 headers name the
    /// action, the parameters travel form-encoded in the body.
    async fn exchange(&self, rrsa: &Rrsa) -> Result<(SigningKey, Timestamp), Error> {
        let unauthenticated =
            |e: RrsaError| Error::cloud_unauthenticated(e.to_string()).with_source(e);
        let token = read_token(rrsa).await.map_err(unauthenticated)?;
        let body = exchange_form(rrsa, &token);
        let started = std::time::Instant::now();
        let (result, attempt) = match self.sts_request(body) {
            Err(failure) => (Err(failure.into_error(ASSUME_ROLE_WITH_OIDC)), None),
            Ok(request) => match self.send(request, ASSUME_ROLE_WITH_OIDC).await {
                Err(failure) => (
                    Err(failure.into_error(ASSUME_ROLE_WITH_OIDC)),
                    Some("transport_error"),
                ),
                Ok(answer) => {
                    let status = answer.status.as_u16();
                    let redactor = Redactor::new([token.expose_secret().to_owned()]);
                    let result = read_exchange(rrsa, answer, &redactor);
                    let attempt = match &result {
                        Err(Error::Throttled { .. }) => "throttled",
                        _ => attempt_result(Some(status)),
                    };
                    (result, Some(attempt))
                }
            },
        };
        let label = match &result {
            Ok(_) => RESULT_OK,
            Err(Error::Throttled { .. }) => RESULT_THROTTLED,
            Err(_) => RESULT_ERROR,
        };
        self.calls
            .record_timed(NAME, ASSUME_ROLE_WITH_OIDC, label, started.elapsed());
        if let Some(attempt) = attempt {
            self.calls
                .record_attempt(NAME, ASSUME_ROLE_WITH_OIDC, attempt);
        }
        if let Err(error) = &result {
            tracing::warn!(reason = error.reason(), %error, "RRSA exchange failed");
        }
        result
    }

    /// The anonymous `AssumeRoleWithOIDC` request carrying `body`.
    fn sts_request(&self, body: String) -> Result<reqwest::RequestBuilder, Failure> {
        let content_sha256 = sha256_hex(body.as_bytes());
        let headers = [
            ("x-acs-action", ASSUME_ROLE_WITH_OIDC.to_owned()),
            ("x-acs-version", STS_VERSION.to_owned()),
            ("x-acs-date", now_iso8601()),
            ("x-acs-signature-nonce", self.nonce()?),
            ("x-acs-content-sha256", content_sha256),
        ];
        let mut request = self
            .http
            .post(self.sts_endpoint.clone())
            .header("accept", "application/json")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        Ok(request)
    }

    /// The signed request of one attempt; a failure here sends nothing.
    fn request(
        &self,
        service: Service,
        action: &'static str,
        params: &[(String, String)],
        key: &SigningKey,
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
        let mut headers = vec![
            ("host", host),
            ("x-acs-action", action.to_owned()),
            ("x-acs-version", service.version().to_owned()),
            ("x-acs-date", now_iso8601()),
            ("x-acs-signature-nonce", self.nonce()?),
            ("x-acs-content-sha256", payload_sha256.clone()),
        ];
        // A temporary key is only valid with its STS token, which V3 carries in this header
        // (signed like every `x-acs-*` header).
        if let Some(token) = &key.security_token {
            headers.push(("x-acs-security-token", token.expose_secret().to_owned()));
        }
        let signed = sign(
            &SigningInput {
                method: "POST",
                query: params,
                headers: &headers,
                payload_sha256: &payload_sha256,
            },
            &key.id,
            key.secret.expose_secret(),
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

/// The `Code` of an error answer, if it is JSON with one.
fn error_code(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<Value>(body)
        .ok()?
        .get("Code")?
        .as_str()
        .map(str::to_owned)
}

/// What STS's answer to `AssumeRoleWithOIDC` means: the key, or why there is none. A refusal
/// (4xx other than throttling) is this service's credential problem, named with STS's code;
/// throttling and server errors are classified as for every other call (retryable).
fn read_exchange(
    rrsa: &Rrsa,
    answer: Answered,
    redactor: &Redactor,
) -> Result<(SigningKey, Timestamp), Error> {
    let unauthenticated = |e: RrsaError| Error::cloud_unauthenticated(e.to_string()).with_source(e);
    let json = serde_json::from_slice::<Value>(&answer.body).ok();
    if answer.status.is_success() {
        let json = json.unwrap_or(Value::Null);
        return read_answer(&json).map_err(unauthenticated);
    }
    let field = |name: &str| {
        json.as_ref()
            .and_then(|j| j.get(name))
            .and_then(Value::as_str)
            .map(|s| redactor.redact(s))
    };
    let code = field("Code").unwrap_or_default();
    let message = field("Message").unwrap_or_else(|| {
        redactor.redact(
            &String::from_utf8_lossy(&answer.body)
                .chars()
                .take(200)
                .collect::<String>(),
        )
    });
    let throttled = code.starts_with("Throttling") || answer.status.as_u16() == 429;
    if answer.status.is_client_error() && !throttled {
        return Err(unauthenticated(RrsaError::Refused {
            role_arn: rrsa.role_arn.clone(),
            status: answer.status.as_u16(),
            code,
            message,
        }));
    }
    let code = Some(code.as_str()).filter(|c| !c.is_empty());
    Err(classify(
        answer.status,
        code,
        &message,
        answer.retry_after,
        ASSUME_ROLE_WITH_OIDC,
    )
    .into_error(ASSUME_ROLE_WITH_OIDC))
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
