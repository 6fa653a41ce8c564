//! What the VPC and PowerVS backends are made of alike (an authenticated cloud, the owner tag
//! checked before every delete, the window after which a 404 proves an instance gone) and the
//! delete they run alike; each backend brings its lookup and its DELETE ([`Instances`]).

use std::time::{Duration, Instant};

use async_trait::async_trait;
use peerpods_provider_core::{
    CloudCalls, DeleteOutcome, Error, NotFoundWindow, OwnerTag, ProviderConfig, Redactor,
};

use crate::cloud::Cloud;
use crate::delete;
use crate::http::Http;
use crate::iam::Iam;
use crate::settings::Common;

/// Which backend: the facts the shared parts need.
pub struct Kind {
    /// The `cloud_provider` name (metrics, logs).
    pub name: &'static str,
    /// The cloud in messages, e.g. `IBM Cloud VPC`.
    pub cloud: &'static str,
    /// The setting of the not-found window, and the window when it is not set.
    pub not_found_setting: &'static str,
    pub not_found_window: Duration,
}

/// The parts both backends are made of.
pub struct Backend {
    pub cloud: Cloud,
    /// Global Tagging, where the owner check reads an instance's user tags.
    tagging_url: String,
    /// `CLUSTER_TAG` / `DELETE_UNTAGGED`, checked with do-not-delete before every delete.
    owner: OwnerTag,
    /// When a 404 of an instance proves it gone (see `NotFoundWindow`).
    not_found: NotFoundWindow,
    kind: &'static Kind,
}

/// What the cloud says of an instance before its delete.
pub enum Lookup {
    /// It is there: its CRN (where its user tags are attached) and whether its deletion is
    /// already under way (the DELETE is not sent again).
    Found { crn: Option<String>, deleting: bool },
    /// The API does not know it (404): not yet, or no more.
    Unknown,
    /// The API says it was deleted (410).
    Deleted,
}

/// A backend's own calls for the shared delete.
#[async_trait]
pub trait Instances: Sync {
    /// What the cloud says of the instance.
    async fn look_up(&self, instance_id: &str) -> Result<Lookup, Error>;

    /// Sends the DELETE (`what` names it); `true` when the API answers the instance is gone.
    async fn send_delete(&self, instance_id: &str, what: &str) -> Result<bool, Error>;
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
        Ok(Backend {
            cloud: Cloud::new(http, Iam::new(iam.clone())),
            tagging_url: tagging_url.to_owned(),
            owner: OwnerTag::from_config(config)?,
            not_found: NotFoundWindow::from_config(
                config,
                kind.cloud,
                kind.not_found_setting,
                kind.not_found_window,
            )?,
            kind,
        })
    }

    /// Deletes the instance (`what` names the delete in messages): a 404 is believed only after
    /// this process's own accepted delete or once it persisted; the owner check on its user
    /// tags comes before the DELETE; deleted only once a later lookup finds it gone (what it
    /// owns goes with it).
    pub async fn delete(
        &self,
        instances: &impl Instances,
        instance_id: &str,
        what: &str,
    ) -> Result<DeleteOutcome, Error> {
        let (crn, deleting) = match instances.look_up(instance_id).await? {
            Lookup::Found { crn, deleting } => (crn, deleting),
            Lookup::Deleted => return Ok(DeleteOutcome::AlreadyGone),
            Lookup::Unknown => return self.not_found.answer(instance_id, Instant::now()),
        };
        self.not_found.found(instance_id);
        // Its user tags by the CRN the lookup gave.
        delete::check_owner(
            &self.cloud,
            &self.tagging_url,
            &self.owner,
            instance_id,
            crn.as_deref(),
        )
        .await?;
        if !deleting && instances.send_delete(instance_id, what).await? {
            return Ok(DeleteOutcome::AlreadyGone);
        }
        // Accepted now or before: a later 404 confirms it. The next call follows a deletion
        // still running at the bound.
        self.not_found.delete_accepted(instance_id, Instant::now());
        delete::confirm_gone(self.cloud.http.policy(), what, || async {
            let found = instances.look_up(instance_id).await?;
            Ok(!matches!(found, Lookup::Found { .. }))
        })
        .await?;
        tracing::info!(
            instance_id,
            "{} instance deleted and confirmed gone",
            self.kind.cloud
        );
        Ok(DeleteOutcome::Deleted)
    }
}
