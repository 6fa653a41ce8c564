//! [`GcpProvider`]: the [`Provider`] implementation over Compute Engine, built from the `GCP_*`
//! settings.

use std::time::Duration;

use async_trait::async_trait;
use google_cloud_compute_v1::model::Instance as ComputeInstance;

use peerpods_provider_core::deletion::{Bound, window_from_config};
use peerpods_provider_core::{
    Capacity, CloudCalls, DeleteOutcome, Deleter, Error, Health, Instance, OwnerTag, Pace,
    Provider, ProviderConfig, ProviderName, Redactor, TagSelector, Window,
};

use crate::compute::{Compute, Target};
use crate::pending::Pending;
use crate::settings::{self, GcpSettings};
use crate::{credentials, instance_name, labels, quota};

/// How long one deletion call may follow Compute Engine (its operation, or another deletion
/// already under way) before the caller is told to come back; the next call resumes from what
/// this one learnt.
const DELETE_TIMEOUT: Duration = Duration::from_secs(180);
/// The pause between two lookups while Compute Engine deletes an instance, refuses its delete
/// for its state, or answers it 404 (`GCP_DELETE_POLL_MS`).
const DELETE_POLL: Duration = Duration::from_secs(1);
/// The setting of [`DELETE_POLL`].
pub const DELETE_POLL_SETTING: &str = "GCP_DELETE_POLL_MS";
/// A bound on `instances.list` pages (500 instances each) against a looping page token.
const MAX_PAGES: usize = 1000;
/// How long `instances.get` must keep answering 404 before the instance counts as gone, unless
/// this process saw it older than that (`GCP_NOT_FOUND_WINDOW_SECS`). Compute Engine does not
/// document a lag after `instances.insert`, so the window only costs time on an id that never
/// existed, and guards a VM created moments ago against being released on a stale read.
const NOT_FOUND_WINDOW: Duration = Duration::from_secs(120);
/// The setting of [`NOT_FOUND_WINDOW`].
pub const NOT_FOUND_WINDOW_SETTING: &str = "GCP_NOT_FOUND_WINDOW_SECS";

pub struct GcpProvider {
    pub(crate) compute: Compute,
    /// The deletion engine's driver: the guard (`CLUSTER_TAG`, do-not-delete), the not-found
    /// window and the pace of lookups.
    deleter: Deleter,
    /// The delete operations this process started and has not seen end, by instance name.
    pub(crate) pending: Pending,
}

impl std::fmt::Debug for GcpProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GcpProvider")
            .field("project", &self.compute.project)
            .field("zone", &self.compute.zone)
            .finish_non_exhaustive()
    }
}

impl GcpProvider {
    /// Builds the provider from the `GCP_*` keys of `config`, counting its Compute Engine calls
    /// in `calls`. Makes no call to Google.
    pub async fn from_config(config: &ProviderConfig, calls: CloudCalls) -> Result<Self, Error> {
        let mut settings = GcpSettings::from_lookup(
            |key| config.get(key).map(str::to_owned),
            |path| std::fs::read_to_string(path),
        )
        .map_err(config_error)?;
        if let Some(timeout) = config.positive_duration_ms(settings::REQUEST_TIMEOUT)? {
            settings.request_timeout = timeout;
        }
        let owner = OwnerTag::from_config(config)?;
        let window = window_from_config(config, NOT_FOUND_WINDOW_SETTING, NOT_FOUND_WINDOW)?;
        let poll = config
            .positive_duration_ms(DELETE_POLL_SETTING)?
            .unwrap_or(DELETE_POLL);
        Ok(GcpProvider {
            deleter: deleter(&owner, window, poll),
            ..Self::new(settings, calls).await?
        })
    }

    /// Builds the provider from parsed settings. Makes no call to Google.
    pub async fn new(settings: GcpSettings, calls: CloudCalls) -> Result<Self, Error> {
        // The Google crates are built without a default TLS crypto provider (it would be
        // aws-lc); the workspace uses ring. Installing fails only when one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let built = credentials::build(&settings.credentials).map_err(config_error)?;
        let redactor = Redactor::new(built.secrets);
        let target = Target {
            project: settings.project_id,
            zone: settings.zone,
            region: settings.region,
            endpoint: settings.compute_endpoint,
            attempt_timeout: settings.request_timeout,
        };
        let compute = Compute::connect(target, built.credentials, redactor, calls)
            .await
            .map_err(|message| Error::config(settings::COMPUTE_ENDPOINT, message))?;
        Ok(GcpProvider {
            compute,
            deleter: deleter(&OwnerTag::default(), Window(NOT_FOUND_WINDOW), DELETE_POLL),
            pending: Pending::default(),
        })
    }

    /// Compute Engine calls this provider made so far for `operation` (e.g. `DeleteInstance`)
    /// with `result` (`ok`, `error`, `throttled`).
    pub fn api_calls(&self, operation: &'static str, result: &'static str) -> u64 {
        self.compute.calls_of(operation, result)
    }

    async fn all_instances(&self, selector: &TagSelector) -> Result<Vec<Instance>, Error> {
        let filter = labels::filter(selector);
        let mut instances = Vec::new();
        let mut page_token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let page = self
                .compute
                .list_instances(filter.as_deref(), page_token.as_deref())
                .await
                .map_err(|failure| {
                    failure.into_error(&format!("listing instances in zone {}", self.compute.zone))
                })?;
            instances.extend(
                page.items
                    .into_iter()
                    .map(domain_instance)
                    .filter(|instance| instance.matches(selector)),
            );
            match page.next_page_token.filter(|token| !token.is_empty()) {
                Some(token) => page_token = Some(token),
                None => {
                    instances.sort_by(|a, b| a.id.cmp(&b.id));
                    return Ok(instances);
                }
            }
        }
        Err(Error::internal(format!(
            "listing instances: more than {MAX_PAGES} pages"
        )))
    }
}

#[async_trait]
impl Provider for GcpProvider {
    fn name(&self) -> ProviderName {
        ProviderName::Gcp
    }

    fn validate_instance_id(&self, instance_id: &str) -> Result<(), Error> {
        match instance_name::problem(instance_id) {
            None => Ok(()),
            Some(problem) => Err(Error::invalid(
                "instance_id",
                format!("not a Compute Engine instance name: {problem}"),
            )),
        }
    }

    async fn delete_instance(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
        // The name becomes part of the URL path: never send one that is not a valid name.
        self.validate_instance_id(instance_id)?;
        let outcome = self.deleter.delete(self, instance_id).await;
        match &outcome {
            Ok(outcome) => tracing::info!(
                instance_id,
                zone = %self.compute.zone,
                outcome = outcome.as_str(),
                "Compute Engine instance deletion answered"
            ),
            Err(error) => tracing::warn!(
                instance_id,
                zone = %self.compute.zone,
                reason = error.reason(),
                %error,
                "Compute Engine instance deletion failed"
            ),
        }
        outcome
    }

    async fn capacity(&self) -> Result<Capacity, Error> {
        let region = self.compute.get_region().await.map_err(|failure| {
            failure.into_error(&format!("reading quotas of region {}", self.compute.region))
        })?;
        let quotas: Vec<quota::RegionQuota> = region
            .quotas
            .iter()
            .filter_map(|q| {
                Some(quota::RegionQuota {
                    metric: q.metric.as_ref()?.name()?.to_owned(),
                    limit: q.limit,
                    usage: q.usage,
                })
            })
            .collect();
        Ok(quota::capacity_from(&quotas))
    }

    async fn list_instances(&self, selector: &TagSelector) -> Result<Vec<Instance>, Error> {
        self.all_instances(selector).await
    }

    async fn health(&self) -> Health {
        match self.compute.get_region().await {
            Ok(_) => Health {
                healthy: true,
                message: format!(
                    "Compute Engine answers for project {} in region {}",
                    self.compute.project, self.compute.region
                ),
            },
            Err(failure) => Health {
                healthy: false,
                message: failure.into_error("reading the region").to_string(),
            },
        }
    }
}

/// The domain view of a Compute Engine instance: its name is the id CAA records.
fn domain_instance(instance: ComputeInstance) -> Instance {
    let created = created_of(&instance);
    let name = instance.name.unwrap_or_default();
    Instance {
        created,
        // On Compute Engine the name is the id.
        id: name.clone(),
        name,
        tags: instance.labels.into_iter().collect(),
    }
}

/// When Compute Engine says `instance` was created (its `creationTimestamp`, RFC 3339).
pub(crate) fn created_of(instance: &ComputeInstance) -> Option<jiff::Timestamp> {
    instance
        .creation_timestamp
        .as_deref()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
}

/// A fresh `requestId` for `instances.delete` (a UUID, as Compute Engine asks), so that an
/// attempt the SDK repeats after a lost answer is recognised as the same request.
pub(crate) fn request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The deletions of this backend: `owner`'s guard, `window`, a lookup every `poll`.
fn deleter(owner: &OwnerTag, window: Window, poll: Duration) -> Deleter {
    Deleter::new(
        ProviderName::Gcp,
        owner.guard(),
        window,
        NOT_FOUND_WINDOW_SETTING,
        Pace::every(poll),
    )
    .with_bound(Bound {
        within: DELETE_TIMEOUT,
        setting: "the backend's fixed delete bound",
    })
}

fn config_error(problem: settings::Problem) -> Error {
    Error::config(problem.key.to_owned(), problem.reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_are_named_labelled_and_dated() {
        let mut instance = ComputeInstance::new();
        instance.name = Some("podvm-a".into());
        instance.creation_timestamp = Some("2026-11-22T09:58:12.345-08:00".into());
        instance.labels = [("cluster".to_owned(), "blue".to_owned())].into();
        let domain = domain_instance(instance);
        assert_eq!(domain.id, "podvm-a");
        assert_eq!(
            domain.created,
            Some("2026-11-22T17:58:12.345Z".parse().expect("timestamp"))
        );
        assert_eq!(domain.tags.get("cluster").map(String::as_str), Some("blue"));
        assert_eq!(domain_instance(ComputeInstance::new()).created, None);
    }

    #[test]
    fn request_ids_are_unique_uuids() {
        let (a, b) = (request_id(), request_id());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
    }
}
