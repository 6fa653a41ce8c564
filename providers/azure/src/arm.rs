//! Every call to Azure Resource Manager, through azure_core's pipeline: bearer tokens from
//! azure_identity, the SDK's retry policy (408/5xx and no answer, with backoff; 429 is handed to
//! the caller with ARM's `Retry-After`), one `CloudCalls` count per HTTP attempt.
//!
//! There is no official Rust crate for the compute or network resource providers (the Azure SDK
//! for Rust publishes data-plane clients only), so requests are built here and sent through the
//! official pipeline.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::cloud::{CloudConfiguration, CustomConfiguration};
use azure_core::credentials::{Secret, TokenCredential};
use azure_core::http::headers::{Headers, RETRY_AFTER, RETRY_AFTER_MS, X_MS_RETRY_AFTER_MS};
use azure_core::http::policies::auth::BearerTokenAuthorizationPolicy;
use azure_core::http::policies::{Policy, PolicyResult, RetryHeaders};
use azure_core::http::{
    ClientOptions, Context, ExponentialRetryOptions, Method, Pipeline, PipelineOptions,
    PipelineSendOptions, Request, RetryOptions, StatusCode, Transport, Url,
};
use azure_identity::{
    ClientAssertionCredentialOptions, ClientSecretCredential, ClientSecretCredentialOptions,
    WorkloadIdentityCredential, WorkloadIdentityCredentialOptions,
};
use peerpods_provider_core::{CloudCalls, Error, ExposeSecret, Redactor, attempt_result};

use crate::answer::{self, same_origin};
use crate::settings::{AzureSettings, Credentials};
use crate::transport;

/// The `provider` label of this backend's metrics.
pub const PROVIDER: &str = "azure";

pub const COMPUTE_API: &str = "2024-07-01";
pub const DISK_API: &str = "2024-03-02";
pub const NETWORK_API: &str = "2024-05-01";

/// An ARM answer with any status: the caller decides what it means.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Headers,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// ARM's `Retry-After` (seconds or an HTTP date).
    pub fn retry_after(&self) -> Option<Duration> {
        peerpods_provider_core::http::retry_after(
            self.headers.get_optional_str(&RETRY_AFTER),
            jiff::Timestamp::now(),
        )
    }
}

/// The operation a request belongs to, carried in the pipeline's context for the call counter.
#[derive(Clone, Copy, Debug)]
struct Operation(&'static str);

/// Counts each HTTP attempt (the pipeline's retries included) in `CloudCalls`, twice: as a call
/// (a 2xx/3xx answer is `ok`, 429 `throttled`, anything else or no answer `error`) and as an
/// attempt (`cloud_api_attempts`, see [`CloudCalls::record_attempt`]). It runs once per try,
/// right above the transport, so every request ARM or Entra ID received passes it.
#[derive(Debug)]
struct CountCalls {
    calls: CloudCalls,
    /// Token requests are counted under this name, whatever request needed the token.
    fixed: Option<&'static str>,
}

#[async_trait]
impl Policy for CountCalls {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> PolicyResult {
        let operation = self
            .fixed
            .or_else(|| ctx.value::<Operation>().map(|o| o.0))
            .unwrap_or("Unknown");
        let started = std::time::Instant::now();
        let result = next[0].send(ctx, request, &next[1..]).await;
        let label = match &result {
            Ok(response) if response.status() == StatusCode::TooManyRequests => "throttled",
            Ok(response) if u16::from(response.status()) < 400 => "ok",
            _ => "error",
        };
        self.calls
            .record_timed(PROVIDER, operation, label, started.elapsed());
        // By status alone: ARM and Entra ID throttle with 429 whatever the error code, and ARM's
        // retryable "busy" answers (409 and its kin, `answer::CONFLICT_CODES`) refuse this
        // request, not its rate (`client_error`). An `Err` here is the transport's: no answer.
        let status = result.as_ref().ok().map(|r| u16::from(r.status()));
        let attempt = attempt_result(status);
        self.calls.record_attempt(PROVIDER, operation, attempt);
        if attempt != "ok" {
            tracing::debug!(operation, result = attempt, status, "Azure attempt failed");
        }
        result
    }
}

/// The ARM client.
pub struct Arm {
    pipeline: Pipeline,
    endpoint: String,
    redactor: Redactor,
}

impl std::fmt::Debug for Arm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arm")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Arm {
    /// Builds the client and its credential. Sends nothing: tokens are requested on first use.
    pub fn new(settings: &AzureSettings, calls: CloudCalls) -> Result<Self, Error> {
        let http = Arc::new(transport::http_client(settings)?);
        let retry = RetryOptions::exponential(ExponentialRetryOptions {
            initial_delay: sdk_duration(settings.retry_delay),
            max_retries: settings.max_retries,
            max_total_elapsed: sdk_duration(settings.request_timeout * (settings.max_retries + 1)),
            max_delay: azure_core::time::Duration::seconds(30),
        });
        let mut cloud = CustomConfiguration::default();
        cloud.authority_host = settings.authority_host.clone();
        let credential_options = ClientOptions {
            transport: Some(Transport::new(http.clone())),
            retry: retry.clone(),
            cloud: Some(Arc::new(CloudConfiguration::from(cloud))),
            per_try_policies: vec![Arc::new(CountCalls {
                calls: calls.clone(),
                fixed: Some("AcquireToken"),
            })],
            ..ClientOptions::default()
        };
        let credential = credential(settings, credential_options)?;
        let bearer = BearerTokenAuthorizationPolicy::new(credential, [settings.scope()]);
        let options = ClientOptions {
            transport: Some(Transport::new(http)),
            retry,
            per_try_policies: vec![Arc::new(CountCalls { calls, fixed: None })],
            ..ClientOptions::default()
        };
        let pipeline = Pipeline::new(
            option_env!("CARGO_PKG_NAME"),
            option_env!("CARGO_PKG_VERSION"),
            options,
            Vec::new(),
            vec![Arc::new(bearer)],
            Some(PipelineOptions {
                retry_headers: RetryHeaders {
                    retry_headers: vec![X_MS_RETRY_AFTER_MS, RETRY_AFTER_MS, RETRY_AFTER],
                },
                // 429 is not retried here: the caller gets `Throttled` with ARM's wait and
                // decides (peerpod-ctrl requeues), instead of a gRPC call blocked for minutes.
                retry_status_codes: vec![
                    StatusCode::RequestTimeout,
                    StatusCode::InternalServerError,
                    StatusCode::BadGateway,
                    StatusCode::ServiceUnavailable,
                    StatusCode::GatewayTimeout,
                ],
            }),
        );
        Ok(Arm {
            pipeline,
            endpoint: settings.resource_manager.clone(),
            redactor: Redactor::new(settings.secrets()),
        })
    }

    /// The absolute URL of an ARM `path` at `api_version`.
    pub fn url(&self, path: &str, api_version: &str) -> String {
        format!("{}{path}?api-version={api_version}", self.endpoint)
    }

    /// Sends one request (retried by the pipeline) and returns ARM's answer whatever its status.
    /// `what` names the call for error texts, e.g. `deleting VM vm-1`.
    pub async fn call(
        &self,
        operation: &'static str,
        method: Method,
        url: &str,
        what: &str,
    ) -> Result<Answer, Error> {
        if !same_origin(url, &self.endpoint) {
            return Err(Error::internal(format!(
                "{what}: ARM named {} to poll or page, which is not the configured endpoint {}",
                self.redactor.redact(url),
                self.endpoint
            )));
        }
        let url = Url::parse(url)
            .map_err(|e| Error::internal(format!("{what}: bad URL: {e}")).with_source(e))?;
        let mut request = Request::new(url, method);
        let ctx = Context::new().with_value(Operation(operation));
        let response = self
            .pipeline
            .send(
                &ctx,
                &mut request,
                Some(PipelineSendOptions {
                    skip_checks: true,
                    ..PipelineSendOptions::default()
                }),
            )
            .await
            .map_err(|e| answer::sdk_error(what, e, &self.redactor))?;
        let (status, headers, body) = response.deconstruct();
        Ok(Answer {
            status: u16::from(status),
            headers,
            body: body.as_ref().to_vec(),
        })
    }

    /// The error for a non-success answer.
    pub fn failure(&self, answer: &Answer, what: &str) -> Error {
        answer::arm_error(
            answer.status,
            answer.retry_after(),
            what,
            &answer.body,
            &self.redactor,
        )
    }

    /// Reads a JSON answer body.
    pub fn json<T: serde::de::DeserializeOwned>(
        &self,
        answer: &Answer,
        what: &str,
    ) -> Result<T, Error> {
        serde_json::from_slice(&answer.body).map_err(|e| {
            Error::internal(format!("{what}: unreadable ARM answer: {e}")).with_source(e)
        })
    }
}

fn sdk_duration(duration: Duration) -> azure_core::time::Duration {
    azure_core::time::Duration::milliseconds(
        i64::try_from(duration.as_millis()).unwrap_or(i64::MAX),
    )
}

fn credential(
    settings: &AzureSettings,
    client_options: ClientOptions,
) -> Result<Arc<dyn TokenCredential>, Error> {
    // No source: the credential's own error may quote the secret it was given, and only this
    // redacted text may be shown.
    let config_error = |key: &str, e: azure_core::Error| {
        Error::config(
            key.to_owned(),
            Redactor::new(settings.secrets()).redact(&e.to_string()),
        )
    };
    match &settings.credentials {
        Credentials::ClientSecret(secret) => {
            let credential = ClientSecretCredential::new(
                &settings.tenant_id,
                settings.client_id.clone(),
                Secret::new(secret.expose_secret().to_owned()),
                Some(ClientSecretCredentialOptions { client_options }),
            )
            .map_err(|e| config_error("AZURE_TENANT_ID", e))?;
            Ok(credential)
        }
        Credentials::WorkloadIdentity { token_file } => {
            let credential =
                WorkloadIdentityCredential::new(Some(WorkloadIdentityCredentialOptions {
                    credential_options: ClientAssertionCredentialOptions { client_options },
                    client_id: Some(settings.client_id.clone()),
                    tenant_id: Some(settings.tenant_id.clone()),
                    token_file_path: Some(token_file.clone()),
                }))
                .map_err(|e| config_error("AZURE_FEDERATED_TOKEN_FILE", e))?;
            Ok(credential)
        }
    }
}
