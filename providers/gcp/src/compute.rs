//! Every Compute Engine call, through the official client: bounded (attempt timeout, a retry
//! policy for transient failures with the SDK's exponential backoff), counted per HTTP attempt
//! in [`CloudCalls`] (calls, and attempts classified in `cloud_api_attempts`), and reduced to
//! [`Failure`] on error.

use std::future::Future;
use std::time::Duration;

use google_cloud_auth::credentials::Credentials;
use google_cloud_compute_v1::client::{Instances, Regions, ZoneOperations};
use google_cloud_compute_v1::model::{Instance, InstanceList, Operation, Region};
use google_cloud_gax::error::Error as GaxError;
use google_cloud_gax::exponential_backoff::ExponentialBackoffBuilder;
use google_cloud_gax::options::RequestOptionsBuilder;
use google_cloud_gax::retry_policy::RetryPolicy;
use google_cloud_gax::retry_result::RetryResult;
use google_cloud_gax::retry_state::RetryState;
use peerpods_provider_core::{CloudCalls, Redactor};

use crate::failure::{self, Failure};
use crate::settings::NAME;

/// Attempts per call, the first included: a transient failure is retried three times.
pub const MAX_ATTEMPTS: u32 = 4;
/// Page size asked of `instances.list` (Compute Engine's maximum).
const PAGE_SIZE: u32 = 500;

pub struct Compute {
    instances: Instances,
    operations: ZoneOperations,
    regions: Regions,
    calls: CloudCalls,
    redactor: Redactor,
    pub project: String,
    pub zone: String,
    pub region: String,
}

/// Where and as whom to call Compute Engine.
pub struct Target {
    pub project: String,
    pub zone: String,
    pub region: String,
    pub endpoint: Option<String>,
    /// How long one HTTP attempt may take.
    pub attempt_timeout: Duration,
}

impl Compute {
    /// Builds the clients; makes no call.
    pub async fn connect(
        target: Target,
        credentials: Credentials,
        redactor: Redactor,
        calls: CloudCalls,
    ) -> Result<Self, String> {
        macro_rules! client {
            ($client:ty) => {{
                let mut builder = <$client>::builder()
                    .with_credentials(credentials.clone())
                    .with_backoff_policy(
                        ExponentialBackoffBuilder::new()
                            .with_initial_delay(Duration::from_millis(200))
                            .with_maximum_delay(Duration::from_secs(5))
                            .with_scaling(2.0)
                            .clamp(),
                    )
                    .with_attempt_timeout(target.attempt_timeout);
                if let Some(endpoint) = &target.endpoint {
                    builder = builder.with_endpoint(endpoint.clone());
                }
                builder
                    .build()
                    .await
                    .map_err(|error| redactor.redact(&error.to_string()))?
            }};
        }
        Ok(Compute {
            instances: client!(Instances),
            operations: client!(ZoneOperations),
            regions: client!(Regions),
            calls,
            redactor,
            project: target.project,
            zone: target.zone,
            region: target.region,
        })
    }

    /// `instances.delete`; `request_id` makes a repeated attempt the same request to Google.
    pub async fn delete_instance(
        &self,
        name: &str,
        request_id: &str,
    ) -> Result<Operation, Failure> {
        const OP: &str = "DeleteInstance";
        self.counted(
            OP,
            self.instances
                .delete()
                .set_project(&self.project)
                .set_zone(&self.zone)
                .set_instance(name)
                .set_request_id(request_id)
                .with_retry_policy(self.retry(OP))
                .send(),
        )
        .await
    }

    /// `instances.get`.
    pub async fn get_instance(&self, name: &str) -> Result<Instance, Failure> {
        const OP: &str = "GetInstance";
        self.counted(
            OP,
            self.instances
                .get()
                .set_project(&self.project)
                .set_zone(&self.zone)
                .set_instance(name)
                .with_retry_policy(self.retry(OP))
                .send(),
        )
        .await
    }

    /// One page of `instances.list` in the zone.
    pub async fn list_instances(
        &self,
        filter: Option<&str>,
        page_token: Option<&str>,
    ) -> Result<InstanceList, Failure> {
        const OP: &str = "ListInstances";
        self.counted(
            OP,
            self.instances
                .list()
                .set_project(&self.project)
                .set_zone(&self.zone)
                .set_max_results(PAGE_SIZE)
                .set_or_clear_filter(filter)
                .set_or_clear_page_token(page_token)
                .with_retry_policy(self.retry(OP))
                .send(),
        )
        .await
    }

    /// `zoneOperations.get`.
    pub async fn get_operation(&self, name: &str) -> Result<Operation, Failure> {
        const OP: &str = "GetZoneOperation";
        self.counted(
            OP,
            self.operations
                .get()
                .set_project(&self.project)
                .set_zone(&self.zone)
                .set_operation(name)
                .with_retry_policy(self.retry(OP))
                .send(),
        )
        .await
    }

    /// `regions.get` of the zone's region (its quotas).
    pub async fn get_region(&self) -> Result<Region, Failure> {
        const OP: &str = "GetRegion";
        self.counted(
            OP,
            self.regions
                .get()
                .set_project(&self.project)
                .set_region(&self.region)
                .with_retry_policy(self.retry(OP))
                .send(),
        )
        .await
    }

    /// Calls so far of `operation` with `result` (`ok`, `error`, `throttled`).
    pub fn calls_of(&self, operation: &'static str, result: &'static str) -> u64 {
        self.calls.count(NAME, operation, result)
    }

    fn retry(&self, operation: &'static str) -> CountingRetry {
        CountingRetry {
            operation,
            calls: self.calls.clone(),
        }
    }

    /// Runs a call and counts its last attempt (the retry policy counted the earlier ones).
    async fn counted<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, GaxError>>,
    ) -> Result<T, Failure> {
        let started = std::time::Instant::now();
        let result = call
            .await
            .map_err(|error| Failure::from_sdk(error, &self.redactor));
        // Throttled by what the cloud says (a 403 can be a rate refusal), not by status alone.
        let label = match &result {
            Ok(_) => "ok",
            Err(failure) if failure.is_rate_limited() => "throttled",
            Err(_) => "error",
        };
        // The time of every attempt the SDK made, since its retries happen inside the call.
        self.calls
            .record_timed(NAME, operation, label, started.elapsed());
        // A failed attempt was counted by the retry policy, which sees each one; a call ends
        // well only in the attempt that succeeded.
        if result.is_ok() {
            self.calls.record_attempt(NAME, operation, "ok");
        }
        result
    }
}

/// The SDK retry policy of one call: transient failures ([`failure::sdk_error_is_transient`])
/// are retried up to [`MAX_ATTEMPTS`] attempts in all, and each retried attempt is counted as
/// one failed call. The SDK hands it every failed attempt, the last included, so each is
/// counted here in `cloud_api_attempts` as the cloud answered it ([`failure::attempt_result`]).
#[derive(Debug)]
struct CountingRetry {
    operation: &'static str,
    calls: CloudCalls,
}

impl RetryPolicy for CountingRetry {
    fn on_error(&self, state: &RetryState, error: GaxError) -> RetryResult {
        if let Some(result) = failure::attempt_result(&error) {
            self.calls.record_attempt(NAME, self.operation, result);
            tracing::debug!(
                operation = self.operation,
                result,
                attempt = state.attempt_count,
                "Compute Engine attempt failed"
            );
        }
        if !failure::sdk_error_is_transient(&error) {
            return RetryResult::Permanent(error);
        }
        if state.attempt_count >= MAX_ATTEMPTS {
            return RetryResult::Exhausted(error);
        }
        // This attempt ends here; the caller counts only the last one.
        self.calls.record(NAME, self.operation, "error");
        RetryResult::Continue(error)
    }
}
