//! [`ByomProvider`]: the [`Provider`] implementation over a pool of pre-created machines, built
//! from cloud-api-adaptor's byom settings.

use std::path::Path;

use async_trait::async_trait;

use peerpods_provider_core::{
    Capacity, CloudCalls, DeleteOutcome, Deleter, Error, Figure, Health, Instance, OwnerTag,
    Provider, ProviderConfig, ProviderName, TagSelector,
};

use crate::machine_address::MachineAddress;
use crate::pool_configmap::{Connection, PoolConfigMap};
use crate::release::{self, Release};
use crate::settings::ByomSettings;

/// Where a pod finds its own namespace (CAA's default for `POOL_NAMESPACE`).
const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

pub struct ByomProvider {
    settings: ByomSettings,
    pool: PoolConfigMap,
    /// The deletion engine's driver: this backend's guard (`CLUSTER_TAG`, do-not-delete), its
    /// zero window and pace.
    deleter: Deleter,
}

impl std::fmt::Debug for ByomProvider {
    // Settings only: the connection holds the client's credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByomProvider")
            .field("pool_configmap", &self.pool.path())
            .field("machines", &self.settings.pool.len())
            .finish_non_exhaustive()
    }
}

impl ByomProvider {
    /// Builds the provider from cloud-api-adaptor's byom keys of `config`, counting its
    /// Kubernetes API calls in `calls`. The Kubernetes client (the kubeconfig file named by
    /// `BYOM_KUBECONFIG`, else the in-cluster ServiceAccount, else `KUBECONFIG`) is made on first
    /// use: building never connects.
    pub fn from_config(config: &ProviderConfig, calls: CloudCalls) -> Result<Self, Error> {
        let connection = match config.get("BYOM_KUBECONFIG") {
            Some(path) => Connection::Kubeconfig(path.into()),
            None => Connection::Infer,
        };
        Self::build(config, connection, calls)
    }

    /// Like [`ByomProvider::from_config`], with the Kubernetes API reached through `kube_config`
    /// (a client is made from it on first use, without kube's own retries).
    pub fn with_kube_config(
        config: &ProviderConfig,
        kube_config: kube::Config,
        calls: CloudCalls,
    ) -> Result<Self, Error> {
        Self::build(config, Connection::Config(Box::new(kube_config)), calls)
    }

    /// Like [`ByomProvider::from_config`], with this Kubernetes client as its owner built it
    /// (including its retry policy).
    pub fn with_client(
        config: &ProviderConfig,
        client: kube::Client,
        calls: CloudCalls,
    ) -> Result<Self, Error> {
        Self::build(config, Connection::Client(client), calls)
    }

    /// Builds the provider from parsed settings, deletes not restricted by a cluster tag.
    pub fn new(settings: ByomSettings, client: kube::Client, calls: CloudCalls) -> Self {
        Self::from_settings(
            settings,
            &OwnerTag::default(),
            Connection::Client(client),
            calls,
        )
    }

    fn build(
        config: &ProviderConfig,
        connection: Connection,
        calls: CloudCalls,
    ) -> Result<Self, Error> {
        let pod_namespace = std::fs::read_to_string(Path::new(SERVICE_ACCOUNT_NAMESPACE_FILE))
            .ok()
            .map(|text| text.trim().to_owned())
            .filter(|text| !text.is_empty());
        let settings = ByomSettings::from_config(config, pod_namespace)
            .map_err(|problem| Error::config(problem.key.to_owned(), problem.reason))?;
        // A machine of the pool carries no cloud's tags, so CLUSTER_TAG (set for the configuration's clouds with
        // tags) cannot judge it: the pool (VM_POOL_IPS) is what this cluster owns, checked before every delete.
        // The guard keeps its do-not-delete rule.
        Ok(Self::from_settings(
            settings,
            &OwnerTag::default(),
            connection,
            calls,
        ))
    }

    fn from_settings(
        settings: ByomSettings,
        owner: &OwnerTag,
        connection: Connection,
        calls: CloudCalls,
    ) -> Self {
        let pool = PoolConfigMap::new(
            connection,
            settings.namespace.clone(),
            settings.configmap_name.clone(),
            calls,
        );
        Self {
            settings,
            pool,
            deleter: release::deleter(owner),
        }
    }
}

/// Capacity of a pool of `pool_size` machines of which `allocated` are handed out. Machines
/// carry no vCPU or memory figures in the pool state: those stay unknown.
fn capacity_from(pool_size: usize, allocated: usize) -> Capacity {
    Capacity {
        instances: Figure {
            limit: Some(pool_size as u64),
            in_use: Some(allocated as u64),
        },
        vcpus: Figure::default(),
        memory_mib: Figure::default(),
    }
}

#[async_trait]
impl Provider for ByomProvider {
    fn name(&self) -> ProviderName {
        ProviderName::Byom
    }

    fn validate_instance_id(&self, instance_id: &str) -> Result<(), Error> {
        parse_instance_id(instance_id).map(drop)
    }

    async fn delete_instance(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
        let address = parse_instance_id(instance_id)?;
        // Never touch a machine this pool does not list, whatever the ConfigMap says.
        if !self.settings.owns(&address) {
            return Err(Error::NotOwnedByCluster {
                message: format!(
                    "machine {address} is not in this byom pool (VM_POOL_IPS): not returning it"
                ),
            });
        }
        let outcome = self
            .deleter
            .delete(&Release::new(&self.pool, address), instance_id)
            .await;
        match &outcome {
            Ok(outcome) => {
                tracing::info!(
                    instance_id,
                    outcome = outcome.as_str(),
                    "byom release answered"
                )
            }
            Err(error) => {
                tracing::warn!(instance_id, reason = error.reason(), %error, "byom release failed")
            }
        }
        outcome
    }

    async fn capacity(&self) -> Result<Capacity, Error> {
        let (_, state) = self.pool.read_state().await?;
        let allocated = state.allocations_of(|a| self.settings.owns(a)).len();
        Ok(capacity_from(self.settings.pool.len(), allocated))
    }

    async fn list_instances(&self, selector: &TagSelector) -> Result<Vec<Instance>, Error> {
        let (_, state) = self.pool.read_state().await?;
        // Keyed by canonical address: already ordered by id.
        Ok(state
            .allocations_of(|a| self.settings.owns(a))
            .into_iter()
            .map(|(id, allocation)| Instance {
                id,
                created: allocation.allocated_at(),
                tags: allocation.tags(),
                name: String::new(),
            })
            .filter(|instance| instance.matches(selector))
            .collect())
    }

    async fn health(&self) -> Health {
        match self.pool.read_state().await {
            Ok((_, state)) => Health {
                healthy: true,
                message: format!(
                    "byom pool ConfigMap {} answers: {} of {} machines allocated",
                    self.pool.path(),
                    state.allocations_of(|a| self.settings.owns(a)).len(),
                    self.settings.pool.len()
                ),
            },
            Err(error) => Health {
                healthy: false,
                message: error.to_string(),
            },
        }
    }
}

/// The machine address an instance id names (what CAA writes into `PeerPod.spec.instanceID`).
fn parse_instance_id(instance_id: &str) -> Result<MachineAddress, Error> {
    instance_id.parse().map_err(|reason| {
        Error::invalid(
            "instance_id",
            format!("not a byom instance id (the IP address of a pool machine): {reason}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool_configmap::state_of;
    use crate::pool_state::STATE_KEY;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn instance_ids_are_machine_addresses() {
        assert!(parse_instance_id("192.168.122.10").is_ok());
        assert!(parse_instance_id("fd00::a").is_ok());
        let e = parse_instance_id("i-0123456789abcdef0").unwrap_err();
        assert!(matches!(
            e,
            Error::InvalidArgument {
                field: "instance_id",
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "instance_id: not a byom instance id (the IP address of a pool machine): \
             it is neither an IPv4 nor an IPv6 address"
        );
        assert!(
            parse_instance_id("")
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
    }

    #[test]
    fn capacity_counts_machines_and_knows_what_it_does_not_know() {
        let capacity = capacity_from(4, 1);
        assert_eq!(capacity.instances.limit, Some(4));
        assert_eq!(capacity.instances.in_use, Some(1));
        assert_eq!(capacity.vcpus, Figure::default());
        assert_eq!(capacity.memory_mib, Figure::default());
    }

    #[test]
    fn a_configmap_without_state_is_a_clear_error() {
        let empty = ConfigMap::default();
        let e = state_of(&empty, "ns/pool").unwrap_err();
        assert!(matches!(&e, Error::Config { key, .. } if key == "POOL_CONFIGMAP_NAME"));
        let broken = ConfigMap {
            data: Some([(STATE_KEY.to_owned(), "{not json".to_owned())].into()),
            ..ConfigMap::default()
        };
        assert_eq!(
            state_of(&broken, "ns/pool").unwrap_err().reason(),
            "Internal"
        );
    }
}
