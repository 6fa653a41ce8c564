//! What the VPC and PowerVS backends are made of alike (an authenticated cloud, Global Tagging
//! for an instance's user tags, the deletion engine's driver with the owner guard and the
//! not-found window) and the delete they run alike: the engine's, through each backend's ports
//! ([`Lookups`]), bounded by the delete timeout.
//!
//! Parts: none are listed. What cloud-api-adaptor creates with a VPC instance (its network
//! interfaces, its boot volume with `delete_volume_on_instance_delete`) and with a PVM instance
//! is deleted by the cloud in the instance's own deletion; a floating IP bound to a peer-pod VM
//! is an operator's reservation (cloud-api-adaptor creates none) and is never deleted.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use peerpods_provider_core::deletion::{
    Bound, DeleteAnswer, DeletionPorts, Lookup, Sighting, window_from_config,
};
use peerpods_provider_core::{
    CloudCalls, DeleteOutcome, Deleter, Error, InstanceKey, OwnerTag, Pace, ProviderConfig,
    ProviderName, Redactor,
};
use reqwest::StatusCode;

use crate::cloud::Cloud;
use crate::http::{Answer, Http};
use crate::iam::Iam;
use crate::settings::Common;
use crate::tags;

/// Which backend: the facts the shared parts need.
pub struct Kind {
    /// The `cloud_provider` name (metrics, logs).
    pub name: &'static str,
    /// The same, as the deletion engine keys instances.
    pub provider: ProviderName,
    /// The cloud in messages, e.g. `IBM Cloud VPC`.
    pub cloud: &'static str,
    /// The setting of the not-found window, and the window when it is not set.
    pub not_found_setting: &'static str,
    pub not_found_window: Duration,
}

/// The parts both backends are made of.
pub struct Backend {
    pub cloud: Cloud,
    /// Global Tagging, where an instance's user tags are read.
    tagging_url: String,
    /// The deletion engine's driver: the guard (`CLUSTER_TAG`, do-not-delete), the not-found
    /// window, the pace of lookups (`IBMCLOUD_DELETE_POLL_MS`).
    deleter: Deleter,
    kind: &'static Kind,
}

/// What the cloud shows of an instance, before its tags are read.
pub enum Shown {
    /// It is there: its CRN (where its user tags are attached), when it was created and whether
    /// the cloud shows it being deleted.
    Found {
        crn: Option<String>,
        created: Option<jiff::Timestamp>,
        deleting: bool,
    },
    /// The API does not know it (404): not yet, or no more.
    Unknown,
    /// The API says it was deleted (410).
    Deleted,
}

/// A backend's own calls for the shared delete: translations of the cloud's answers only.
#[async_trait]
pub trait Lookups: Sync {
    /// What the cloud shows of the instance.
    async fn look_up(&self, instance_id: &str) -> Result<Shown, Error>;

    /// Sends the DELETE.
    async fn request_delete(&self, instance_id: &str) -> Result<DeleteAnswer, Error>;
}

impl Backend {
    /// The parts of a `kind` backend from `config` and its settings, counting calls in `calls`.
    /// Never calls the cloud.
    pub fn new(
        config: &ProviderConfig,
        calls: CloudCalls,
        kind: &'static Kind,
        settings: &impl Common,
    ) -> Result<Self, Error> {
        let (iam, policy, tagging_url) = settings.common();
        let http = Http::new(
            kind.name,
            calls,
            Redactor::new(iam.secrets()),
            policy.clone(),
        )?;
        let window = window_from_config(config, kind.not_found_setting, kind.not_found_window)?;
        let deleter = Deleter::new(
            kind.provider,
            OwnerTag::from_config(config)?.guard(),
            window,
            kind.not_found_setting,
            Pace::every(policy.delete_poll),
        )
        .with_bound(Bound {
            within: policy.delete_timeout,
            setting: "IBMCLOUD_DELETE_TIMEOUT_SECONDS",
        });
        Ok(Backend {
            cloud: Cloud::new(http, Iam::new(iam.clone())),
            tagging_url: tagging_url.to_owned(),
            deleter,
            kind,
        })
    }

    /// Deletes the instance by the deletion engine's rules through `lookups`. Once the delete timeout (`IBMCLOUD_DELETE_TIMEOUT_SECONDS`) has
    /// passed, the next wait is not waited ([`Deleter::with_bound`]): a delete the cloud accepted
    /// is in progress, a refusal a retryable `Unavailable`; the next call resumes from what this
    /// one learnt.
    pub async fn delete(
        &self,
        lookups: &impl Lookups,
        instance_id: &str,
    ) -> Result<DeleteOutcome, Error> {
        let ports = Ports {
            backend: self,
            lookups,
            tags_while_deleting: Mutex::new(None),
        };
        let outcome = self.deleter.delete(&ports, instance_id).await;
        if let Ok(outcome) = &outcome {
            tracing::info!(
                instance_id,
                outcome = outcome.as_str(),
                "{} instance deletion answered",
                self.kind.cloud
            );
        }
        outcome
    }

    /// The user tags of the instance whose CRN is `crn` (none without one).
    async fn tags(&self, crn: Option<&str>) -> Result<BTreeMap<String, String>, Error> {
        match crn {
            Some(crn) => tags::user_tags(&self.cloud, &self.tagging_url, crn).await,
            None => Ok(BTreeMap::new()),
        }
    }
}

/// What a DELETE answered, for the engine: accepted, NotFound (404 or 410: proves nothing by
/// itself), or refused for the instance's state (409 Conflict). Any other answer is an error.
pub fn delete_answer(answer: Answer) -> DeleteAnswer {
    if answer.status == StatusCode::CONFLICT {
        DeleteAnswer::WrongState
    } else if answer.is_gone() {
        DeleteAnswer::NotFound
    } else {
        DeleteAnswer::Accepted
    }
}

/// Whether a DELETE's answer that is neither a success nor a 404/410 is one [`delete_answer`]
/// reads (rather than an error).
pub fn is_delete_answer(status: StatusCode) -> bool {
    status == StatusCode::CONFLICT
}

/// User tags, and the CRN they were read for.
type TagsOf = (Option<String>, BTreeMap<String, String>);

/// The engine's ports for one delete call: a backend's [`Lookups`] and the instance's user tags
/// with each sighting.
struct Ports<'a, L> {
    backend: &'a Backend,
    lookups: &'a L,
    /// The tags read while the cloud showed the instance being deleted, by its CRN: read once
    /// per call (a mark set during the cloud's deletion cannot stop it).
    tags_while_deleting: Mutex<Option<TagsOf>>,
}

impl<L: Lookups> Ports<'_, L> {
    async fn tags_while_deleting(
        &self,
        crn: Option<String>,
    ) -> Result<BTreeMap<String, String>, Error> {
        let known = self
            .tags_while_deleting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some((read_for, tags)) = known
            && read_for == crn
        {
            return Ok(tags);
        }
        let tags = self.backend.tags(crn.as_deref()).await?;
        *self
            .tags_while_deleting
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((crn, tags.clone()));
        Ok(tags)
    }
}

#[async_trait]
impl<L: Lookups> DeletionPorts for Ports<'_, L> {
    async fn look_up(&self, instance: &InstanceKey) -> Result<Lookup, Error> {
        Ok(match self.lookups.look_up(instance.id()).await? {
            Shown::Found {
                crn,
                created,
                deleting: false,
            } => Lookup::created(
                Sighting::Present(self.backend.tags(crn.as_deref()).await?),
                created,
            ),
            Shown::Found {
                crn,
                created,
                deleting: true,
            } => Lookup::created(
                Sighting::Deleting(self.tags_while_deleting(crn).await?),
                created,
            ),
            Shown::Unknown => Lookup::of(Sighting::NotFound),
            Shown::Deleted => Lookup::of(Sighting::Gone),
        })
    }

    async fn request_delete(&self, instance: &InstanceKey) -> Result<DeleteAnswer, Error> {
        self.lookups.request_delete(instance.id()).await
    }
}
