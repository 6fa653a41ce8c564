//! The Google Cloud backend: Compute Engine through the official `google-cloud-compute-v1`
//! client, with `google-cloud-auth` credentials.
//!
//! - [`GcpProvider`]: the [`Provider`] implementation; the only public entry.
//! - `settings`: configuration keys (cloud-api-adaptor's names) → [`GcpSettings`].
//! - `credentials`: a service-account key (or another credentials file) or application
//!   default credentials → `google-cloud-auth` credentials.
//! - `instance_name`: syntax of the instance id (the instance name).
//! - `operation`, `quota`, `labels`: pure readings of zone operations, region quotas and the
//!   label filter of `instances.list`.
//! - `compute`: every Compute Engine call, bounded, retried, counted; `failure`: what an
//!   error answer means.

mod compute;
mod credentials;
mod failure;
mod instance_name;
mod labels;
mod operation;
mod quota;
mod settings;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use google_cloud_compute_v1::model::Instance as ComputeInstance;
use google_cloud_compute_v1::model::instance::Status as InstanceStatus;

pub use settings::{CredentialSource, GcpSettings};

use compute::{Compute, Target};
use failure::Failure;
use operation::Progress;
use peerpods_provider_core::{
    Capacity, CloudCalls, DeleteOutcome, Error, Health, Instance, NotFoundWindow, OwnerTag,
    Provider, ProviderConfig, ProviderName, Redactor, TagSelector,
};

/// The `cloud_provider` name of this backend.
pub const NAME: &str = "gcp";

/// How long a deletion may wait for Compute Engine to finish (its operation, or another
/// deletion already under way) before the caller is told to come back.
const DELETE_TIMEOUT: Duration = Duration::from_secs(180);
/// First and longest pause between two polls of an operation or of a disappearing instance.
const POLL_FIRST: Duration = Duration::from_millis(250);
const POLL_MAX: Duration = Duration::from_secs(5);
/// A bound on `instances.list` pages (500 instances each) against a looping page token.
const MAX_PAGES: usize = 1000;
/// How long `instances.get` must keep answering 404 for an instance this process never saw
/// deleted before it counts as gone (`GCP_NOT_FOUND_WINDOW_SECS`). Compute Engine does not
/// document a lag after `instances.insert`, so the window only costs time on an id that never
/// existed, and guards a VM created moments ago against being released on a stale read.
const NOT_FOUND_WINDOW: Duration = Duration::from_secs(120);
/// The setting of [`NOT_FOUND_WINDOW`].
pub const NOT_FOUND_WINDOW_SETTING: &str = "GCP_NOT_FOUND_WINDOW_SECS";

pub struct GcpProvider {
    compute: Compute,
    delete_timeout: Duration,
    /// With `CLUSTER_TAG`, only instances carrying that label are deleted.
    owner: OwnerTag,
    /// When a 404 proves an instance gone (see `NotFoundWindow`).
    not_found: NotFoundWindow,
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
        let not_found = NotFoundWindow::from_config(
            config,
            "Compute Engine",
            NOT_FOUND_WINDOW_SETTING,
            NOT_FOUND_WINDOW,
        )?;
        Ok(GcpProvider {
            owner,
            not_found,
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
            delete_timeout: DELETE_TIMEOUT,
            owner: OwnerTag::default(),
            not_found: NotFoundWindow::new(
                "Compute Engine",
                NOT_FOUND_WINDOW_SETTING,
                NOT_FOUND_WINDOW,
            ),
        })
    }

    /// Compute Engine calls this provider made so far for `operation` (e.g. `DeleteInstance`)
    /// with `result` (`ok`, `error`, `throttled`).
    pub fn api_calls(&self, operation: &'static str, result: &'static str) -> u64 {
        self.compute.calls_of(operation, result)
    }

    /// Deletes the instance and waits until Compute Engine reports it gone.
    async fn delete(&self, name: &str) -> Result<DeleteOutcome, Error> {
        let what = format!("deleting instance {name}");
        // Its labels first, on every configuration: an instance labelled do-not-delete is never
        // deleted, and with a cluster tag another cluster's (or an unlabelled) one is not ours.
        // The one lookup before the DELETE; it also answers for an instance already gone.
        let labels: BTreeMap<String, String> = match self.compute.get_instance(name).await {
            Ok(instance) => {
                self.not_found.found(name);
                instance.labels.into_iter().collect()
            }
            // Believed only after this process's own accepted delete, or once it persisted.
            Err(failure) if failure.is_not_found() => {
                return self.not_found.answer(name, std::time::Instant::now());
            }
            Err(failure) => return Err(failure.into_error(&format!("reading instance {name}"))),
        };
        self.owner.check(name, &labels)?;
        let deadline = tokio::time::Instant::now() + self.delete_timeout;
        let mut request = request_id();
        let mut pause = Pauses::new();
        // Set once another operation was seen holding the instance (e.g. a deletion under way).
        let mut was_busy = false;
        loop {
            let operation = match self.compute.delete_instance(name, &request).await {
                Ok(operation) => {
                    self.not_found
                        .delete_accepted(name, std::time::Instant::now());
                    operation
                }
                Err(failure) if failure.is_not_found() => {
                    return Ok(if was_busy {
                        DeleteOutcome::Deleted
                    } else {
                        DeleteOutcome::AlreadyGone
                    });
                }
                Err(failure) if failure.is_not_ready() => {
                    was_busy = true;
                    if self.wait_while_stopping(name, deadline, &mut pause).await? {
                        return Ok(DeleteOutcome::Deleted);
                    }
                    // Busy with something else (e.g. still being created): delete again.
                    continue;
                }
                Err(failure) => return Err(failure.into_error(&what)),
            };
            match self.wait_for(operation, deadline, &what).await? {
                OperationEnd::Finished(outcome) => return Ok(outcome),
                // Accepted, then refused when it ran: another operation held the instance.
                OperationEnd::NotReady => {
                    was_busy = true;
                    if self.wait_while_stopping(name, deadline, &mut pause).await? {
                        return Ok(DeleteOutcome::Deleted);
                    }
                    // That request is over: the next attempt is a new request, else Compute
                    // Engine would answer the failed operation again for its requestId.
                    request = request_id();
                }
            }
        }
    }

    /// Polls the delete operation until DONE.
    async fn wait_for(
        &self,
        mut operation: google_cloud_compute_v1::model::Operation,
        deadline: tokio::time::Instant,
        what: &str,
    ) -> Result<OperationEnd, Error> {
        let mut pause = Pauses::new();
        loop {
            match operation::progress(&operation) {
                Progress::Done => return Ok(OperationEnd::Finished(DeleteOutcome::Deleted)),
                Progress::Failed {
                    status,
                    codes,
                    message,
                } => {
                    if operation::failed_as_not_found(status, &message) {
                        return Ok(OperationEnd::Finished(DeleteOutcome::AlreadyGone));
                    }
                    // The codes say what happened; the status alone would make a busy
                    // instance INTERNAL and a rate refusal a missing permission.
                    let failure = Failure {
                        status: status.or(Some(500)),
                        retry_after: None,
                        reasons: codes,
                        message: format!("the operation failed: {message}"),
                        credentials: None,
                        transport: None,
                    };
                    if failure.is_not_ready() {
                        return Ok(OperationEnd::NotReady);
                    }
                    return Err(failure.into_error(what));
                }
                Progress::Running => {}
            }
            let Some(name) = operation.name.clone() else {
                return Err(Error::internal(format!(
                    "{what}: Compute Engine returned an operation without a name"
                )));
            };
            pause.sleep_before(deadline).await.map_err(|()| {
                Error::unavailable(format!(
                    "{what}: operation {name} still running after {}s",
                    self.delete_timeout.as_secs()
                ))
            })?;
            operation = self
                .compute
                .get_operation(&name)
                .await
                .map_err(|failure| failure.into_error(what))?;
        }
    }

    /// While another operation holds the instance: `true` once it is gone, `false` as soon as
    /// it is not stopping (so deleting it again may now be accepted).
    async fn wait_while_stopping(
        &self,
        name: &str,
        deadline: tokio::time::Instant,
        pause: &mut Pauses,
    ) -> Result<bool, Error> {
        let what = format!("waiting for instance {name} to be deleted");
        loop {
            pause.sleep_before(deadline).await.map_err(|()| {
                Error::unavailable(format!(
                    "{what}: still there after {}s",
                    self.delete_timeout.as_secs()
                ))
            })?;
            match self.compute.get_instance(name).await {
                Err(failure) if failure.is_not_found() => return Ok(true),
                Err(failure) => return Err(failure.into_error(&what)),
                Ok(instance) if instance.status == Some(InstanceStatus::Stopping) => {}
                Ok(_) => return Ok(false),
            }
        }
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
        let outcome = self.delete(instance_id).await;
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

/// How a deletion's operation ended.
enum OperationEnd {
    /// DONE: deleted, or the instance was found gone.
    Finished(DeleteOutcome),
    /// DONE with `RESOURCE_NOT_READY`: another operation held the instance; nothing was deleted.
    NotReady,
}

/// The domain view of a Compute Engine instance: its name is the id CAA records.
fn domain_instance(instance: ComputeInstance) -> Instance {
    Instance {
        created: instance
            .creation_timestamp
            .as_deref()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok()),
        id: instance.name.unwrap_or_default(),
        tags: instance.labels.into_iter().collect(),
    }
}

/// A fresh `requestId` for `instances.delete` (a UUID, as Compute Engine asks), so that an
/// attempt the SDK repeats after a lost answer is recognised as the same request.
fn request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn config_error(problem: settings::Problem) -> Error {
    Error::config(problem.key.to_owned(), problem.reason)
}

/// Growing pauses between polls, never past a deadline.
struct Pauses {
    next: Duration,
    max: Duration,
}

impl Pauses {
    fn new() -> Self {
        Self::growing(POLL_FIRST, POLL_MAX)
    }

    fn growing(first: Duration, max: Duration) -> Self {
        Pauses { next: first, max }
    }

    /// Sleeps the next pause; `Err` when that would pass `deadline`.
    async fn sleep_before(&mut self, deadline: tokio::time::Instant) -> Result<(), ()> {
        let pause = self.next;
        if tokio::time::Instant::now() + pause > deadline {
            return Err(());
        }
        self.next = (self.next * 2).min(self.max);
        tokio::time::sleep(pause).await;
        Ok(())
    }
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

    #[tokio::test]
    async fn pauses_grow_and_stop_at_the_deadline() {
        let start = tokio::time::Instant::now();
        let mut pauses = Pauses::growing(Duration::from_millis(10), Duration::from_secs(1));
        let deadline = start + Duration::from_millis(450);
        let mut slept = 0;
        while pauses.sleep_before(deadline).await.is_ok() {
            slept += 1;
        }
        // 10 + 20 + 40 + 80 + 160 = 310 ms fit in 450 ms; the next 320 ms pause would not.
        assert_eq!(slept, 5);
        assert!(tokio::time::Instant::now() <= deadline);
    }

    #[test]
    fn request_ids_are_unique_uuids() {
        let (a, b) = (request_id(), request_id());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
    }
}
