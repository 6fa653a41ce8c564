//! capacityMode `dra` (pure): the cluster-wide pool of peer-pod VM slots as Dynamic Resource Allocation objects.
//! A DeviceClass maps the extended resource `kata.peerpods.io/vm` onto the devices of driver [`DRIVER`], and
//! ResourceSlices publish one device per slot, reachable from the selected nodes; the scheduler allocates one to
//! each pod asking for `kata.peerpods.io/vm: 1` (KEP-5004). The kubelet plugin rendered here registers the driver
//! on every selected node, so the kubelet can prepare what the scheduler allocated. docs/capacity.md explains the
//! mode; [`crate::reconcile`] applies what is decided here.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvVar, EnvVarSource, HostPathVolumeSource, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, ObjectFieldSelector, PodSecurityContext, PodSpec,
    PodTemplateSpec, ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, Device, DeviceClass, DeviceClassSpec, DeviceSelector, ResourceClaim,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::ResourceExt;

use crate::Error;
use crate::objects::{self, EXTENDED_RESOURCE};
use peerpods_api::peerpodconfig::PeerPodConfig;

/// The DRA driver of the pool, and the name the kubelet plugin registers.
pub use peerpods_api::keys::DRA_DRIVER as DRIVER;
/// The DeviceClass mapping `kata.peerpods.io/vm` onto the pool (cluster-scoped), named after the driver.
pub const DEVICE_CLASS: &str = DRIVER;
/// The one pool of the driver.
pub const POOL: &str = "peerpods";
/// ResourceSlices are named `<this><n>`, n from 0.
pub const SLICE_PREFIX: &str = "peerpods-vm-";
/// Devices are named `<this><n>`, n from 0.
pub const DEVICE_PREFIX: &str = "vm-";
/// resource.k8s.io/v1 accepts at most this many devices in one ResourceSlice.
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// Largest pool published (128 full slices). A limit above it is published as this many devices: a pool of
/// millions of slots would be millions of devices the scheduler walks for every pod, and no cloud quota is that
/// large.
pub const MAX_POOL_SIZE: u64 = 16_384;
/// The kubelet plugin DaemonSet.
pub const PLUGIN_DAEMONSET: &str = "peerpods-dra-plugin";
/// Selector (and pod label) of the kubelet plugin DaemonSet.
pub const PLUGIN_SELECTOR: (&str, &str) = ("app.kubernetes.io/name", "peerpods-dra-plugin");

/// Devices of this driver's pool allocated to ResourceClaims now: they stay in the pool whatever the limit says,
/// so a resize never takes a slot away from a scheduled pod.
pub fn allocated<'a>(claims: impl IntoIterator<Item = &'a ResourceClaim>) -> BTreeSet<String> {
    claims
        .into_iter()
        .filter_map(|c| c.status.as_ref()?.allocation.as_ref()?.devices.as_ref())
        .flat_map(|d| d.results.iter().flatten())
        .filter(|r| r.driver == DRIVER && r.pool == POOL)
        .map(|r| r.device.clone())
        .collect()
}

/// Keeps of a ResourceClaim only what the pool reads: its name and namespace, and its allocation results.
pub fn keep_allocation(claim: &mut ResourceClaim) {
    claim.metadata = ObjectMeta {
        name: claim.metadata.name.take(),
        namespace: claim.metadata.namespace.take(),
        resource_version: claim.metadata.resource_version.take(),
        uid: claim.metadata.uid.take(),
        ..Default::default()
    };
    claim.spec = Default::default();
    if let Some(status) = claim.status.as_mut() {
        status.devices = None;
        status.reserved_for = None;
    }
}

/// How many ResourceClaims hold a device of this driver's pool now (the claims whose changes the controller
/// watches for, so a release reconciles again).
pub fn claims_holding<'a>(claims: impl IntoIterator<Item = &'a ResourceClaim>) -> usize {
    claims
        .into_iter()
        .filter(|c| !allocated([*c]).is_empty())
        .count()
}

/// What becomes of the kubelet plugin when the pool is withdrawn (capacityMode node).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PluginWithdrawal {
    /// No claim of the driver is allocated: nothing needs the plugin any more.
    Delete,
    /// `claims` ResourceClaims are still allocated: the kubelet unprepares each through the plugin when its pod
    /// goes, so the plugin stays until they are released.
    Drain { claims: usize },
}

/// Whether the plugin may go, given how many claims of the driver are allocated ([`claims_holding`]). Only the
/// plugin is kept: the kubelet unprepares a claim by the driver named in its allocation, through the plugin's
/// socket, and reads neither the ResourceSlices nor the DeviceClass. Those go at once, so the scheduler allocates
/// nothing new from the pool while it drains.
pub fn plugin_withdrawal(claims: usize) -> PluginWithdrawal {
    if claims == 0 {
        PluginWithdrawal::Delete
    } else {
        PluginWithdrawal::Drain { claims }
    }
}

/// Sort key of a device name: `vm-<n>` by n, anything else after them by name.
fn order(name: &str) -> (u64, &str) {
    let index = name
        .strip_prefix(DEVICE_PREFIX)
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX);
    (index, name)
}

/// The devices of the pool: `total` (capped at [`MAX_POOL_SIZE`]) but never fewer than are allocated. Every
/// allocated device keeps its name; the rest are the lowest free `vm-<n>`. Sorted by index, so the same pool
/// always lands in the same slices.
pub fn pool(total: u64, allocated: &BTreeSet<String>) -> Vec<String> {
    let size = usize::try_from(total.min(MAX_POOL_SIZE))
        .unwrap_or(usize::MAX)
        .max(allocated.len());
    let mut names: Vec<String> = allocated.iter().cloned().collect();
    let mut n = 0u64;
    while names.len() < size {
        let name = format!("{DEVICE_PREFIX}{n}");
        if !allocated.contains(&name) {
            names.push(name);
        }
        n += 1;
    }
    names.sort_by(|a, b| order(a).cmp(&order(b)));
    names
}

/// The DeviceClass: devices of [`DRIVER`], requested through the extended resource `kata.peerpods.io/vm`.
pub fn device_class(config: &PeerPodConfig) -> DeviceClass {
    DeviceClass {
        metadata: cluster_meta(config, DEVICE_CLASS),
        spec: Some(DeviceClassSpec {
            extended_resource_name: Some(EXTENDED_RESOURCE.into()),
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: format!("device.driver == \"{DRIVER}\""),
                }),
            }]),
            ..DeviceClassSpec::default()
        }),
    }
}

fn cluster_meta(config: &PeerPodConfig, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(objects::owner_labels(config)),
        ..ObjectMeta::default()
    }
}

/// Where the pool's devices can be used: the nodes spec.nodeSelector picks, every node when it is empty.
fn reach(selector: &BTreeMap<String, String>) -> (Option<bool>, Option<NodeSelector>) {
    if selector.is_empty() {
        return (Some(true), None);
    }
    let term = NodeSelectorTerm {
        match_expressions: Some(
            selector
                .iter()
                .map(|(key, value)| NodeSelectorRequirement {
                    key: key.clone(),
                    operator: "In".into(),
                    values: Some(vec![value.clone()]),
                })
                .collect(),
        ),
        ..NodeSelectorTerm::default()
    };
    (
        None,
        Some(NodeSelector {
            node_selector_terms: vec![term],
        }),
    )
}

/// The generation the published slices carry, when they all carry the same one.
fn published_generation(published: &[ResourceSlice]) -> Option<i64> {
    published.iter().map(|s| s.spec.pool.generation).max()
}

/// The ResourceSlices publishing `pool` (at most [`MAX_DEVICES_PER_SLICE`] devices each, named
/// `<SLICE_PREFIX><n>`). `published` are the slices of the pool as they are now: when they already hold these
/// devices, reachable from the same nodes, their generation is kept (nothing to write); otherwise the generation
/// is one above the highest published, which tells the scheduler the older slices are gone.
pub fn slices(
    config: &PeerPodConfig,
    pool: &[String],
    published: &[ResourceSlice],
) -> Vec<ResourceSlice> {
    let (all_nodes, node_selector) = reach(&config.spec.node_selector);
    let chunks: Vec<&[String]> = pool.chunks(MAX_DEVICES_PER_SLICE).collect();
    // An empty pool is one slice without devices: the pool exists, with nothing in it.
    let chunks = if chunks.is_empty() {
        vec![&[][..]]
    } else {
        chunks
    };
    let count = i64::try_from(chunks.len()).unwrap_or(i64::MAX);
    let build = |generation: i64| -> Vec<ResourceSlice> {
        chunks
            .iter()
            .enumerate()
            .map(|(i, devices)| ResourceSlice {
                metadata: cluster_meta(config, &format!("{SLICE_PREFIX}{i}")),
                spec: ResourceSliceSpec {
                    driver: DRIVER.into(),
                    pool: ResourcePool {
                        name: POOL.into(),
                        generation,
                        resource_slice_count: count,
                    },
                    all_nodes,
                    node_selector: node_selector.clone(),
                    devices: Some(
                        devices
                            .iter()
                            .map(|name| Device {
                                name: name.clone(),
                                ..Device::default()
                            })
                            .collect(),
                    ),
                    ..ResourceSliceSpec::default()
                },
            })
            .collect()
    };
    let current = published_generation(published).unwrap_or(0);
    let same = build(current);
    // Slices beyond the desired ones are deleted by the caller; they do not decide the generation (the count on
    // the remaining slices changed when the pool shrank, and that does).
    let unchanged = same.iter().all(|want| {
        published.iter().any(|have| {
            have.metadata.name == want.metadata.name
                && have.spec.pool == want.spec.pool
                && have.spec.all_nodes == want.spec.all_nodes
                && have.spec.node_selector == want.spec.node_selector
                && device_names(have) == device_names(want)
        })
    });
    if unchanged { same } else { build(current + 1) }
}

fn device_names(slice: &ResourceSlice) -> Vec<&str> {
    slice
        .spec
        .devices
        .iter()
        .flatten()
        .map(|d| d.name.as_str())
        .collect()
}

/// Whether `slice` is one of this controller's pool slices.
pub fn is_ours(slice: &ResourceSlice) -> bool {
    slice.spec.driver == DRIVER
        && slice.spec.pool.name == POOL
        && slice.name_any().starts_with(SLICE_PREFIX)
        && slice
            .labels()
            .get("app.kubernetes.io/managed-by")
            .is_some_and(|m| m == crate::name::FIELD_MANAGER)
}

/// The kubelet plugin on every selected node (the contract of the `peerpods-dra-plugin` image): it registers
/// driver [`DRIVER`] with the kubelet and answers prepare and unprepare with nothing to inject. It needs no API
/// access (no ServiceAccount token) and runs as root only to write the kubelet's plugin directories.
pub fn plugin_daemonset(config: &PeerPodConfig, namespace: &str) -> Result<DaemonSet, Error> {
    let kubelet_dir = config.spec.dra.kubelet_dir.trim_end_matches('/');
    let registry = format!("{kubelet_dir}/plugins_registry");
    let plugin = format!("{kubelet_dir}/plugins/{DRIVER}");
    let selector = BTreeMap::from([(PLUGIN_SELECTOR.0.to_owned(), PLUGIN_SELECTOR.1.to_owned())]);
    let mut pod_labels = objects::owner_labels(config);
    pod_labels.extend(selector.clone());
    let host_dir = |name: &str, path: &str| Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.to_owned(),
            type_: Some("DirectoryOrCreate".into()),
        }),
        ..Volume::default()
    };
    let mount = |name: &str, path: &str| VolumeMount {
        name: name.into(),
        mount_path: path.to_owned(),
        ..VolumeMount::default()
    };
    let container = Container {
        name: "plugin".into(),
        image: Some(config.spec.dra.plugin_image.clone()),
        args: Some(vec![
            "--driver-name".into(),
            DRIVER.into(),
            "--kubelet-dir".into(),
            kubelet_dir.to_owned(),
        ]),
        env: Some(vec![EnvVar {
            name: "NODE_NAME".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "spec.nodeName".into(),
                    ..ObjectFieldSelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        }]),
        volume_mounts: Some(vec![
            mount("plugins-registry", &registry),
            mount("plugin", &plugin),
        ]),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity("5m".into())),
                ("memory".to_owned(), Quantity("16Mi".into())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_owned(),
                Quantity("64Mi".into()),
            )])),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            // Root only to create its socket in the kubelet's directories; nothing else.
            run_as_user: Some(0),
            run_as_non_root: Some(false),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };
    let mut meta = objects::owned_meta_for(config, PLUGIN_DAEMONSET, namespace)?;
    meta.labels
        .get_or_insert_with(Default::default)
        .extend(selector.clone());
    Ok(DaemonSet {
        metadata: meta,
        spec: DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    automount_service_account_token: Some(false),
                    containers: vec![container],
                    node_selector: Some(config.spec.node_selector.clone())
                        .filter(|s| !s.is_empty()),
                    security_context: Some(PodSecurityContext {
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..SeccompProfile::default()
                        }),
                        ..PodSecurityContext::default()
                    }),
                    volumes: Some(vec![
                        host_dir("plugins-registry", &registry),
                        host_dir("plugin", &plugin),
                    ]),
                    ..PodSpec::default()
                }),
            },
            ..DaemonSetSpec::default()
        },
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
        ResourceClaimStatus,
    };

    #[test]
    fn a_cached_claim_keeps_its_name_and_allocation_only() {
        let mut claim: ResourceClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "apps", "uid": "u", "resourceVersion": "7",
                "labels": {"a": "b"}, "managedFields": [{"manager": "kubectl"}]},
            "spec": {"devices": {"requests": [{"name": "vm", "exactly": {"deviceClassName": DEVICE_CLASS}}]}},
            "status": {
                "allocation": {"devices": {"results": [
                    {"request": "vm", "driver": DRIVER, "pool": POOL, "device": "vm-0"}]}},
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}],
                "devices": [{"driver": DRIVER, "pool": POOL, "device": "vm-0"}]
            }
        }))
        .unwrap();
        keep_allocation(&mut claim);
        assert_eq!(claim.metadata.name.as_deref(), Some("c"));
        assert_eq!(claim.metadata.namespace.as_deref(), Some("apps"));
        assert_eq!(claim.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(
            (
                claim.metadata.labels.as_ref(),
                claim.metadata.managed_fields.as_ref()
            ),
            (None, None)
        );
        assert_eq!(claim.spec, Default::default());
        let status = claim.status.as_ref().unwrap();
        assert_eq!(
            (status.devices.as_ref(), status.reserved_for.as_ref()),
            (None, None)
        );
        assert_eq!(allocated([&claim]), BTreeSet::from(["vm-0".to_owned()]));
    }

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_pool_is_the_total_from_vm_0() {
        assert_eq!(pool(3, &BTreeSet::new()), ["vm-0", "vm-1", "vm-2"]);
        assert!(pool(0, &BTreeSet::new()).is_empty());
    }

    #[test]
    fn a_shrink_keeps_every_allocated_device_and_fills_with_the_lowest_free() {
        // Limit 2, but vm-3 and vm-7 are allocated: both stay, nothing else.
        assert_eq!(pool(2, &names(&["vm-7", "vm-3"])), ["vm-3", "vm-7"]);
        // Limit 4 with vm-1 and vm-5 allocated: the lowest free fill up.
        assert_eq!(
            pool(4, &names(&["vm-5", "vm-1"])),
            ["vm-0", "vm-1", "vm-2", "vm-5"]
        );
        // Nothing allocated is ever dropped, even with a limit of zero.
        assert_eq!(pool(0, &names(&["vm-3"])), ["vm-3"]);
    }

    #[test]
    fn a_huge_limit_is_capped() {
        assert_eq!(
            pool(999_999_999, &BTreeSet::new()).len() as u64,
            MAX_POOL_SIZE
        );
    }

    fn config(spec: serde_json::Value) -> PeerPodConfig {
        crate::objects::tests::config(spec)
    }

    #[test]
    fn slices_hold_at_most_128_devices_and_name_their_count() {
        let c = config(serde_json::json!({"limit": 300, "capacityMode": "dra"}));
        let p = pool(300, &BTreeSet::new());
        let s = slices(&c, &p, &[]);
        assert_eq!(s.len(), 3);
        assert_eq!(
            s.iter().map(|s| device_names(s).len()).collect::<Vec<_>>(),
            [128, 128, 44]
        );
        assert!(
            s.iter()
                .all(|s| s.spec.pool.resource_slice_count == 3 && s.spec.pool.generation == 1)
        );
        // The default selector picks workers.
        let term = &s[0]
            .spec
            .node_selector
            .as_ref()
            .unwrap()
            .node_selector_terms[0];
        assert_eq!(
            term.match_expressions.as_ref().unwrap()[0].key,
            "node.kubernetes.io/worker"
        );
        assert_eq!(s[0].spec.all_nodes, None);
    }

    #[test]
    fn the_generation_moves_only_when_the_pool_does() {
        let c = config(serde_json::json!({"limit": 2, "capacityMode": "dra", "nodeSelector": {}}));
        let first = slices(&c, &pool(2, &BTreeSet::new()), &[]);
        assert_eq!(first[0].spec.all_nodes, Some(true));
        let again = slices(&c, &pool(2, &BTreeSet::new()), &first);
        assert_eq!(again, first);
        let grown = slices(&c, &pool(3, &BTreeSet::new()), &first);
        assert_eq!(grown[0].spec.pool.generation, 2);
    }

    #[test]
    fn allocated_counts_only_this_driver_s_pool() {
        let claim = |driver: &str, pool: &str, device: &str| ResourceClaim {
            status: Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(vec![DeviceRequestAllocationResult {
                            driver: driver.into(),
                            pool: pool.into(),
                            device: device.into(),
                            request: "r".into(),
                            ..DeviceRequestAllocationResult::default()
                        }]),
                        ..DeviceAllocationResult::default()
                    }),
                    ..AllocationResult::default()
                }),
                ..ResourceClaimStatus::default()
            }),
            ..ResourceClaim::default()
        };
        let claims = [
            claim(DRIVER, POOL, "vm-3"),
            claim("gpu.example.com", POOL, "vm-4"),
            claim(DRIVER, "other", "vm-5"),
            ResourceClaim::default(),
        ];
        assert_eq!(allocated(&claims), names(&["vm-3"]));
        assert_eq!(claims_holding(&claims), 1);
    }

    #[test]
    fn the_plugin_stays_while_a_claim_of_the_driver_is_allocated() {
        assert_eq!(plugin_withdrawal(0), PluginWithdrawal::Delete);
        assert_eq!(plugin_withdrawal(2), PluginWithdrawal::Drain { claims: 2 });
    }

    #[test]
    fn the_plugin_mounts_the_kubelet_dirs_at_the_same_paths_without_api_access() {
        let c = config(serde_json::json!({
            "limit": 1, "capacityMode": "dra", "dra": {"kubeletDir": "/srv/kubelet/"}
        }));
        let ds = plugin_daemonset(&c, "peer-pods").unwrap();
        let pod = ds.spec.template.spec.unwrap();
        assert_eq!(pod.automount_service_account_token, Some(false));
        let container = &pod.containers[0];
        assert_eq!(
            container.image.as_deref(),
            Some(peerpods_api::peerpodconfig::DEFAULT_DRA_PLUGIN_IMAGE)
        );
        assert_eq!(
            container.args.as_ref().unwrap(),
            &["--driver-name", DRIVER, "--kubelet-dir", "/srv/kubelet"]
        );
        let mounts: Vec<&str> = container
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert_eq!(
            mounts,
            [
                "/srv/kubelet/plugins_registry",
                "/srv/kubelet/plugins/vm.peerpods.io"
            ]
        );
        let paths: Vec<&str> = pod
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.host_path.as_ref())
            .map(|h| h.path.as_str())
            .collect();
        assert_eq!(paths, mounts);
        let sc = container.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            pod.node_selector,
            Some(BTreeMap::from([(
                "node.kubernetes.io/worker".to_owned(),
                String::new()
            )]))
        );
    }
}
