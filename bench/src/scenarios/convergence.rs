//! Convergence: M Nodes selected by one PeerPodConfig, in each capacity mode in turn. The clock runs from the
//! controller's start until the API holds the first total, then from a limit change until it holds the new one;
//! the API server's own `apiserver_request_total` counts the writes of each phase. Then writes are counted over a
//! window at steady state, from the API server and from the controller's write counters.
//!
//! "Holds the total" is read from the API, never from the controller's status: in node mode every selected Node's
//! `status.capacity` carries its share of the total (the kubelet would copy it into allocatable; there is no
//! kubelet); in dra mode the DeviceClass maps `kata.peerpods.io/vm` and the pool's ResourceSlices, all of one
//! generation and as many as they announce, hold exactly the total's devices.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use peer_pod_config_ctrl::dra::{DEVICE_CLASS, DRIVER, POOL};
use peerpods_api::keys::EXTENDED_RESOURCE;
use peerpods_api::peerpodconfig::{CapacityMode, PeerPodConfig, PeerPodConfigSpec};

use crate::Error;
use crate::cluster::{Cluster, wait_until};
use crate::options::Options;
use crate::report::{Convergence, ModeConvergence};
use crate::stats;
use test_support::metrics::Scrape;

const NAMESPACE: &str = "bench-convergence";
const LABEL: &str = "bench.peerpods.io/convergence";
const CONFIG: &str = "bench";
const POLL: Duration = Duration::from_millis(100);
/// Time after convergence before the steady-state window opens (status writes of the change settle).
const SETTLE: Duration = Duration::from_secs(5);
const WRITE_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];
const CONTROLLER_WRITES: [&str; 3] = [
    "peerpodconfig_node_capacity_writes_total",
    "peerpodconfig_object_writes_total",
    "peerpodconfig_status_writes_total",
];

pub async fn run(options: &Options, cluster: &Cluster) -> Result<Convergence, Error> {
    let scenario_started = Instant::now();
    let m = options.convergence_nodes;
    let from_total =
        u32::try_from(m).map_err(|_| Error::setup(format!("{m} nodes is too many")))?;
    // Two and a half VMs per node: the shares differ by one, so the spread itself is exercised.
    let to_total = from_total.saturating_mul(5) / 2;
    cluster.namespace(NAMESPACE).await?;
    let labels = BTreeMap::from([(LABEL.to_string(), "yes".to_string())]);
    let started = Instant::now();
    cluster.create_nodes("bench-conv", m, &labels).await?;
    let nodes_created_seconds = started.elapsed().as_secs_f64();
    let selector = format!("{LABEL}=yes");
    let mut modes = Vec::new();
    for &mode in &options.convergence_modes {
        eprintln!("bench: convergence, capacityMode {}", mode_name(mode));
        modes.push(run_mode(options, cluster, mode, &selector, from_total, to_total).await?);
    }
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    nodes
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&selector),
        )
        .await?;
    Ok(Convergence {
        nodes: m,
        from_total,
        to_total,
        nodes_created_seconds,
        modes,
        seconds: scenario_started.elapsed().as_secs_f64(),
    })
}

/// One capacity mode: a PeerPodConfig of `from_total`, the controller started, the change to `to_total`, the
/// steady window, then the PeerPodConfig deleted (its finalizer holds it until the controller has removed what it
/// wrote, so the next mode starts from bare nodes).
async fn run_mode(
    options: &Options,
    cluster: &Cluster,
    mode: CapacityMode,
    selector: &str,
    from_total: u32,
    to_total: u32,
) -> Result<ModeConvergence, Error> {
    let mode_started = Instant::now();
    let spec: PeerPodConfigSpec = serde_json::from_value(serde_json::json!({
        "limit": from_total,
        "nodeSelector": {LABEL: "yes"},
        "capacityMode": mode,
    }))
    .map_err(|e| Error::setup_from("PeerPodConfig spec", e))?;
    let configs: Api<PeerPodConfig> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    configs
        .create(&PostParams::default(), &PeerPodConfig::new(CONFIG, spec))
        .await?;
    let probe = Probe::start(cluster, mode, selector);

    let api_start = Scrape::parse(&cluster.apiserver_metrics().await?)?;
    let started = Instant::now();
    let name = format!("convergence-{}", mode_name(mode));
    let ctrl = super::start_config_ctrl(options, &name, cluster, NAMESPACE).await?;
    probe.wait(from_total, options.timeout).await?;
    let first_seconds = started.elapsed().as_secs_f64();
    let api_first = Scrape::parse(&cluster.apiserver_metrics().await?)?;

    let change = serde_json::json!({"spec": {"limit": to_total}});
    let started = Instant::now();
    configs
        .patch(CONFIG, &PatchParams::default(), &Patch::Merge(&change))
        .await?;
    probe.wait(to_total, options.timeout).await?;
    let change_seconds = started.elapsed().as_secs_f64();
    let api_change = Scrape::parse(&cluster.apiserver_metrics().await?)?;
    probe.confirm(to_total).await?;

    tokio::time::sleep(SETTLE).await;
    let api_before = Scrape::parse(&cluster.apiserver_metrics().await?)?;
    let ctrl_before =
        controller_writes(&Scrape::parse(&ctrl.metrics().await?)?, &CONTROLLER_WRITES);
    tokio::time::sleep(options.steady_window).await;
    let api_after = Scrape::parse(&cluster.apiserver_metrics().await?)?;
    let ctrl_after = controller_writes(&Scrape::parse(&ctrl.metrics().await?)?, &CONTROLLER_WRITES);

    // The next mode's (and scenario's) controllers must not see these objects: the controller removes what it
    // owns (its finalizer holds the PeerPodConfig until then).
    configs.delete(CONFIG, &DeleteParams::default()).await?;
    wait_until(
        "the PeerPodConfig to be cleaned up",
        options.timeout,
        POLL,
        || async { Ok(configs.get_opt(CONFIG).await?.is_none().then_some(())) },
    )
    .await?;
    ctrl.stop().await;
    probe.stop();

    let first = writes_by_resource(&api_first, &api_start);
    let changed = writes_by_resource(&api_change, &api_first);
    let steady = writes_by_resource(&api_after, &api_before);
    Ok(ModeConvergence {
        mode: mode_name(mode).into(),
        first_seconds,
        first_capacity_writes: capacity_writes(mode, &first),
        first_api_writes: first.values().sum(),
        first_api_writes_by_resource: first,
        change_seconds,
        change_capacity_writes: capacity_writes(mode, &changed),
        change_api_writes: changed.values().sum(),
        change_api_writes_by_resource: changed,
        steady_window_seconds: options.steady_window.as_secs_f64(),
        steady_api_writes: steady.values().sum(),
        steady_api_writes_by_resource: steady,
        steady_controller_writes: ctrl_after.saturating_sub(ctrl_before),
        seconds: mode_started.elapsed().as_secs_f64(),
    })
}

fn mode_name(mode: CapacityMode) -> &'static str {
    match mode {
        CapacityMode::Node => "node",
        CapacityMode::Dra => "dra",
    }
}

/// The API resources (as `apiserver_request_total` names them) that carry the capacity of `mode`.
fn capacity_resources(mode: CapacityMode) -> &'static [&'static str] {
    match mode {
        CapacityMode::Node => &["nodes", "nodes/status"],
        CapacityMode::Dra => &["deviceclasses", "resourceslices"],
    }
}

/// Writes to the resources that carry the capacity of `mode`, out of a phase's writes by resource.
fn capacity_writes(mode: CapacityMode, by_resource: &BTreeMap<String, u64>) -> u64 {
    capacity_resources(mode)
        .iter()
        .filter_map(|r| by_resource.get(*r))
        .sum()
}

/// Reads what the API holds of the capacity of one mode.
enum Probe {
    /// The selected Nodes, watched (a list of thousands of full Nodes every poll would load the API server the
    /// figure is about); only `status.capacity` is kept.
    Node(Box<NodeProbe>),
    /// The pool's slices and its DeviceClass: at most 128 small objects, listed every poll.
    Dra(kube::Client),
}

struct NodeProbe {
    nodes: Api<Node>,
    selector: String,
    store: Store<Node>,
    watch: tokio::task::JoinHandle<()>,
}

impl Probe {
    fn start(cluster: &Cluster, mode: CapacityMode, selector: &str) -> Probe {
        match mode {
            CapacityMode::Node => {
                let nodes: Api<Node> = Api::all(cluster.client.clone());
                let (store, writer) = reflector::store();
                let stream = watcher(nodes.clone(), watcher::Config::default().labels(selector))
                    .modify(|node| {
                        node.metadata.managed_fields = None;
                        node.metadata.annotations = None;
                        node.status = Some(NodeStatus {
                            capacity: node.status.take().and_then(|s| s.capacity),
                            ..NodeStatus::default()
                        });
                    })
                    .default_backoff()
                    .reflect(writer)
                    .applied_objects();
                let watch = tokio::spawn(async move {
                    let mut stream = std::pin::pin!(stream);
                    while stream.next().await.is_some() {}
                });
                Probe::Node(Box::new(NodeProbe {
                    nodes,
                    selector: selector.to_owned(),
                    store,
                    watch,
                }))
            }
            CapacityMode::Dra => Probe::Dra(cluster.client.clone()),
        }
    }

    /// Whether the API holds `total` now (the node watch's view; the pool listed).
    async fn holds(&self, total: u32) -> Result<bool, Error> {
        match self {
            Probe::Node(probe) => {
                let values: Vec<Option<u32>> =
                    probe.store.state().iter().map(|n| capacity(n)).collect();
                Ok(stats::is_spread_of(&values, total))
            }
            Probe::Dra(client) => {
                let classes: Api<DeviceClass> = Api::all(client.clone());
                let slices: Api<ResourceSlice> = Api::all(client.clone());
                let class = classes.get_opt(DEVICE_CLASS).await?;
                let mapped = class
                    .and_then(|c| c.spec)
                    .and_then(|s| s.extended_resource_name)
                    .is_some_and(|r| r == EXTENDED_RESOURCE);
                let list = slices.list(&ListParams::default()).await?;
                Ok(mapped && pool_devices(&list.items) == Some(u64::from(total)))
            }
        }
    }

    async fn wait(&self, total: u32, timeout: Duration) -> Result<(), Error> {
        wait_until(
            &format!("the API to hold {EXTENDED_RESOURCE} {total}"),
            timeout,
            POLL,
            || async { Ok(self.holds(total).await?.then_some(())) },
        )
        .await
    }

    /// After a watched convergence, one full list of the nodes must agree (the watch is no shortcut).
    async fn confirm(&self, total: u32) -> Result<(), Error> {
        let holds = match self {
            Probe::Node(probe) => {
                let list = probe
                    .nodes
                    .list(&ListParams::default().labels(&probe.selector))
                    .await?;
                let values: Vec<Option<u32>> = list.items.iter().map(capacity).collect();
                stats::is_spread_of(&values, total)
            }
            Probe::Dra(_) => self.holds(total).await?,
        };
        if holds {
            Ok(())
        } else {
            Err(Error::setup(format!(
                "the watch saw {EXTENDED_RESOURCE} {total} but a list of the API disagrees"
            )))
        }
    }

    fn stop(self) {
        if let Probe::Node(probe) = self {
            probe.watch.abort();
        }
    }
}

/// Waits until every selected node advertises its share of `total` (the memory and idle scenarios' arrangement;
/// a list per poll is fine at their sizes).
pub async fn wait_spread(
    nodes: &Api<Node>,
    selector: &str,
    total: u32,
    timeout: Duration,
) -> Result<(), Error> {
    wait_until(
        &format!("{EXTENDED_RESOURCE} spread to {total} over the nodes"),
        timeout,
        POLL,
        || async {
            let list = nodes.list(&ListParams::default().labels(selector)).await?;
            let values: Vec<Option<u32>> = list.items.iter().map(capacity).collect();
            Ok(stats::is_spread_of(&values, total).then_some(()))
        },
    )
    .await
}

fn capacity(node: &Node) -> Option<u32> {
    node.status
        .as_ref()?
        .capacity
        .as_ref()?
        .get(EXTENDED_RESOURCE)?
        .0
        .parse()
        .ok()
}

/// Devices of the pool (driver vm.peerpods.io, pool peerpods) once it is whole: every slice of the pool is of one
/// generation and there are as many as each announces. None while the pool is missing or being replaced.
fn pool_devices(slices: &[ResourceSlice]) -> Option<u64> {
    let pool: Vec<&ResourceSlice> = slices
        .iter()
        .filter(|s| s.spec.driver == DRIVER && s.spec.pool.name == POOL)
        .collect();
    let first = pool.first()?;
    let whole = pool.iter().all(|s| s.spec.pool == first.spec.pool)
        && usize::try_from(first.spec.pool.resource_slice_count).ok() == Some(pool.len());
    whole.then(|| {
        pool.iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len) as u64)
            .sum()
    })
}

fn controller_writes(scrape: &Scrape, names: &[&str]) -> u64 {
    names.iter().map(|name| scrape.sum(name, &[])).sum::<f64>() as u64
}

/// Write requests the API server served between two scrapes, by resource (and subresource).
fn writes_by_resource(after: &Scrape, before: &Scrape) -> BTreeMap<String, u64> {
    let count = |scrape: &Scrape| {
        let mut by: BTreeMap<String, f64> = BTreeMap::new();
        for sample in scrape.samples("apiserver_request_total") {
            if !WRITE_VERBS.contains(&sample.label("verb")) {
                continue;
            }
            let resource = sample.label("resource");
            let key = match sample.label("subresource") {
                "" => resource.to_owned(),
                sub => format!("{resource}/{sub}"),
            };
            *by.entry(key).or_default() += sample.value;
        }
        by
    };
    let before = count(before);
    count(after)
        .into_iter()
        .map(|(key, n)| {
            let diff = (n - before.get(&key).copied().unwrap_or(0.0)).max(0.0) as u64;
            (key, diff)
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{Device, ResourcePool, ResourceSliceSpec};
    use kube::api::ObjectMeta;

    #[test]
    fn api_writes_by_resource_between_scrapes() {
        let before = "apiserver_request_total{resource=\"nodes\",subresource=\"status\",verb=\"PATCH\",code=\"200\"} 10\n\
            apiserver_request_total{resource=\"leases\",subresource=\"\",verb=\"PUT\",code=\"200\"} 4\n";
        let after = "apiserver_request_total{resource=\"nodes\",subresource=\"status\",verb=\"PATCH\",code=\"200\"} 10\n\
            apiserver_request_total{resource=\"leases\",subresource=\"\",verb=\"PUT\",code=\"200\"} 9\n\
            apiserver_request_total{resource=\"nodes\",subresource=\"\",verb=\"GET\",code=\"200\"} 50\n\
            apiserver_request_total{resource=\"events\",subresource=\"\",verb=\"POST\",code=\"201\"} 2\n";
        let parse = |text| Scrape::parse(text).expect("scrape");
        assert_eq!(
            writes_by_resource(&parse(after), &parse(before)),
            BTreeMap::from([("events".into(), 2), ("leases".into(), 5)])
        );
    }

    #[test]
    fn capacity_writes_are_the_writes_to_what_carries_the_mode() {
        let phase = BTreeMap::from([
            ("nodes/status".to_string(), 5000),
            ("pods".to_string(), 5000),
            ("resourceslices".to_string(), 98),
            ("deviceclasses".to_string(), 1),
            ("peerpodconfigs/status".to_string(), 3),
        ]);
        assert_eq!(capacity_writes(CapacityMode::Node, &phase), 5000);
        assert_eq!(capacity_writes(CapacityMode::Dra, &phase), 99);
    }

    fn slice(
        name: &str,
        driver: &str,
        generation: i64,
        count: i64,
        devices: usize,
    ) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: driver.into(),
                pool: ResourcePool {
                    name: POOL.into(),
                    generation,
                    resource_slice_count: count,
                },
                devices: Some(
                    (0..devices)
                        .map(|i| Device {
                            name: format!("vm-{i}"),
                            ..Device::default()
                        })
                        .collect(),
                ),
                ..ResourceSliceSpec::default()
            },
        }
    }

    #[test]
    fn the_pool_counts_only_once_whole_and_of_one_generation() {
        let whole = [
            slice("peerpods-vm-0", DRIVER, 2, 2, 128),
            slice("peerpods-vm-1", DRIVER, 2, 2, 72),
            slice("other-0", "gpu.example.com", 1, 1, 8),
        ];
        assert_eq!(pool_devices(&whole), Some(200));
        // A slice missing: the pool announces two.
        assert_eq!(pool_devices(&whole[..1]), None);
        // A slice of the previous generation still there while the new one is published.
        let replacing = [
            slice("peerpods-vm-0", DRIVER, 3, 2, 128),
            slice("peerpods-vm-1", DRIVER, 2, 2, 72),
        ];
        assert_eq!(pool_devices(&replacing), None);
        assert_eq!(pool_devices(&whole[2..]), None);
    }
}
