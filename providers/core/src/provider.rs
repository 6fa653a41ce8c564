//! The domain layer: what a cloud backend must do, in domain types only (never prost types).
//!
//! provider-service's gRPC layer validates input, picks a [`Provider`] by the caller's
//! `cloud_provider` and converts the answer. One crate per cloud implements [`Provider`].

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;

use crate::{Error, ProviderName};

/// Tags an instance must carry, each with exactly this value. Empty matches every instance.
pub type TagSelector = BTreeMap<String, String>;

/// What deleting an instance did, as the deletion engine judged it ([`crate::deletion`]).
/// `Deleted` and `AlreadyGone` are success (gone is never an error); `NotYetVisible` and
/// `InProgress` are waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeleteOutcome {
    /// The instance existed and is confirmed gone, with its own parts.
    Deleted,
    /// The instance did not exist (any more), confirmed past the consistency window.
    AlreadyGone,
    /// The cloud has not shown the instance for `unknown_for`, less than its consistency window
    /// `window` (set by the configuration key `setting`): it may be a new instance the cloud
    /// does not show everywhere yet. Not gone, not a failure: ask again later.
    NotYetVisible {
        unknown_for: Duration,
        window: Duration,
        setting: &'static str,
    },
    /// The cloud accepted the delete (or shows the instance being deleted) and has not
    /// confirmed it gone within the backend's bound: not gone, not a failure; ask again later,
    /// and the next call resumes.
    InProgress,
}

impl DeleteOutcome {
    /// Stable label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            DeleteOutcome::Deleted => "deleted",
            DeleteOutcome::AlreadyGone => "already_gone",
            DeleteOutcome::NotYetVisible { .. } => "not_yet_visible",
            DeleteOutcome::InProgress => "in_progress",
        }
    }

    /// Whether the instance is confirmed gone.
    pub fn is_gone(self) -> bool {
        matches!(self, DeleteOutcome::Deleted | DeleteOutcome::AlreadyGone)
    }
}

/// A limit and a usage of one resource; `None` means the cloud cannot tell (unknown, not zero).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figure {
    pub limit: Option<u64>,
    pub in_use: Option<u64>,
}

/// Capacity figures of one provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capacity {
    /// Number of instances (VMs).
    pub instances: Figure,
    /// Virtual CPUs.
    pub vcpus: Figure,
    /// Memory in MiB.
    pub memory_mib: Figure,
}

/// One cloud instance as [`Provider::list_instances`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// Id in the provider's format, as [`Provider::delete_instance`] accepts it.
    pub id: String,
    /// Creation time, when the cloud records one.
    pub created: Option<jiff::Timestamp>,
    /// Tags (labels) of the instance.
    pub tags: BTreeMap<String, String>,
    /// The name the cloud shows, where cloud-api-adaptor keeps its pod VM name; empty when unknown.
    pub name: String,
}

impl Instance {
    /// Whether the instance carries every tag of `selector` with the same value.
    pub fn matches(&self, selector: &TagSelector) -> bool {
        selector.iter().all(|(k, v)| self.tags.get(k) == Some(v))
    }
}

/// Result of a provider's own health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub healthy: bool,
    /// Why it is (un)healthy; never contains credentials.
    pub message: String,
}

/// How many calls of each kind may run against one backend at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallBudget {
    /// Deletes asking the cloud at most (a delete waiting between two asks holds none).
    pub deletes: usize,
    /// Capacity, listing and health calls in flight at most. Answers of capacity and health are
    /// cached above the backend, so few reach it; listings are rare (orphan scans).
    pub reads: usize,
}

impl Default for CallBudget {
    fn default() -> Self {
        CallBudget {
            deletes: 32,
            reads: 4,
        }
    }
}

/// Who asks for a call and why; for logs only, never for decisions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requester {
    pub component: String,
    pub namespace: String,
    pub name: String,
    pub reason: String,
}

/// A cloud backend. Object-safe so the registry can hold `Arc<dyn Provider>`.
///
/// Implementations must be idempotent for deletes (an unknown id is [`DeleteOutcome::AlreadyGone`])
/// and map cloud errors to the matching [`Error`] variant: throttling to [`Error::Throttled`],
/// unreachable cloud to [`Error::Unavailable`], refused credentials to
/// [`Error::CloudPermissionDenied`], a malformed id to [`Error::InvalidArgument`] naming
/// `instance_id`.
#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// The `cloud_provider` name this backend answers to.
    fn name(&self) -> ProviderName;

    /// Checks the syntax of an instance id without calling the cloud.
    fn validate_instance_id(&self, instance_id: &str) -> Result<(), Error>;

    /// Deletes one instance (already validated with [`Provider::validate_instance_id`]).
    async fn delete_instance(&self, instance_id: &str) -> Result<DeleteOutcome, Error>;

    /// Quota and usage figures.
    async fn capacity(&self) -> Result<Capacity, Error>;

    /// Instances carrying every tag of `selector`, ordered by id.
    async fn list_instances(&self, selector: &TagSelector) -> Result<Vec<Instance>, Error>;

    /// Whether the cloud answers now.
    async fn health(&self) -> Health;

    /// How many of its calls may run at once ([`crate::Budgeted`], which provider-service puts
    /// around every backend). The default suits a cloud that takes one call per instance; a
    /// backend that batches many deletes into one cloud call lets as many ask at once as a batch
    /// carries, and bounds the cloud calls itself.
    fn call_budget(&self) -> CallBudget {
        CallBudget::default()
    }

    /// The result of the last health check, when one is remembered, without waiting for the
    /// cloud beyond a first check. Plain backends remember nothing; the cache provider-service
    /// puts in front of each backend does (and refreshes it in the background when it is stale).
    async fn last_health(&self) -> Option<Health> {
        None
    }
}

/// Suggested wait for throttled calls when the cloud gives none.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Backends of this crate's unit tests that only delete: the rest of [`Provider`] written once.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// What a test backend does for a delete.
    #[async_trait]
    pub(crate) trait Deletes: Send + Sync + 'static {
        async fn delete(&self, instance_id: &str) -> Result<DeleteOutcome, Error>;
    }

    /// A libvirt-named [`Provider`] that deletes as `D` says, accepts every id, has no capacity
    /// and no instances, and is healthy.
    pub(crate) struct DeleteOnly<D>(pub D);

    #[async_trait]
    impl<D: Deletes> Provider for DeleteOnly<D> {
        fn name(&self) -> ProviderName {
            ProviderName::Libvirt
        }
        fn validate_instance_id(&self, _: &str) -> Result<(), Error> {
            Ok(())
        }
        async fn delete_instance(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
            self.0.delete(instance_id).await
        }
        async fn capacity(&self) -> Result<Capacity, Error> {
            Ok(Capacity::default())
        }
        async fn list_instances(&self, _: &TagSelector) -> Result<Vec<Instance>, Error> {
            Ok(Vec::new())
        }
        async fn health(&self) -> Health {
            Health {
                healthy: true,
                message: String::new(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_matches_only_when_every_tag_is_equal() {
        let instance = Instance {
            id: "i-1".into(),
            created: None,
            tags: [("cluster".into(), "a".into()), ("x".into(), "1".into())].into(),
            name: String::new(),
        };
        assert!(instance.matches(&TagSelector::new()));
        assert!(instance.matches(&[("cluster".into(), "a".into())].into()));
        assert!(!instance.matches(&[("cluster".into(), "b".into())].into()));
        assert!(!instance.matches(&[("other".into(), "a".into())].into()));
    }
}
