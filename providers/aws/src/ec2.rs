//! The EC2 calls the provider makes, each one bounded, rate-limited, counted and classified.
//!
//! Every call goes through [`Ec2::call`]: a semaphore bounds how many are in flight, a
//! governor rate limiter keeps the provider under EC2's request limits, the shared cloud call
//! counter counts it (by operation and result),
//! and a failure becomes a [`Failure`] with secrets removed. The SDK's own retries (standard
//! mode, `AWS_MAX_ATTEMPTS`) happen inside one counted call; each of its attempts is counted too
//! (`attempts`).

use std::future::Future;
use std::num::NonZeroU32;

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_ec2::config::{Credentials, Region};
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types::{AccountAttributeName, Filter};
use aws_smithy_http_client::tls;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::Semaphore;

use super::attempts::AttemptCounter;
use super::failure::{Failure, Redactor, classify_service_error};
use super::settings::{AwsSettings, CredentialSource, NAME};
use super::web_identity::WebIdentityProvider;
use peerpods_provider_core::CloudCalls;

/// Result labels of the shared cloud call counter.
const RESULT_OK: &str = "ok";
const RESULT_ERROR: &str = "error";
const RESULT_THROTTLED: &str = "throttled";

/// EC2 accepts at most this many values in one filter.
pub const MAX_FILTER_VALUES: usize = 200;

/// Where the credentials came from, for logs (never the credentials themselves).
const STATIC_CREDENTIALS_SOURCE: &str = "peer-pods-config";

/// An Elastic IP address as `DescribeAddresses` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElasticIp {
    /// The instance it is associated with, if any.
    pub instance_id: Option<String>,
    pub allocation_id: Option<String>,
    pub association_id: Option<String>,
    pub public_ip: Option<String>,
    pub tags: Vec<(String, String)>,
}

/// An instance as `DescribeInstances` reports it.
#[derive(Clone, Debug)]
pub struct Ec2Instance {
    pub id: String,
    pub launch_time: Option<aws_sdk_ec2::primitives::DateTime>,
    pub tags: Vec<(String, String)>,
    /// `pending`, `running`, ..., `terminated`, when EC2 says.
    pub state: Option<String>,
    /// Cores × threads per core, when EC2 reports the CPU options.
    pub vcpus: Option<u64>,
}

impl Ec2Instance {
    /// Its launch time: when EC2 says it was created (the last start of a restarted instance is
    /// later than its creation, so an age from it is never too old).
    pub fn created(&self) -> Option<jiff::Timestamp> {
        let time = self.launch_time?;
        jiff::Timestamp::new(time.secs(), i32::try_from(time.subsec_nanos()).ok()?).ok()
    }
}

pub struct Ec2 {
    client: aws_sdk_ec2::Client,
    permits: Semaphore,
    limiter: DefaultDirectRateLimiter,
    calls: CloudCalls,
    redactor: Redactor,
}

/// Why no EC2 client could be built (e.g. no region anywhere).
pub struct ConnectProblem(pub String);

impl Ec2 {
    /// Builds the EC2 client from the settings: ring-based rustls (no aws-lc, no legacy hyper),
    /// with static credentials, a web identity exchanged with STS (at the endpoint override too), or
    /// else the SDK's default chain.
    pub async fn connect(
        settings: &AwsSettings,
        calls: CloudCalls,
    ) -> Result<Self, ConnectProblem> {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http)
            .retry_config(RetryConfig::standard().with_max_attempts(settings.max_attempts))
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(settings.connect_timeout)
                    .operation_timeout(settings.operation_timeout)
                    .build(),
            );
        if let Some(region) = &settings.region {
            loader = loader.region(Region::new(region.clone()));
        }
        loader = match &settings.credentials {
            CredentialSource::Static(credentials) => loader.credentials_provider(Credentials::new(
                credentials.access_key_id.clone(),
                credentials.secret_access_key.clone(),
                credentials.session_token.clone(),
                None,
                STATIC_CREDENTIALS_SOURCE,
            )),
            // Set on the EC2 client below, once the STS client can be built from the same config.
            CredentialSource::WebIdentity(_) => loader.no_credentials(),
            CredentialSource::DefaultChain => loader,
        };
        if let Some(url) = &settings.endpoint_url {
            loader = loader.endpoint_url(url.clone());
        }
        let sdk_config = loader.load().await;
        if sdk_config.region().is_none() {
            return Err(ConnectProblem(
                "AWS_REGION is not set and the default region chain found none".into(),
            ));
        }
        if settings.web_identity_ignored {
            tracing::warn!(
                "both static keys and a web identity are configured: the static keys are used"
            );
        }
        tracing::info!(
            credentials = settings.credentials.describe(),
            "EC2 client configured"
        );
        let mut ec2_config = aws_sdk_ec2::config::Builder::from(&sdk_config)
            .interceptor(AttemptCounter::new(calls.clone()));
        if let CredentialSource::WebIdentity(identity) = &settings.credentials {
            let mut sts = aws_sdk_sts::config::Builder::from(&sdk_config);
            sts.set_endpoint_url(settings.sts_endpoint_url.clone());
            ec2_config = ec2_config.credentials_provider(WebIdentityProvider::new(
                identity.clone(),
                aws_sdk_sts::Client::from_conf(sts.build()),
            ));
        }
        let per_second = NonZeroU32::new(settings.calls_per_second).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(settings.call_burst).unwrap_or(per_second);
        Ok(Self {
            client: aws_sdk_ec2::Client::from_conf(ec2_config.build()),
            permits: Semaphore::new(settings.max_concurrent_calls.max(1)),
            limiter: RateLimiter::direct(Quota::per_second(per_second).allow_burst(burst)),
            calls,
            redactor: Redactor::new(settings.secrets()),
        })
    }

    pub fn cloud_calls(&self) -> &CloudCalls {
        &self.calls
    }

    /// EC2 calls made so far for `operation`, whatever their result.
    pub fn calls_of(&self, operation: &'static str) -> u64 {
        [RESULT_OK, RESULT_ERROR, RESULT_THROTTLED]
            .into_iter()
            .map(|result| self.calls.count(NAME, operation, result))
            .sum()
    }

    /// Runs one EC2 operation under the concurrency bound and the rate limit, and counts it.
    async fn call<T, E, F, Fut>(&self, operation: &'static str, send: F) -> Result<T, Failure>
    where
        F: FnOnce(aws_sdk_ec2::Client) -> Fut,
        Fut: Future<Output = Result<T, SdkError<E>>>,
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        // The semaphore is never closed, so acquiring only fails if that ever changes; treat
        // it as an internal error rather than running unbounded.
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| Failure::Internal {
                detail: "EC2 call limiter closed".into(),
                cause: None,
            })?;
        self.limiter.until_ready().await;
        // Timed from here: the wait for a permit and the rate limiter is ours, not the cloud's.
        let started = std::time::Instant::now();
        let result = send(self.client.clone())
            .await
            .map_err(|error| self.classify(error));
        let label = match &result {
            Ok(_) => RESULT_OK,
            Err(Failure::Throttled { .. }) => RESULT_THROTTLED,
            Err(failure) => {
                tracing::debug!(operation, ?failure, "EC2 call failed");
                RESULT_ERROR
            }
        };
        self.calls
            .record_timed(NAME, operation, label, started.elapsed());
        result
    }

    fn classify<E>(&self, error: SdkError<E>) -> Failure
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let failure = match &error {
            // EC2's answer: its code and message say it all.
            SdkError::ServiceError(context) => classify_service_error(
                context.err().code(),
                context.err().message().unwrap_or_default(),
                context.raw().status().as_u16(),
            ),
            SdkError::TimeoutError(_) => Failure::Unavailable {
                detail: "EC2 did not answer in time".into(),
                cause: None,
            },
            SdkError::DispatchFailure(dispatch) => Failure::Unavailable {
                detail: match dispatch.as_connector_error() {
                    Some(connector) if connector.is_timeout() => {
                        "timed out connecting to EC2".into()
                    }
                    _ => format!("could not reach EC2: {}", DisplayErrorContext(&error)),
                },
                cause: None,
            },
            SdkError::ResponseError(_) => Failure::Unavailable {
                detail: format!(
                    "unreadable answer from EC2: {}",
                    DisplayErrorContext(&error)
                ),
                cause: None,
            },
            _ => Failure::Internal {
                detail: format!("EC2 request failed: {}", DisplayErrorContext(&error)),
                cause: None,
            },
        };
        let failure = match error {
            SdkError::ServiceError(_) => failure,
            other => failure.caused_by(other),
        };
        self.redact(failure)
    }

    fn redact(&self, failure: Failure) -> Failure {
        let r = |text: String| self.redactor.redact(&text);
        match failure {
            Failure::InstanceNotFound { message } => Failure::InstanceNotFound {
                message: r(message),
            },
            Failure::InstanceMalformed { message } => Failure::InstanceMalformed {
                message: r(message),
            },
            Failure::ResourceNotFound { code, message } => Failure::ResourceNotFound {
                code,
                message: r(message),
            },
            Failure::Throttled { retry_after } => Failure::Throttled { retry_after },
            Failure::Unavailable { detail, cause } => Failure::Unavailable {
                detail: r(detail),
                cause,
            },
            Failure::PermissionDenied { code, message } => Failure::PermissionDenied {
                code,
                message: r(message),
            },
            Failure::Refused { code, message } => Failure::Refused {
                code,
                message: r(message),
            },
            Failure::Internal { detail, cause } => Failure::Internal {
                detail: r(detail),
                cause,
            },
        }
    }

    /// `TerminateInstances`: the `(id, previous state)` of each instance EC2 accepted.
    pub async fn terminate_instances(
        &self,
        instance_ids: &[String],
    ) -> Result<Vec<(String, Option<String>)>, Failure> {
        let ids = instance_ids.to_vec();
        let output = self
            .call("TerminateInstances", |client| {
                client
                    .terminate_instances()
                    .set_instance_ids(Some(ids))
                    .send()
            })
            .await?;
        Ok(output
            .terminating_instances()
            .iter()
            .filter_map(|change| {
                let id = change.instance_id()?.to_owned();
                let previous = change
                    .previous_state()
                    .and_then(|state| state.name())
                    .map(|name| name.as_str().to_owned());
                Some((id, previous))
            })
            .collect())
    }

    /// `DescribeAddresses` with this filter (`instance-id` or `allocation-id`, at most
    /// [`MAX_FILTER_VALUES`] values): the Elastic IPs it selects. A filter never fails for an id
    /// EC2 does not know: it selects nothing.
    pub async fn describe_addresses(&self, filter: Filter) -> Result<Vec<ElasticIp>, Failure> {
        let output = self
            .call("DescribeAddresses", |client| {
                client.describe_addresses().filters(filter).send()
            })
            .await?;
        Ok(output
            .addresses()
            .iter()
            .map(|address| ElasticIp {
                instance_id: address
                    .instance_id()
                    .filter(|id| !id.is_empty())
                    .map(str::to_owned),
                allocation_id: address.allocation_id().map(str::to_owned),
                association_id: address.association_id().map(str::to_owned),
                public_ip: address.public_ip().map(str::to_owned),
                tags: address
                    .tags()
                    .iter()
                    .filter_map(|tag| Some((tag.key()?.to_owned(), tag.value()?.to_owned())))
                    .collect(),
            })
            .collect())
    }

    /// `DisassociateAddress`; an association that is already gone counts as done.
    pub async fn disassociate_address(&self, association_id: &str) -> Result<(), Failure> {
        let id = association_id.to_owned();
        let result = self
            .call("DisassociateAddress", |client| {
                client.disassociate_address().association_id(id).send()
            })
            .await;
        match result {
            Ok(_) | Err(Failure::ResourceNotFound { .. }) => Ok(()),
            Err(failure) => Err(failure),
        }
    }

    /// `ReleaseAddress` (an allocation EC2 does not know fails `ResourceNotFound`).
    pub async fn release_address(&self, allocation_id: &str) -> Result<(), Failure> {
        let id = allocation_id.to_owned();
        self.call("ReleaseAddress", |client| {
            client.release_address().allocation_id(id).send()
        })
        .await
        .map(|_| ())
    }

    /// `DescribeInstances` with these filters, every page.
    pub async fn describe_instances(
        &self,
        filters: Vec<Filter>,
    ) -> Result<Vec<Ec2Instance>, Failure> {
        let mut instances = Vec::new();
        let mut next_token: Option<String> = None;
        loop {
            let filters = filters.clone();
            let token = next_token.take();
            let output = self
                .call("DescribeInstances", |client| {
                    client
                        .describe_instances()
                        .set_filters(Some(filters))
                        .set_next_token(token)
                        .max_results(1000)
                        .send()
                })
                .await?;
            for instance in output.reservations().iter().flat_map(|r| r.instances()) {
                let Some(id) = instance.instance_id() else {
                    continue;
                };
                instances.push(Ec2Instance {
                    id: id.to_owned(),
                    state: instance
                        .state()
                        .and_then(|s| s.name())
                        .map(|n| n.as_str().to_owned()),
                    launch_time: instance.launch_time().copied(),
                    tags: instance
                        .tags()
                        .iter()
                        .filter_map(|tag| Some((tag.key()?.to_owned(), tag.value()?.to_owned())))
                        .collect(),
                    vcpus: instance.cpu_options().and_then(|cpu| {
                        let cores = u64::try_from(cpu.core_count()?).ok()?;
                        let threads = u64::try_from(cpu.threads_per_core()?).ok()?;
                        Some(cores * threads)
                    }),
                });
            }
            match output.next_token() {
                Some(token) if !token.is_empty() => next_token = Some(token.to_owned()),
                _ => return Ok(instances),
            }
        }
    }

    /// The account's `max-instances` attribute, if EC2 reports one.
    pub async fn max_instances(&self) -> Result<Option<u64>, Failure> {
        let output = self
            .call("DescribeAccountAttributes", |client| {
                client
                    .describe_account_attributes()
                    .attribute_names(AccountAttributeName::from("max-instances"))
                    .send()
            })
            .await?;
        Ok(output
            .account_attributes()
            .iter()
            .find(|attribute| attribute.attribute_name() == Some("max-instances"))
            .and_then(|attribute| attribute.attribute_values().first())
            .and_then(|value| value.attribute_value())
            .and_then(|value| value.parse().ok()))
    }
}
