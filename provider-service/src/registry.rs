//! The configured providers by name, and the one in use (swapped whole on a config reload).
//!
//! A name outside cloud-api-adaptor's list is a caller mistake (`INVALID_ARGUMENT`); a known name
//! without a configured backend here is a deployment problem (`FAILED_PRECONDITION`). So is a
//! configuration that serves nothing at all: no `CLOUD_PROVIDER` (outside development mode, where
//! the embedded default stands in) or one refused as a whole, e.g. a cloud with tags without
//! `CLUSTER_TAG` or `DELETE_UNTAGGED=allow`. Then every call is refused with that reason.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use peerpods_proto::{ErrorReason, UnknownProviderName};
use peerpods_provider_core::{
    CloudCalls, Provider, ProviderConfig, ProviderName, require_owner_choice,
};

use crate::error::{Error, ProviderError};

/// Why no cloud is served (see [`Error::NotServing`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotServing {
    pub reason: ErrorReason,
    pub why: String,
}

impl NotServing {
    /// The refusal for a configuration that could not be used.
    pub fn from_error(e: &Error) -> Self {
        match e {
            Error::NotServing { reason, why } => NotServing {
                reason: *reason,
                why: why.clone(),
            },
            other => NotServing {
                reason: other.error_reason(),
                why: other.to_string(),
            },
        }
    }

    fn error(&self) -> Error {
        Error::NotServing {
            reason: self.reason,
            why: self.why.clone(),
        }
    }
}

/// The configured providers by name. Immutable: a config reload builds a new one.
#[derive(Clone, Default)]
pub struct Registry {
    providers: BTreeMap<ProviderName, Arc<dyn Provider>>,
    /// Set when nothing may be served; every call is refused with it.
    not_serving: Option<NotServing>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.not_serving {
            Some(n) => write!(f, "not serving ({}): {}", n.reason, n.why),
            None => f
                .debug_list()
                .entries(self.providers.keys().map(|p| p.as_str()))
                .finish(),
        }
    }
}

impl Registry {
    /// A registry of exactly these providers (a later one replaces an earlier one of the same name).
    pub fn new(providers: impl IntoIterator<Item = Arc<dyn Provider>>) -> Self {
        Registry {
            providers: providers.into_iter().map(|p| (p.name(), p)).collect(),
            not_serving: None,
        }
    }

    /// A registry that serves nothing and refuses every call with `why`.
    pub fn not_serving(why: NotServing) -> Self {
        Registry {
            providers: BTreeMap::new(),
            not_serving: Some(why),
        }
    }

    /// Why nothing is served, when nothing is.
    pub fn refusal(&self) -> Option<&NotServing> {
        self.not_serving.as_ref()
    }

    /// Builds the providers named in `CLOUD_PROVIDER` (comma-separated) from `config`; each
    /// counts its cloud API calls in `cloud_calls`. Without `CLOUD_PROVIDER`, development mode
    /// ([`ProviderConfig::is_development`]) serves [`DEFAULT_CLOUD_PROVIDER`]; otherwise the
    /// configuration is refused ([`Error::NotServing`], reason `ProviderNotConfigured`). A cloud
    /// with tags needs `CLUSTER_TAG` or `DELETE_UNTAGGED=allow` (reason `InvalidConfig`).
    pub async fn from_config(
        config: &ProviderConfig,
        cloud_calls: &CloudCalls,
    ) -> Result<Self, Error> {
        let names = match config.get("CLOUD_PROVIDER") {
            Some(names) => names,
            None if config.is_development() => DEFAULT_CLOUD_PROVIDER,
            None => {
                return Err(Error::NotServing {
                    reason: ErrorReason::ProviderNotConfigured,
                    why: "CLOUD_PROVIDER is not set: mount the provider configuration (peer-pods-cm) \
                          naming the cloud; the embedded libvirt test driver runs only with \
                          --development"
                        .into(),
                });
            }
        };
        let mut providers = Vec::new();
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let name: ProviderName = name.parse().map_err(|e: UnknownProviderName| {
                ProviderError::config("CLOUD_PROVIDER", e.to_string()).with_source(e)
            })?;
            require_owner_choice(name, config)?;
            match crate::backends::build(name, config, cloud_calls).await? {
                Some(provider) => providers.push(provider),
                None => {
                    return Err(ProviderError::config(
                        "CLOUD_PROVIDER",
                        format!(
                            "provider {name:?} is not built into this service (built in: {})",
                            crate::backends::built_in()
                                .iter()
                                .map(|name| name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    )
                    .into());
                }
            }
        }
        Ok(Registry::new(providers))
    }

    /// The provider called `name`: unknown names are [`ProviderError::UnknownProvider`]; while
    /// nothing is served, every known name is [`Error::NotServing`]; known names without a
    /// configured backend are [`ProviderError::ProviderNotConfigured`].
    pub fn get(&self, name: &str) -> Result<Arc<dyn Provider>, Error> {
        let Ok(known) = name.parse::<ProviderName>() else {
            return Err(ProviderError::UnknownProvider { name: name.into() }.into());
        };
        if let Some(refusal) = &self.not_serving {
            return Err(refusal.error());
        }
        self.providers
            .get(&known)
            .cloned()
            .ok_or_else(|| ProviderError::ProviderNotConfigured { name: name.into() }.into())
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

/// `CLOUD_PROVIDER` in development mode when neither a config file nor the environment sets it,
/// so `make dev` runs with no configuration at all (on libvirt's in-process test driver).
pub const DEFAULT_CLOUD_PROVIDER: &str = "libvirt";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_unconfigured_names_differ() {
        let registry = Registry::default();
        assert!(matches!(
            registry.get("aws"),
            Err(Error::Provider(ProviderError::ProviderNotConfigured { .. }))
        ));
        assert!(matches!(
            registry.get("nimbus"),
            Err(Error::Provider(ProviderError::UnknownProvider { .. }))
        ));
    }

    #[tokio::test]
    async fn no_cloud_provider_serves_nothing_outside_development_mode() {
        let empty = ProviderConfig::from_pairs(Vec::<(String, String)>::new());
        let refused = Registry::from_config(&empty, &CloudCalls::default())
            .await
            .expect_err("no CLOUD_PROVIDER");
        assert_eq!(refused.reason(), "ProviderNotConfigured");
        assert!(
            refused.to_string().contains("CLOUD_PROVIDER is not set"),
            "{refused}"
        );

        let registry = Registry::not_serving(NotServing::from_error(&refused));
        for name in ["libvirt", "aws"] {
            let e = registry.get(name).err().expect("refused");
            assert_eq!(e.reason(), "ProviderNotConfigured");
        }
        // A caller's typo is still the caller's mistake.
        assert_eq!(
            registry.get("nimbus").err().map(|e| e.reason()),
            Some("UnknownProvider")
        );
    }

    #[cfg(feature = "aws")]
    #[tokio::test]
    async fn a_cloud_with_tags_needs_a_cluster_tag_or_an_explicit_allow() {
        let aws = [
            ("CLOUD_PROVIDER", "aws"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
        ];
        let refused =
            Registry::from_config(&ProviderConfig::from_pairs(aws), &CloudCalls::default())
                .await
                .expect_err("no cluster tag");
        assert!(
            matches!(&refused, Error::Provider(ProviderError::Config { key, .. }) if key == "CLUSTER_TAG"),
            "{refused}"
        );
        for extra in [
            ("CLUSTER_TAG", "peerpods.io/cluster=c1"),
            ("DELETE_UNTAGGED", "allow"),
        ] {
            let config = ProviderConfig::from_pairs(aws.into_iter().chain([extra]));
            let registry = Registry::from_config(&config, &CloudCalls::default())
                .await
                .expect("served with an owner choice");
            assert!(registry.get("aws").is_ok());
        }
    }
}
