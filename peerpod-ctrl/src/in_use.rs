//! How many PeerPods hold `peer.pod/finalizer`, published for the chart's uninstall protection.
//!
//! While any PeerPod holds the finalizer, provider-service is what releases it (peerpod-ctrl asks it to delete
//! the VM first): removing provider-service, its credential or its RBAC strands every such PeerPod. The chart's
//! ValidatingAdmissionPolicy (`uninstall-protection.yaml`) refuses those deletes, and `helm uninstall` as a
//! whole, while the count here is not 0. Admission policies cannot list objects, so this controller counts from
//! the PeerPod cache it already has and writes the count and a few names into one ConfigMap, the policy's
//! parameter.
//!
//! - Written only by the leader, only once its cache has listed every PeerPod (an empty cache read as "none"
//!   would let provider-service go), and only when the data changes.
//! - Owned by the policy's binding, so it lives exactly as long as the protection: the garbage collector removes
//!   it after the binding is gone, never before Helm deletes the objects the binding protects.
//! - Missing (peerpod-ctrl never counted, or its write failed), the binding refuses those deletes all the same
//!   (`parameterNotFoundAction: Deny`): an unknown count is not a zero.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use peerpods_api::peerpod::{FINALIZER, PeerPod};

/// The key holding how many PeerPods hold the finalizer (a decimal string: ConfigMap data are strings).
pub const COUNT_KEY: &str = "count";
/// The key naming some of them, `namespace/name`, comma-separated.
pub const PEERPODS_KEY: &str = "peerpods";
/// How many PeerPods are named: enough to start with, short enough for an error message.
pub const NAMED: usize = 5;

/// How often the cache is compared with what was written: the store tells no one when it changes, and a
/// comparison of the cached PeerPods costs microseconds.
const TICK: Duration = Duration::from_secs(1);
/// How often the written ConfigMap is read back (someone may have deleted or edited it), and how long to wait
/// after a failed write or a missing binding.
const RECHECK: Duration = Duration::from_secs(30);

/// Where the count is published: the ConfigMap and the binding owning it share this name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InUseSettings {
    /// The ConfigMap's namespace (peerpod-ctrl's own).
    pub namespace: String,
    /// The ConfigMap's name, and its owner's: the chart's ValidatingAdmissionPolicyBinding.
    pub name: String,
}

/// The ConfigMap's data for these PeerPods: how many hold the finalizer, and the first [`NAMED`] of them by
/// namespace and name.
pub fn in_use_data<'a>(
    peerpods: impl IntoIterator<Item = &'a PeerPod>,
) -> BTreeMap<String, String> {
    let mut holding: Vec<String> = peerpods
        .into_iter()
        .filter(|p| p.finalizers().iter().any(|f| f == FINALIZER))
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect();
    holding.sort();
    let count = holding.len();
    holding.truncate(NAMED);
    BTreeMap::from([
        (COUNT_KEY.to_owned(), count.to_string()),
        (PEERPODS_KEY.to_owned(), holding.join(", ")),
    ])
}

/// Keeps the ConfigMap `settings` names in step with the PeerPod cache `stores` carries, until dropped.
pub async fn follow(
    client: kube::Client,
    settings: InUseSettings,
    mut stores: tokio::sync::watch::Receiver<Option<Store<PeerPod>>>,
) {
    let store = loop {
        if let Some(store) = stores.borrow_and_update().clone() {
            break store;
        }
        if stores.changed().await.is_err() {
            return std::future::pending().await;
        }
    };
    // Never a count from a cache still listing: 0 would let provider-service be removed.
    if store.wait_until_ready().await.is_err() {
        return std::future::pending().await;
    }
    let writer = Writer {
        config_maps: Api::namespaced(client.clone(), &settings.namespace),
        bindings: Api::all(client),
        settings,
    };
    let mut written: Option<BTreeMap<String, String>> = None;
    let mut checked = tokio::time::Instant::now();
    loop {
        let data = in_use_data(store.state().iter().map(AsRef::as_ref));
        if checked.elapsed() >= RECHECK {
            // Read it back now and then: deleted or edited, it is written again.
            written = None;
            checked = tokio::time::Instant::now();
        }
        if written.as_ref() != Some(&data) {
            match writer.write(&data).await {
                Ok(()) => written = Some(data),
                Err(error) => {
                    warn!(%error, namespace = %writer.settings.namespace, name = %writer.settings.name,
                        "cannot publish how many PeerPods hold the finalizer; provider-service's removal stays refused");
                    written = None;
                    checked = tokio::time::Instant::now();
                    tokio::time::sleep(RECHECK).await;
                    continue;
                }
            }
        }
        tokio::time::sleep(TICK).await;
    }
}

struct Writer {
    config_maps: Api<ConfigMap>,
    bindings: Api<ValidatingAdmissionPolicyBinding>,
    settings: InUseSettings,
}

impl Writer {
    /// Creates or updates the ConfigMap, owned by the binding, unless it already holds `data`.
    async fn write(&self, data: &BTreeMap<String, String>) -> Result<(), crate::Error> {
        let name = &self.settings.name;
        let Some(binding) = self.bindings.get_opt(name).await? else {
            // No protection installed (or deliberately removed): nothing reads a count.
            return Err(crate::Error::InUseBindingMissing(name.clone()));
        };
        let owner = OwnerReference {
            api_version: ValidatingAdmissionPolicyBinding::api_version(&()).into_owned(),
            kind: ValidatingAdmissionPolicyBinding::kind(&()).into_owned(),
            name: binding.name_any(),
            uid: binding.uid().unwrap_or_default(),
            ..OwnerReference::default()
        };
        match self.config_maps.get_opt(name).await? {
            None => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        owner_references: Some(vec![owner]),
                        ..ObjectMeta::default()
                    },
                    data: Some(data.clone()),
                    ..ConfigMap::default()
                };
                self.config_maps.create(&PostParams::default(), &cm).await?;
            }
            Some(mut cm) => {
                let owned = cm.owner_references() == std::slice::from_ref(&owner);
                if owned && cm.data.as_ref() == Some(data) {
                    return Ok(());
                }
                cm.metadata.owner_references = Some(vec![owner]);
                cm.data = Some(data.clone());
                // With its resourceVersion: a concurrent writer (a former leader) makes this fail, and the
                // next tick writes what the cache says then.
                self.config_maps
                    .replace(name, &PostParams::default(), &cm)
                    .await?;
            }
        }
        info!(count = %data.get(COUNT_KEY).map(String::as_str).unwrap_or_default(),
            peerpods = %data.get(PEERPODS_KEY).map(String::as_str).unwrap_or_default(),
            "PeerPods holding the finalizer");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use peerpods_api::peerpod::PeerPodSpec;

    fn peerpod(ns: &str, name: &str, finalizer: bool) -> PeerPod {
        let mut p = PeerPod::new(name, PeerPodSpec::default());
        p.metadata.namespace = Some(ns.into());
        if finalizer {
            p.metadata.finalizers = Some(vec!["other/finalizer".into(), FINALIZER.into()]);
        } else {
            p.metadata.finalizers = Some(vec!["other/finalizer".into()]);
        }
        p
    }

    #[test]
    fn counts_only_peerpods_holding_the_finalizer() {
        let pods = [
            peerpod("b", "x", true),
            peerpod("a", "y", false),
            peerpod("a", "z", true),
        ];
        let data = in_use_data(&pods);
        assert_eq!(data[COUNT_KEY], "2");
        assert_eq!(data[PEERPODS_KEY], "a/z, b/x");
    }

    #[test]
    fn names_the_first_few_sorted_and_counts_all() {
        let pods: Vec<PeerPod> = (0..8)
            .rev()
            .map(|i| peerpod("ns", &format!("p{i}"), true))
            .collect();
        let data = in_use_data(&pods);
        assert_eq!(data[COUNT_KEY], "8");
        assert_eq!(data[PEERPODS_KEY], "ns/p0, ns/p1, ns/p2, ns/p3, ns/p4");
    }

    #[test]
    fn none_is_zero_and_no_names() {
        let data = in_use_data(&[peerpod("a", "y", false)]);
        assert_eq!(data[COUNT_KEY], "0");
        assert_eq!(data[PEERPODS_KEY], "");
    }
}
