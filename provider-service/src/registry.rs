//! The configured providers by name, and the one in use (swapped whole on a config reload).
//!
//! A name outside cloud-api-adaptor's list is a caller mistake (`INVALID_ARGUMENT`); a known name
//! without a configured backend here is a deployment problem (`FAILED_PRECONDITION`).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use peerpods_proto::UnknownProviderName;
use peerpods_provider_core::{CloudCalls, Error, Provider, ProviderConfig, ProviderName};

/// The configured providers by name. Immutable: a config reload builds a new one.
#[derive(Clone, Default)]
pub struct Registry {
    providers: BTreeMap<ProviderName, Arc<dyn Provider>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.providers.keys().map(|p| p.as_str()))
            .finish()
    }
}

impl Registry {
    /// A registry of exactly these providers (a later one replaces an earlier one of the same name).
    pub fn new(providers: impl IntoIterator<Item = Arc<dyn Provider>>) -> Self {
        Registry {
            providers: providers.into_iter().map(|p| (p.name(), p)).collect(),
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
            let name: ProviderName =
                name.parse()
                    .map_err(|e: UnknownProviderName| Error::Config {
                        key: "CLOUD_PROVIDER".into(),
                        message: e.to_string(),
                    })?;
            match crate::backends::build(name, config, cloud_calls).await? {
                Some(provider) => providers.push(provider),
                None => {
                    return Err(Error::Config {
                        key: "CLOUD_PROVIDER".into(),
                        message: format!(
                            "provider {name:?} is not built into this service (built in: {})",
                            crate::backends::BUILT_IN.join(", ")
                        ),
                    });
                }
            }
        }
        Ok(Registry::new(providers))
    }

    /// The provider called `name`: unknown names are [`Error::UnknownProvider`], known names
    /// without a configured backend are [`Error::ProviderNotConfigured`].
    pub fn get(&self, name: &str) -> Result<Arc<dyn Provider>, Error> {
        let Ok(known) = name.parse::<ProviderName>() else {
            return Err(Error::UnknownProvider { name: name.into() });
        };
        self.providers
            .get(&known)
            .cloned()
            .ok_or_else(|| Error::ProviderNotConfigured { name: name.into() })
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

#[cfg(test)]
mod tests {
    use super::*;

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
