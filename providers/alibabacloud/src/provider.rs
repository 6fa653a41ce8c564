//! [`AlibabaCloudProvider`]: the [`Provider`] implementation over ECS and VPC, built from
//! cloud-api-adaptor's `ALIBABACLOUD_*`, `REGION` and `TAGS` settings.

use std::time::Duration;

use async_trait::async_trait;
use peerpods_provider_core::deletion::{Bound, window_from_config};
use peerpods_provider_core::{
    Capacity, CloudCalls, DeleteOutcome, Deleter, Error, Figure, Health, Instance, OwnerTag, Pace,
    Provider, ProviderConfig, ProviderName, TagSelector,
};

use super::answers::{self, EcsInstance};
use super::api::{Api, Service};
use super::deletion::EcsPorts;
use super::instance_id;
use super::settings::{self, Settings};

/// `DescribeInstances` pages hold at most 100 instances.
const PAGE_SIZE: &str = "100";
/// `DescribeInstances` filters on at most 20 tags; further selector tags are checked here.
const MAX_TAG_FILTERS: usize = 20;

/// Account attributes (`DescribeAccountAttributes`) behind the vCPU figures.
const MAX_VCPUS: &str = "max-postpaid-instance-vcpu-count";
const USED_VCPUS: &str = "used-postpaid-instance-vcpu-count";

/// How long `DescribeInstances` must keep not listing an instance before it counts as gone,
/// unless this process saw it older than that (`ALIBABACLOUD_NOT_FOUND_WINDOW_SECS`): ECS is
/// eventually consistent ("ECS OpenAPI eventual consistency": right after `RunInstances`,
/// `DescribeInstances` may return an empty list or `InvalidInstance.NotFound`); five minutes, as
/// for EC2.
const NOT_FOUND_WINDOW: Duration = Duration::from_secs(300);
/// The setting of [`NOT_FOUND_WINDOW`].
pub const NOT_FOUND_WINDOW_SETTING: &str = "ALIBABACLOUD_NOT_FOUND_WINDOW_SECS";

pub struct AlibabaCloudProvider {
    api: Api,
    settings: Settings,
    owner: OwnerTag,
    deleter: Deleter,
}

impl std::fmt::Debug for AlibabaCloudProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlibabaCloudProvider")
            .field("region", &self.settings.region)
            .field("ecs_endpoint", &self.settings.ecs_endpoint)
            .finish_non_exhaustive()
    }
}

impl AlibabaCloudProvider {
    /// Builds the provider from cloud-api-adaptor's `ALIBABACLOUD_*`, `REGION` and `TAGS` keys
    /// (plus the endpoint overrides), counting its calls in `calls`. Never calls the cloud.
    pub fn from_config(config: &ProviderConfig, calls: CloudCalls) -> Result<Self, Error> {
        let settings = Settings::from_config(config)
            .map_err(|problem| Error::config(problem.key.to_owned(), problem.reason))?;
        let api = Api::new(&settings, calls)?;
        let owner = OwnerTag::from_config(config)?;
        let window = window_from_config(config, NOT_FOUND_WINDOW_SETTING, NOT_FOUND_WINDOW)?;
        let deleter = Deleter::new(
            ProviderName::Alibabacloud,
            owner.guard(),
            window,
            NOT_FOUND_WINDOW_SETTING,
            Pace::every(settings.poll_interval),
        )
        .with_bound(Bound {
            within: settings.wait_timeout,
            setting: settings::WAIT_TIMEOUT_MS,
        });
        Ok(Self {
            api,
            settings,
            owner,
            deleter,
        })
    }

    /// Deletes `instance_id` by the engine's rules, waiting for ECS and VPC for at most
    /// `ALIBABACLOUD_WAIT_TIMEOUT_MS` ([`Deleter::with_bound`]): a release still running then is
    /// in progress, a refusal still standing a retryable `Unavailable` naming what ECS or VPC
    /// last said; the next call resumes it (the engine keeps what it learnt).
    async fn delete(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
        let ports = EcsPorts::new(&self.api, &self.settings.region, self.owner.required());
        self.deleter.delete(&ports, instance_id).await
    }

    /// Every instance of the region carrying the selector's tags (up to 20 filtered by ECS),
    /// page by page.
    async fn instances(&self, selector: &TagSelector) -> Result<Vec<EcsInstance>, Error> {
        let mut base = vec![
            ("RegionId".to_owned(), self.settings.region.clone()),
            ("MaxResults".to_owned(), PAGE_SIZE.to_owned()),
        ];
        for (n, (key, value)) in selector.iter().take(MAX_TAG_FILTERS).enumerate() {
            base.push((format!("Tag.{}.Key", n + 1), key.clone()));
            base.push((format!("Tag.{}.Value", n + 1), value.clone()));
        }
        let mut instances = Vec::new();
        let mut next_token: Option<String> = None;
        loop {
            let mut params = base.clone();
            if let Some(token) = &next_token {
                params.push(("NextToken".to_owned(), token.clone()));
            }
            let answer = self
                .api
                .call(Service::Ecs, "DescribeInstances", &params)
                .await
                .map_err(|f| f.into_error("DescribeInstances"))?;
            let page = answers::instances_page(&answer).map_err(Error::internal)?;
            instances.extend(page.instances);
            match page.next_token {
                Some(token) if Some(&token) != next_token.as_ref() => next_token = Some(token),
                _ => break,
            }
        }
        instances.retain(|i| selector.iter().all(|(k, v)| i.tags.get(k) == Some(v)));
        Ok(instances)
    }

    async fn account_attributes(&self) -> Result<serde_json::Value, Error> {
        self.api
            .call(
                Service::Ecs,
                "DescribeAccountAttributes",
                &[
                    ("RegionId".to_owned(), self.settings.region.clone()),
                    ("AttributeName.1".to_owned(), MAX_VCPUS.to_owned()),
                    ("AttributeName.2".to_owned(), USED_VCPUS.to_owned()),
                ],
            )
            .await
            .map_err(|f| f.into_error("DescribeAccountAttributes"))
    }
}

#[async_trait]
impl Provider for AlibabaCloudProvider {
    fn name(&self) -> ProviderName {
        ProviderName::Alibabacloud
    }

    fn validate_instance_id(&self, instance_id: &str) -> Result<(), Error> {
        match instance_id::problem(instance_id) {
            None => Ok(()),
            Some(problem) => Err(Error::invalid(
                "instance_id",
                format!("not an ECS instance id: {problem}"),
            )),
        }
    }

    async fn delete_instance(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
        self.validate_instance_id(instance_id)?;
        let outcome = self.delete(instance_id).await;
        match &outcome {
            Ok(outcome) => tracing::info!(
                instance_id,
                outcome = outcome.as_str(),
                "ECS instance deletion answered"
            ),
            Err(error) => {
                tracing::warn!(instance_id, reason = error.reason(), %error, "ECS instance deletion failed")
            }
        }
        outcome
    }

    async fn capacity(&self) -> Result<Capacity, Error> {
        let attributes = self.account_attributes().await?;
        let instances = self.instances(&self.settings.cluster_tags).await?;
        Ok(capacity_from(&attributes, &instances))
    }

    async fn list_instances(&self, selector: &TagSelector) -> Result<Vec<Instance>, Error> {
        let mut instances: Vec<Instance> = self
            .instances(selector)
            .await?
            .into_iter()
            .map(|i| Instance {
                id: i.id,
                created: i.created,
                tags: i.tags,
                name: String::new(),
            })
            .collect();
        instances.sort_by(|a, b| a.id.cmp(&b.id));
        instances.dedup_by(|a, b| a.id == b.id);
        Ok(instances)
    }

    async fn health(&self) -> Health {
        match self.account_attributes().await {
            Ok(_) => Health {
                healthy: true,
                message: format!("ECS answers in region {}", self.settings.region),
            },
            Err(error) => Health {
                healthy: false,
                message: error.to_string(),
            },
        }
    }
}

/// vCPU quota and usage of pay-as-you-go instances (account-wide in the region) from the
/// account attributes; instance count and memory in use from the cluster's instances (`TAGS`).
/// ECS reports no instance or memory quota: those limits stay unknown.
fn capacity_from(attributes: &serde_json::Value, instances: &[EcsInstance]) -> Capacity {
    Capacity {
        instances: Figure {
            limit: None,
            in_use: Some(instances.len() as u64),
        },
        vcpus: Figure {
            limit: answers::account_attribute(attributes, MAX_VCPUS),
            in_use: answers::account_attribute(attributes, USED_VCPUS),
        },
        memory_mib: Figure {
            limit: None,
            in_use: instances.iter().map(|i| i.memory_mib).sum(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn instance(id: &str, memory_mib: Option<u64>) -> EcsInstance {
        EcsInstance {
            id: id.into(),
            status: "Running".into(),
            created: None,
            tags: BTreeMap::new(),
            secondary_nics: vec![],
            vcpus: Some(2),
            memory_mib,
        }
    }

    #[test]
    fn capacity_knows_what_it_does_not_know() {
        let attributes = json!({"AccountAttributeItems": {"AccountAttributeItem": [
            {"AttributeName": MAX_VCPUS, "AttributeValues": {"ValueItem": [{"Value": "800"}]}}
        ]}});
        let capacity = capacity_from(
            &attributes,
            &[
                instance("i-aaaaaaaa", Some(4096)),
                instance("i-bbbbbbbb", Some(8192)),
            ],
        );
        assert_eq!(capacity.vcpus.limit, Some(800));
        assert_eq!(capacity.vcpus.in_use, None);
        assert_eq!(
            capacity.instances,
            Figure {
                limit: None,
                in_use: Some(2)
            }
        );
        assert_eq!(capacity.memory_mib.in_use, Some(12288));
        assert_eq!(capacity.memory_mib.limit, None);

        let unknown = capacity_from(&json!({}), &[instance("i-aaaaaaaa", None)]);
        assert_eq!(unknown.vcpus, Figure::default());
        assert_eq!(unknown.memory_mib.in_use, None);
    }
}
