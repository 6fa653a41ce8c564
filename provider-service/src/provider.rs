//! The domain layer: what a cloud backend must do, in domain types only (never prost types).
//!
//! The gRPC layer validates input, picks a [`Provider`] from the [`Registry`] by the caller's
//! `cloud_provider` and converts the answer. One module per cloud implements [`Provider`].

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;

use crate::Error;
use crate::config::ProviderConfig;
use crate::metrics::CloudCalls;

/// Provider names cloud-api-adaptor knows (its `CLOUD_PROVIDER` values). A name outside this list
/// is a caller mistake (`INVALID_ARGUMENT`); a name in it without a configured backend here is a
/// deployment problem (`FAILED_PRECONDITION`).
pub const KNOWN_PROVIDERS: &[&str] = &[
    "alibabacloud",
    "aws",
    "azure",
    "byom",
    "gcp",
    "ibmcloud",
    "ibmcloud-powervs",
    "libvirt",
];

/// Tags an instance must carry, each with exactly this value. Empty matches every instance.
pub type TagSelector = BTreeMap<String, String>;

/// What deleting an instance did. Both are success: gone is never an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeleteOutcome {
    /// The instance existed and is deleted (or the cloud accepted its deletion).
    Deleted,
    /// The instance did not exist (any more).
    AlreadyGone,
}

impl DeleteOutcome {
    /// Stable label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            DeleteOutcome::Deleted => "deleted",
            DeleteOutcome::AlreadyGone => "already_gone",
        }
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
    /// The `cloud_provider` name this backend answers to, e.g. `libvirt`.
    fn name(&self) -> &str;

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
}

/// The configured providers by name. Immutable: a config reload builds a new one.
#[derive(Clone, Default)]
pub struct Registry {
    providers: BTreeMap<String, Arc<dyn Provider>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.providers.keys()).finish()
    }
}

impl Registry {
    /// A registry of exactly these providers (a later one replaces an earlier one of the same name).
    pub fn new(providers: impl IntoIterator<Item = Arc<dyn Provider>>) -> Self {
        Registry {
            providers: providers
                .into_iter()
                .map(|p| (p.name().to_owned(), p))
                .collect(),
        }
    }

    /// Builds the providers named in `CLOUD_PROVIDER` (comma-separated) from `config`; each
    /// counts its cloud API calls in `cloud_calls`.
    pub async fn from_config(
        config: &ProviderConfig,
        cloud_calls: &CloudCalls,
    ) -> Result<Self, Error> {
        let names = config
            .get("CLOUD_PROVIDER")
            .unwrap_or(DEFAULT_CLOUD_PROVIDER);
        let mut providers = Vec::new();
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if !KNOWN_PROVIDERS.contains(&name) {
                return Err(Error::Config {
                    key: "CLOUD_PROVIDER".into(),
                    message: format!("unknown provider {name:?}"),
                });
            }
            match build_backend(name, config, cloud_calls).await? {
                Some(provider) => providers.push(provider),
                None => {
                    return Err(Error::Config {
                        key: "CLOUD_PROVIDER".into(),
                        message: format!("provider {name:?} is not built into this service"),
                    });
                }
            }
        }
        Ok(Registry::new(providers))
    }

    /// The provider called `name`: unknown names are [`Error::UnknownProvider`], known names
    /// without a configured backend are [`Error::ProviderNotConfigured`].
    pub fn get(&self, name: &str) -> Result<Arc<dyn Provider>, Error> {
        if let Some(provider) = self.providers.get(name) {
            return Ok(provider.clone());
        }
        if KNOWN_PROVIDERS.contains(&name) {
            Err(Error::ProviderNotConfigured { name: name.into() })
        } else {
            Err(Error::UnknownProvider { name: name.into() })
        }
    }

    /// Configured providers, ordered by name.
    pub fn providers(&self) -> impl Iterator<Item = &Arc<dyn Provider>> {
        self.providers.values()
    }
}

/// The registry in use, swapped as a whole when the configuration changes. Calls in flight keep
/// the providers they started with.
#[derive(Clone, Default)]
pub struct SharedRegistry(Arc<RwLock<Arc<Registry>>>);

impl SharedRegistry {
    pub fn new(registry: Registry) -> Self {
        SharedRegistry(Arc::new(RwLock::new(Arc::new(registry))))
    }

    /// The registry now in use.
    pub fn current(&self) -> Arc<Registry> {
        match self.0.read() {
            Ok(r) => r.clone(),
            // A writer cannot panic half-way through an Arc swap, so the value is whole.
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Puts `registry` in use for every later call.
    pub fn replace(&self, registry: Registry) {
        let new = Arc::new(registry);
        match self.0.write() {
            Ok(mut r) => *r = new,
            Err(poisoned) => *poisoned.into_inner() = new,
        }
    }
}

/// `CLOUD_PROVIDER` when neither a config file nor the environment sets it, so the service runs
/// locally with no configuration at all (on libvirt's in-process test driver).
pub const DEFAULT_CLOUD_PROVIDER: &str = "libvirt";

// ---------------------------------------------------------------------------------------------
// Backends compiled into this service. A new cloud = one `mod` line in lib.rs + one arm here.
// ---------------------------------------------------------------------------------------------
// A backend reads only its own keys from `config`, must not connect to the cloud here (a reload
// builds backends to validate a new config) and may count its calls in `cloud_calls`.
async fn build_backend(
    name: &str,
    config: &ProviderConfig,
    cloud_calls: &CloudCalls,
) -> Result<Option<Arc<dyn Provider>>, Error> {
    Ok(match name {
        "libvirt" => Some(Arc::new(crate::libvirt::LibvirtProvider::from_config(
            config,
            cloud_calls.clone(),
        )?)),
        "aws" => Some(Arc::new(
            crate::aws::AwsProvider::from_config(config, cloud_calls.clone()).await?,
        )),
        _ => None,
    })
}

/// Suggested wait for throttled calls when the cloud gives none.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_matches_only_when_every_tag_is_equal() {
        let instance = Instance {
            id: "i-1".into(),
            created: None,
            tags: [("cluster".into(), "a".into()), ("x".into(), "1".into())].into(),
        };
        assert!(instance.matches(&TagSelector::new()));
        assert!(instance.matches(&[("cluster".into(), "a".into())].into()));
        assert!(!instance.matches(&[("cluster".into(), "b".into())].into()));
        assert!(!instance.matches(&[("other".into(), "a".into())].into()));
    }

    #[test]
    fn unknown_and_unconfigured_names_differ() {
        let registry = Registry::default();
        assert!(matches!(
            registry.get("aws"),
            Err(Error::ProviderNotConfigured { .. })
        ));
        assert!(matches!(
            registry.get("nimbus"),
            Err(Error::UnknownProvider { .. })
        ));
    }
}
