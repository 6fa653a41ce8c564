//! The IBM Power Virtual Server backend (`ibmcloud-powervs`): the Power Cloud API's
//! `pvm-instances` of the one workspace (cloud instance) cloud-api-adaptor is configured with.

use std::collections::BTreeMap;

use async_trait::async_trait;
use peerpods_provider_core::{
    Capacity, CloudCalls, DeleteOutcome, Error, ExposeSecret, Figure, Health, Instance, Provider,
    ProviderConfig, ProviderName, TagSelector,
};
use reqwest::Method;
use serde::Deserialize;

use crate::backend::{self, Backend, Kind, Lookups, Shown};
use crate::http::Answer;
use crate::iam::Token;
use crate::settings::PowerVsSettings;
use crate::{instance_id, tags, timestamps};
use peerpods_provider_core::deletion::DeleteAnswer;

/// The `cloud_provider` name of this backend.
pub const NAME: &str = "ibmcloud-powervs";

/// IBM Power Virtual Server instances of one workspace.
pub struct PowerVsProvider {
    backend: Backend,
    settings: PowerVsSettings,
    /// `<power endpoint>/pcloud/v1/cloud-instances/<workspace>`.
    workspace_url: String,
}

/// The not-found window: how long the Power API must keep answering 404 before an instance
/// counts as gone, unless this process saw it older than that (`POWERVS_NOT_FOUND_WINDOW_SECS`,
/// 120 s).
/// Power Virtual Server does not document a lag after a create; the window only costs time on
/// an id that never existed.
static KIND: Kind = Kind {
    name: NAME,
    provider: ProviderName::IbmcloudPowervs,
    cloud: "Power Virtual Server",
    not_found_setting: "POWERVS_NOT_FOUND_WINDOW_SECS",
    not_found_window: std::time::Duration::from_secs(120),
};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PvmInstance {
    #[serde(rename = "pvmInstanceID")]
    pvm_instance_id: String,
    #[serde(default)]
    creation_date: Option<String>,
    #[serde(default)]
    crn: Option<String>,
    /// `ACTIVE`, `BUILD`, `SHUTOFF`, `ERROR`, ..., `DELETING` while its deletion runs.
    #[serde(default)]
    status: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PvmInstances {
    #[serde(default)]
    pvm_instances: Vec<PvmInstance>,
}

/// The workspace (`GET /pcloud/v1/cloud-instances/{id}`), only its quota figures.
#[derive(Deserialize)]
struct Workspace {
    #[serde(default)]
    limits: Option<Figures>,
    #[serde(default)]
    usage: Option<Figures>,
}

/// `CloudInstanceUsageLimits`: instances, processors (may be fractional), memory in GB.
#[derive(Deserialize, Default)]
struct Figures {
    instances: Option<f64>,
    processors: Option<f64>,
    memory: Option<f64>,
}

impl PowerVsProvider {
    /// Builds the backend from the `POWERVS_*` and `IBMCLOUD_*` keys of `config`, counting its
    /// calls in `calls`. Never calls the cloud.
    pub fn from_config(config: &ProviderConfig, calls: CloudCalls) -> Result<Self, Error> {
        let settings = PowerVsSettings::from_config(config)?;
        Ok(PowerVsProvider {
            backend: Backend::new(config, calls, &KIND, &settings)?,
            workspace_url: format!(
                "{}/pcloud/v1/cloud-instances/{}",
                settings.power_url, settings.workspace_id
            ),
            settings,
        })
    }

    /// A Power API request with its bearer token and the workspace CRN header.
    fn request(&self, request: reqwest::RequestBuilder, token: &Token) -> reqwest::RequestBuilder {
        let crn = workspace_crn(
            &self.settings.power_url,
            &self.settings.zone,
            token.account.as_deref().unwrap_or_default(),
            &self.settings.workspace_id,
        );
        request
            .bearer_auth(token.bearer.expose_secret())
            .header("CRN", crn)
            .header("Accept", "application/json")
    }

    /// Calls the Power API: `method` on `url`, with the bearer token and the workspace CRN.
    async fn call(
        &self,
        operation: &'static str,
        what: &str,
        method: Method,
        url: &str,
    ) -> Result<Answer, Error> {
        self.backend
            .cloud
            .call(operation, what, |c, t| {
                self.request(c.request(method.clone(), url), t)
            })
            .await
    }

    /// The instance, or the status with which the Power API says it is not there: 404 (not
    /// known, possibly not yet) or 410 (deleted).
    async fn lookup(&self, id: &str) -> Result<Result<PvmInstance, reqwest::StatusCode>, Error> {
        let what = format!("reading PowerVS instance {id}");
        let url = format!("{}/pvm-instances/{id}", self.workspace_url);
        let answer = self
            .call("GetPvmInstance", &what, Method::GET, &url)
            .await?;
        if answer.is_gone() {
            return Ok(Err(answer.status));
        }
        answer.json(&what).map(Ok)
    }

    async fn workspace(&self) -> Result<Workspace, Error> {
        let what = "reading the PowerVS workspace";
        let answer = self
            .call("GetCloudInstance", what, Method::GET, &self.workspace_url)
            .await?;
        if answer.is_gone() {
            return Err(answer.into_error(what, &self.backend.cloud.http));
        }
        answer.json(what)
    }
}

/// The CRN of the workspace, which the Power API wants in a `CRN` header on every call, in the
/// format of IBM's Power Go client (`ibmpisession`). That client names the environment
/// `bluemix` only for hosts under `.power-iaas.cloud.ibm.com` and `staging` for every other
/// host; here only IBM's test hosts (`.test.cloud.ibm.com`) are `staging`, so that a
/// production workspace reached through a proxy or a private endpoint name keeps its CRN.
pub fn workspace_crn(power_url: &str, zone: &str, account: &str, workspace: &str) -> String {
    let service = if power_url.contains(".test.cloud.ibm.com") {
        "staging"
    } else {
        "bluemix"
    };
    format!("crn:v1:{service}:public:power-iaas:{zone}:a/{account}:{workspace}::")
}

fn whole(value: Option<f64>) -> Option<u64> {
    value
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map(|v| v.ceil() as u64)
}

/// Capacity from the workspace's limits and usage. Processors may be fractional (shared
/// cores): a started core counts as one vCPU. Memory is in GB (GiB) on the wire.
fn capacity_of(workspace: &Workspace) -> Capacity {
    let limits = workspace.limits.as_ref();
    let usage = workspace.usage.as_ref();
    let figure = |pick: fn(&Figures) -> Option<f64>, scale: f64| Figure {
        limit: whole(limits.and_then(pick).map(|v| v * scale)),
        in_use: whole(usage.and_then(pick).map(|v| v * scale)),
    };
    Capacity {
        instances: figure(|f| f.instances, 1.0),
        vcpus: figure(|f| f.processors, 1.0),
        memory_mib: figure(|f| f.memory, 1024.0),
    }
}

#[async_trait]
impl Lookups for PowerVsProvider {
    /// An instance `DELETING` is being deleted (ours or another's); any other status shows it
    /// there. 410 Gone says it was deleted.
    async fn look_up(&self, instance_id: &str) -> Result<Shown, Error> {
        Ok(match self.lookup(instance_id).await? {
            Ok(instance) => Shown::Found {
                deleting: instance.status.eq_ignore_ascii_case("DELETING"),
                created: instance
                    .creation_date
                    .as_deref()
                    .and_then(timestamps::parse),
                crn: instance.crn,
            },
            Err(reqwest::StatusCode::GONE) => Shown::Deleted,
            Err(_) => Shown::Unknown,
        })
    }

    async fn request_delete(&self, instance_id: &str) -> Result<DeleteAnswer, Error> {
        let what = format!("deleting PowerVS instance {instance_id}");
        let url = format!("{}/pvm-instances/{instance_id}", self.workspace_url);
        let answer = self
            .backend
            .cloud
            .call_answering(
                "DeletePvmInstance",
                &what,
                backend::is_delete_answer,
                |c, t| self.request(c.request(Method::DELETE, &url), t),
            )
            .await?;
        Ok(backend::delete_answer(answer))
    }
}

#[async_trait]
impl Provider for PowerVsProvider {
    fn name(&self) -> ProviderName {
        ProviderName::IbmcloudPowervs
    }

    async fn capacity(&self) -> Result<Capacity, Error> {
        Ok(capacity_of(&self.workspace().await?))
    }

    async fn list_instances(&self, selector: &TagSelector) -> Result<Vec<Instance>, Error> {
        let what = "listing PowerVS instances";
        let url = format!("{}/pvm-instances", self.workspace_url);
        let answer = self
            .call("ListPvmInstances", what, Method::GET, &url)
            .await?;
        if answer.is_gone() {
            return Err(answer.into_error(what, &self.backend.cloud.http));
        }
        let listed: PvmInstances = answer.json(what)?;
        let mut found = Vec::new();
        for instance in listed.pvm_instances {
            // Tags cost one Global Tagging call per instance: only when the selector needs them.
            let tags: BTreeMap<String, String> = match (&instance.crn, selector.is_empty()) {
                (Some(crn), false) => {
                    tags::user_tags(&self.backend.cloud, &self.settings.tagging_url, crn).await?
                }
                _ => BTreeMap::new(),
            };
            let listed = Instance {
                id: instance.pvm_instance_id,
                created: instance
                    .creation_date
                    .as_deref()
                    .and_then(timestamps::parse),
                tags,
                name: String::new(),
            };
            if listed.matches(selector) {
                found.push(listed);
            }
        }
        found.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(found)
    }

    async fn health(&self) -> Health {
        match self.workspace().await {
            Ok(_) => Health {
                healthy: true,
                message: format!(
                    "PowerVS workspace {} answers in zone {}",
                    self.settings.workspace_id, self.settings.zone
                ),
            },
            Err(error) => Health {
                healthy: false,
                message: error.to_string(),
            },
        }
    }

    fn validate_instance_id(&self, instance_id: &str) -> Result<(), Error> {
        let problem = instance_id::powervs_problem(instance_id);
        instance_id::check("a PowerVS", problem)
    }

    /// The DELETE of an instance being deleted is accepted again.
    async fn delete_instance(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
        self.validate_instance_id(instance_id)?;
        self.backend.delete(self, instance_id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crn_names_zone_account_and_workspace() {
        assert_eq!(
            workspace_crn(
                "https://us-south.power-iaas.cloud.ibm.com",
                "dal10",
                "a1",
                "w-1"
            ),
            "crn:v1:bluemix:public:power-iaas:dal10:a/a1:w-1::"
        );
        assert!(
            workspace_crn(
                "https://us-south.power-iaas.test.cloud.ibm.com",
                "dal10",
                "a1",
                "w"
            )
            .starts_with("crn:v1:staging:")
        );
    }

    #[test]
    fn capacity_rounds_shared_processors_up_and_converts_memory() {
        let workspace: Workspace = serde_json::from_str(
            r#"{"limits":{"instances":50,"memory":800,"processors":100,"storage":2000},
                "usage":{"instances":3,"memory":6,"processors":1.5,"storage":60}}"#,
        )
        .expect("workspace");
        let c = capacity_of(&workspace);
        assert_eq!(
            c.instances,
            Figure {
                limit: Some(50),
                in_use: Some(3)
            }
        );
        assert_eq!(
            c.vcpus,
            Figure {
                limit: Some(100),
                in_use: Some(2)
            }
        );
        assert_eq!(
            c.memory_mib,
            Figure {
                limit: Some(800 * 1024),
                in_use: Some(6 * 1024)
            }
        );
        let unknown = capacity_of(&Workspace {
            limits: None,
            usage: None,
        });
        assert_eq!(unknown, Capacity::default());
    }
}
