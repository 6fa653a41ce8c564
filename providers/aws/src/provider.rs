//! [`AwsProvider`]: the [`Provider`] implementation over EC2, built from the `AWS_*` settings.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_ec2::types::Filter;

use peerpods_provider_core::{
    CallBudget, Capacity, CloudCalls, DeleteOutcome, Deleter, Error, Figure, Health, Instance,
    OwnerTag, Pace, Provider, ProviderConfig, ProviderName, TagSelector, Window,
};

use super::batch::BatchPolicy;
use super::ec2::{Ec2, Ec2Instance};
use super::failure::{Failure, into_error};
use super::instance_id;
use super::ports::{Calls, Ec2Ports};
use super::settings::{self, AwsSettings};

/// Instance states of instances that still exist: everything but `terminated`.
const LIVE_STATES: [&str; 5] = ["pending", "running", "shutting-down", "stopping", "stopped"];

pub struct AwsProvider {
    ec2: Arc<Ec2>,
    /// The batched calls the deletion ports make.
    calls: Calls,
    /// The deletion engine's driver: guard, consistency window, pace.
    deleter: Deleter,
    cluster_tags: BTreeMap<String, String>,
    region: String,
    batch: BatchPolicy,
}

/// The call budget of a backend batching its deletions' calls by `batch`.
fn call_budget(batch: &BatchPolicy) -> CallBudget {
    CallBudget {
        deletes: batch.max_ids,
        ..CallBudget::default()
    }
}

impl AwsProvider {
    /// Builds the provider from the `AWS_*` keys of `config`, counting its EC2 calls in `calls`.
    /// Must run inside a tokio runtime: it starts the tasks that batch the deletions' calls.
    pub async fn from_config(config: &ProviderConfig, calls: CloudCalls) -> Result<Self, Error> {
        let settings = AwsSettings::from_config(config)
            .map_err(|problem| Error::config(problem.key, problem.reason))?;
        Self::new(settings, calls).await
    }

    /// Builds the provider from parsed settings, counting its EC2 calls in `calls`.
    pub async fn new(settings: AwsSettings, calls: CloudCalls) -> Result<Self, Error> {
        let ec2 = Ec2::connect(&settings, calls)
            .await
            .map_err(|problem| Error::config("AWS_REGION", problem.0))?;
        let ec2 = Arc::new(ec2);
        Ok(Self {
            calls: Calls::spawn(
                Arc::clone(&ec2),
                settings.batch,
                settings.cluster_tags.clone(),
            ),
            deleter: Deleter::new(
                ProviderName::Aws,
                OwnerTag::requiring(settings.owner_tag).guard(),
                Window(settings.not_found_window),
                settings::NOT_FOUND_WINDOW_SETTING,
                Pace::every(settings.delete_poll).looking_first_after(settings.delete_first_look),
            ),
            ec2,
            cluster_tags: settings.cluster_tags,
            region: settings.region.unwrap_or_default(),
            batch: settings.batch,
        })
    }

    /// EC2 API calls this provider made so far for `operation` (e.g. `TerminateInstances`).
    pub fn api_calls(&self, operation: &'static str) -> u64 {
        self.ec2.calls_of(operation)
    }

    async fn live_instances(&self, selector: &TagSelector) -> Result<Vec<Ec2Instance>, Error> {
        let mut filters: Vec<Filter> = selector
            .iter()
            .map(|(key, value)| {
                Filter::builder()
                    .name(format!("tag:{key}"))
                    .values(value.clone())
                    .build()
            })
            .collect();
        filters.push(
            Filter::builder()
                .name("instance-state-name")
                .set_values(Some(LIVE_STATES.iter().map(|s| (*s).to_owned()).collect()))
                .build(),
        );
        self.ec2
            .describe_instances(filters)
            .await
            .map_err(into_error)
    }
}

#[async_trait]
impl Provider for AwsProvider {
    fn name(&self) -> ProviderName {
        ProviderName::Aws
    }

    fn validate_instance_id(&self, instance_id: &str) -> Result<(), Error> {
        match instance_id::problem(instance_id) {
            None => Ok(()),
            Some(problem) => Err(Error::invalid(
                "instance_id",
                format!("not an EC2 instance id: {problem}"),
            )),
        }
    }

    /// As many deletes ask at once as one batch carries: the batches, the bound on EC2 calls in
    /// flight (`AWS_MAX_CONCURRENT_CALLS`) and the rate limit bound what EC2 sees, where 32
    /// deletes at once would cap every batch at 32 ids.
    fn call_budget(&self) -> CallBudget {
        call_budget(&self.batch)
    }

    async fn delete_instance(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
        // Callers should have validated already; a malformed id in a batch would cost every
        // other id in it an extra call, so it never gets that far.
        self.validate_instance_id(instance_id)?;
        let outcome = self
            .deleter
            .delete(&Ec2Ports::new(&self.calls), instance_id)
            .await;
        match &outcome {
            Ok(outcome) => tracing::info!(
                instance_id,
                outcome = outcome.as_str(),
                "EC2 instance deletion answered"
            ),
            Err(error) => {
                tracing::warn!(instance_id, reason = error.reason(), %error, "EC2 instance deletion failed")
            }
        }
        outcome
    }

    async fn capacity(&self) -> Result<Capacity, Error> {
        let limit = match self.ec2.max_instances().await {
            Ok(limit) => limit,
            // Without permission to read account attributes the limit is unknown, not an error.
            Err(Failure::PermissionDenied { code, .. }) => {
                tracing::warn!(code, "cannot read the EC2 instance limit");
                None
            }
            Err(failure) => return Err(into_error(failure)),
        };
        let instances = self.live_instances(&self.cluster_tags).await?;
        Ok(capacity_from(limit, &instances))
    }

    async fn list_instances(&self, selector: &TagSelector) -> Result<Vec<Instance>, Error> {
        let mut instances: Vec<Instance> = self
            .live_instances(selector)
            .await?
            .into_iter()
            .map(|instance| {
                let created = instance.created();
                let tags: BTreeMap<String, String> = instance.tags.into_iter().collect();
                Instance {
                    created,
                    id: instance.id,
                    // cloud-api-adaptor names its EC2 instances by the `Name` tag.
                    name: tags.get("Name").cloned().unwrap_or_default(),
                    tags,
                }
            })
            .collect();
        instances.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(instances)
    }

    async fn health(&self) -> Health {
        match self.ec2.max_instances().await {
            Ok(_) => Health {
                healthy: true,
                message: format!("EC2 answers in region {}", self.region),
            },
            Err(failure) => Health {
                healthy: false,
                message: into_error(failure).to_string(),
            },
        }
    }
}

/// Capacity from the account's instance limit and the cluster's live instances. The vCPU
/// quota lives in Service Quotas, which this backend does not call: it stays unknown, as does
/// memory, which EC2 does not report per instance.
fn capacity_from(instance_limit: Option<u64>, instances: &[Ec2Instance]) -> Capacity {
    let vcpus_in_use = instances
        .iter()
        .map(|instance| instance.vcpus)
        .sum::<Option<u64>>();
    Capacity {
        instances: Figure {
            limit: instance_limit,
            in_use: Some(instances.len() as u64),
        },
        vcpus: Figure {
            limit: None,
            in_use: vcpus_in_use,
        },
        memory_mib: Figure::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(id: &str, vcpus: Option<u64>) -> Ec2Instance {
        Ec2Instance {
            id: id.into(),
            state: Some("running".into()),
            launch_time: None,
            tags: vec![],
            vcpus,
        }
    }

    #[test]
    fn capacity_counts_instances_and_knows_what_it_does_not_know() {
        let capacity = capacity_from(
            Some(20),
            &[
                instance("i-0000000a", Some(2)),
                instance("i-0000000b", Some(4)),
            ],
        );
        assert_eq!(capacity.instances.limit, Some(20));
        assert_eq!(capacity.instances.in_use, Some(2));
        assert_eq!(capacity.vcpus.in_use, Some(6));
        assert_eq!(capacity.vcpus.limit, None);
        assert_eq!(capacity.memory_mib, Figure::default());

        let partly_unknown = capacity_from(None, &[instance("i-0000000a", None)]);
        assert_eq!(partly_unknown.instances.limit, None);
        assert_eq!(partly_unknown.vcpus.in_use, None);
    }

    #[test]
    fn as_many_deletes_ask_at_once_as_a_batch_carries() {
        let batch = BatchPolicy::default();
        let budget = call_budget(&batch);
        assert_eq!(budget.deletes, batch.max_ids);
        assert!(budget.deletes > CallBudget::default().deletes);
        assert_eq!(budget.reads, CallBudget::default().reads);
    }

    /// A real transport failure of the real SDK: nothing listens where EC2 should be. The caller
    /// is told EC2 is unavailable, and the error's chain reaches the socket's refusal.
    #[tokio::test]
    async fn an_unreachable_ec2_keeps_the_sdk_error_down_to_the_socket() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let endpoint = format!("http://{}", closed.local_addr().expect("its address"));
        drop(closed);
        let config = ProviderConfig::from_pairs([
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "secret-value-1234"),
            ("AWS_ENDPOINT_URL", endpoint.as_str()),
            ("AWS_MAX_ATTEMPTS", "1"),
        ]);
        let provider = AwsProvider::from_config(&config, CloudCalls::default())
            .await
            .expect("valid settings");

        let error = provider
            .list_instances(&TagSelector::new())
            .await
            .expect_err("nothing listens");

        assert_eq!(error.reason(), "CloudUnavailable", "{error}");
        assert!(error.to_string().contains("could not reach EC2"), "{error}");
        let refused = std::iter::successors(std::error::Error::source(&error), |e| e.source())
            .find_map(|e| e.downcast_ref::<std::io::Error>())
            .expect("the chain reaches the socket's error");
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    }
}
