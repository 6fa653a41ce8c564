//! The IBM Cloud VPC backend (`ibmcloud`): VPC API v1 (`/v1/instances`), Global Tagging for
//! one instance's tags, Global Search to list instances with their tags.

use async_trait::async_trait;
use peerpods_provider_core::{
    Capacity, CloudCalls, DeleteOutcome, Error, ExposeSecret, Figure, Health, Instance, Provider,
    ProviderConfig, ProviderName, TagSelector,
};
use serde::Deserialize;

use crate::backend::{self, Backend, Kind, Lookups, Shown};
use crate::settings::VpcSettings;
use crate::{instance_id, search, timestamps};
use peerpods_provider_core::deletion::DeleteAnswer;

/// The `cloud_provider` name of this backend.
pub const NAME: &str = "ibmcloud";

/// The VPC API's date-based version this backend was written against (`version=`).
pub const API_VERSION: &str = "2025-04-08";

/// Instances per page of `GET /instances` (the API's maximum is 100).
const PAGE: &str = "100";

/// IBM Cloud VPC virtual server instances.
pub struct IbmCloudVpcProvider {
    backend: Backend,
    settings: VpcSettings,
}

/// The not-found window: how long the VPC API must keep answering 404 before an instance counts
/// as gone, unless this process saw it older than that (`IBMCLOUD_NOT_FOUND_WINDOW_SECS`, 120 s).
/// IBM Cloud VPC does not document a lag after `POST /instances`; the window only costs time
/// on an id that never existed.
static KIND: Kind = Kind {
    name: NAME,
    provider: ProviderName::Ibmcloud,
    cloud: "IBM Cloud VPC",
    not_found_setting: "IBMCLOUD_NOT_FOUND_WINDOW_SECS",
    not_found_window: std::time::Duration::from_secs(120),
};

#[derive(Deserialize)]
struct VpcInstance {
    #[serde(default)]
    crn: Option<String>,
    /// RFC 3339.
    #[serde(default)]
    created_at: Option<String>,
    #[serde(default)]
    status: String,
    #[serde(default)]
    vcpu: Option<Vcpu>,
    /// GiB.
    #[serde(default)]
    memory: Option<u64>,
}

#[derive(Deserialize)]
struct Vcpu {
    count: Option<u64>,
}

#[derive(Deserialize)]
struct InstanceCollection {
    #[serde(default)]
    instances: Vec<VpcInstance>,
    #[serde(default)]
    next: Option<Href>,
}

#[derive(Deserialize)]
struct Href {
    href: String,
}

impl IbmCloudVpcProvider {
    /// Builds the backend from the `IBMCLOUD_*` keys of `config`, counting its calls in `calls`.
    /// Never calls the cloud.
    pub fn from_config(config: &ProviderConfig, calls: CloudCalls) -> Result<Self, Error> {
        let settings = VpcSettings::from_config(config)?;
        let backend = Backend::new(config, calls, &KIND, &settings)?;
        Ok(IbmCloudVpcProvider { backend, settings })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.settings.vpc_url)
    }

    /// The instance, or `None` when the VPC does not know it.
    async fn instance(&self, id: &str) -> Result<Option<VpcInstance>, Error> {
        let what = format!("reading instance {id}");
        let url = self.url(&format!("/instances/{id}"));
        let answer = self
            .backend
            .cloud
            .call("GetInstance", &what, |client, token| {
                versioned(client.get(&url), token)
            })
            .await?;
        if answer.is_gone() {
            return Ok(None);
        }
        answer.json(&what).map(Some)
    }

    /// Every instance of the region, page by page.
    async fn all_instances(&self) -> Result<Vec<VpcInstance>, Error> {
        let url = self.url("/instances");
        let mut instances = Vec::new();
        let mut start: Option<String> = None;
        loop {
            let answer = self
                .backend
                .cloud
                .call("ListInstances", "listing instances", |client, token| {
                    let request = versioned(client.get(&url), token).query(&[("limit", PAGE)]);
                    match &start {
                        Some(start) => request.query(&[("start", start)]),
                        None => request,
                    }
                })
                .await?;
            if answer.is_gone() {
                return Err(answer.into_error("listing instances", &self.backend.cloud.http));
            }
            let page: InstanceCollection = answer.json("listing instances")?;
            instances.extend(page.instances);
            start = page.next.and_then(|next| start_of(&next.href));
            if start.is_none() {
                return Ok(instances);
            }
        }
    }
}

/// A VPC API request with the query parameters every call needs and the bearer token.
fn versioned(
    request: reqwest::RequestBuilder,
    token: &crate::iam::Token,
) -> reqwest::RequestBuilder {
    request
        .query(&[("version", API_VERSION), ("generation", "2")])
        .bearer_auth(token.bearer.expose_secret())
}

/// The `start` token of a collection's `next.href`.
fn start_of(href: &str) -> Option<String> {
    let url = reqwest::Url::parse(href).ok()?;
    url.query_pairs()
        .find(|(name, _)| name == "start")
        .map(|(_, value)| value.into_owned())
        .filter(|value| !value.is_empty())
}

/// Capacity from the region's instances. The VPC API publishes no quota figures, so every
/// limit is unknown; usage counts every instance of the account in the region (what a quota
/// would count), with vCPUs and memory from each instance's profile.
fn capacity_of(instances: &[VpcInstance]) -> Capacity {
    let vcpus: Option<u64> = instances
        .iter()
        .map(|i| i.vcpu.as_ref().and_then(|v| v.count))
        .sum();
    let memory: Option<u64> = instances
        .iter()
        .map(|i| i.memory.map(|gib| gib * 1024))
        .sum();
    Capacity {
        instances: Figure {
            limit: None,
            in_use: Some(instances.len() as u64),
        },
        vcpus: Figure {
            limit: None,
            in_use: vcpus,
        },
        memory_mib: Figure {
            limit: None,
            in_use: memory,
        },
    }
}

#[async_trait]
impl Provider for IbmCloudVpcProvider {
    fn name(&self) -> ProviderName {
        ProviderName::Ibmcloud
    }

    fn validate_instance_id(&self, instance_id: &str) -> Result<(), Error> {
        instance_id::check("an IBM Cloud VPC", instance_id::vpc_problem(instance_id))
    }

    /// Floating IPs bound to the instance are not released: cloud-api-adaptor creates none (its
    /// ibmcloud provider), so one bound to a peer-pod VM is an operator's reservation. Deleting
    /// the instance unbinds it, and it stays reserved for its owner. The VPC deletes the network
    /// interfaces and the boot volume (`delete_volume_on_instance_delete`) with the instance.
    async fn delete_instance(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
        self.validate_instance_id(instance_id)?;
        self.backend.delete(self, instance_id).await
    }

    async fn capacity(&self) -> Result<Capacity, Error> {
        Ok(capacity_of(&self.all_instances().await?))
    }

    /// One Global Search query (a request per page of 1000) for the region's instances with
    /// the selector's tags, rather than a Global Tagging call per instance of the region.
    async fn list_instances(&self, selector: &TagSelector) -> Result<Vec<Instance>, Error> {
        let Some(region) = self.settings.region.as_deref() else {
            return Err(Error::config(
                "IBMCLOUD_ZONE",
                "listing instances needs the VPC region: set IBMCLOUD_ZONE (e.g. us-south-1) or a regional IBMCLOUD_VPC_ENDPOINT",
            ));
        };
        search::instances(
            &self.backend.cloud,
            &self.settings.search_url,
            region,
            selector,
        )
        .await
    }

    async fn health(&self) -> Health {
        let url = self.url("/instances");
        let answer = self
            .backend
            .cloud
            .call("ListInstances", "listing instances", |client, token| {
                versioned(client.get(&url), token).query(&[("limit", "1")])
            })
            .await;
        match answer {
            Ok(answer) if answer.is_success() => Health {
                healthy: true,
                message: format!("IBM Cloud VPC answers at {}", self.settings.vpc_url),
            },
            Ok(answer) => Health {
                healthy: false,
                message: answer
                    .into_error("listing instances", &self.backend.cloud.http)
                    .to_string(),
            },
            Err(error) => Health {
                healthy: false,
                message: error.to_string(),
            },
        }
    }
}

#[async_trait]
impl Lookups for IbmCloudVpcProvider {
    /// An instance `deleting` is being deleted (ours or another's); any other status shows it
    /// there.
    async fn look_up(&self, instance_id: &str) -> Result<Shown, Error> {
        Ok(match self.instance(instance_id).await? {
            Some(instance) => Shown::Found {
                deleting: instance.status == "deleting",
                created: instance.created_at.as_deref().and_then(timestamps::parse),
                crn: instance.crn,
            },
            None => Shown::Unknown,
        })
    }

    async fn request_delete(&self, instance_id: &str) -> Result<DeleteAnswer, Error> {
        let what = format!("deleting instance {instance_id}");
        let url = self.url(&format!("/instances/{instance_id}"));
        let answer = self
            .backend
            .cloud
            .call_answering(
                "DeleteInstance",
                &what,
                backend::is_delete_answer,
                |c, t| versioned(c.delete(&url), t),
            )
            .await?;
        Ok(backend::delete_answer(answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(vcpus: Option<u64>, memory: Option<u64>) -> VpcInstance {
        VpcInstance {
            crn: None,
            created_at: None,
            status: "running".into(),
            vcpu: vcpus.map(|count| Vcpu { count: Some(count) }),
            memory,
        }
    }

    #[test]
    fn capacity_sums_profiles_and_leaves_limits_unknown() {
        let c = capacity_of(&[instance(Some(2), Some(8)), instance(Some(4), Some(16))]);
        assert_eq!(
            c.instances,
            Figure {
                limit: None,
                in_use: Some(2)
            }
        );
        assert_eq!(c.vcpus.in_use, Some(6));
        assert_eq!(c.memory_mib.in_use, Some(24 * 1024));
        let unknown = capacity_of(&[instance(None, Some(8))]);
        assert_eq!(unknown.vcpus.in_use, None);
    }

    #[test]
    fn next_page_token_is_read_from_the_href() {
        assert_eq!(
            start_of(
                "https://us-south.iaas.cloud.ibm.com/v1/instances?limit=20&start=9d5a91a3e2cbd233b5a5b33436855ed1"
            ),
            Some("9d5a91a3e2cbd233b5a5b33436855ed1".into())
        );
        assert_eq!(start_of("https://x/v1/instances?limit=20"), None);
        assert_eq!(start_of("not a url"), None);
    }

    #[test]
    fn instances_parse_from_the_api_shape() {
        let parsed: VpcInstance = serde_json::from_str(
            r#"{"id":"0717_1","crn":"crn:v1:x","status":"deleting","vcpu":{"architecture":"amd64","count":2},"memory":8,
               "primary_network_interface":{"id":"0717-nic1"},"network_interfaces":[{"id":"0717-nic1"},{"id":"0717-nic2"}]}"#,
        )
        .expect("instance");
        assert_eq!(parsed.status, "deleting");
        assert_eq!(parsed.vcpu.and_then(|v| v.count), Some(2));
    }
}
