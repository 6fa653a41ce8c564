//! Memory: peak RSS (`VmHWM`) of peerpod-ctrl and peer-pod-config-ctrl once they have taken in N PeerPods and M
//! Nodes (every PeerPod cached, every node given its capacity).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use peerpods_api::peerpodconfig::{PeerPodConfig, PeerPodConfigSpec};

use crate::Error;
use crate::cluster::Cluster;
use crate::options::Options;
use crate::report::Memory;

const NAMESPACE: &str = "bench-memory";
const LABEL: &str = "bench.peerpods.io/memory";
/// Time after both controllers caught up before the peak is read (their caches and queues settle).
const SETTLE: Duration = Duration::from_secs(3);

pub async fn run(options: &Options, cluster: &Cluster) -> Result<Memory, Error> {
    let (n, m) = (options.memory_peerpods, options.memory_nodes);
    cluster.namespace(NAMESPACE).await?;
    // Live PeerPods of running VMs: the controller keeps them in its cache and index but calls no cloud for them.
    let ids: Vec<String> = (0..n).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    // Owned by Pods, as cloud-api-adaptor's are (the owner index holds them too).
    cluster
        .create_peerpods(NAMESPACE, "memory", "libvirt", &ids, true)
        .await?;
    let labels = BTreeMap::from([(LABEL.to_string(), "yes".to_string())]);
    cluster.create_nodes("bench-mem", m, &labels).await?;
    let total = u32::try_from(m.saturating_mul(2)).unwrap_or(u32::MAX);
    let spec: PeerPodConfigSpec = serde_json::from_value(serde_json::json!({
        "limit": total,
        "nodeSelector": {LABEL: "yes"},
    }))
    .map_err(|e| Error::setup_from("PeerPodConfig spec", e))?;
    let configs: Api<PeerPodConfig> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    configs
        .create(&PostParams::default(), &PeerPodConfig::new("bench", spec))
        .await?;

    let (provider, provider_addr, _config) = super::start_provider(options, "memory", None).await?;
    let peerpod_ctrl = super::start_peerpod_ctrl(options, "memory", cluster, provider_addr).await?;
    let config_ctrl = super::start_config_ctrl(options, "memory", cluster, NAMESPACE).await?;

    super::wait_cached(cluster, &peerpod_ctrl, options.timeout).await?;
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    super::convergence::wait_spread(&nodes, &format!("{LABEL}=yes"), total, options.timeout)
        .await?;
    tokio::time::sleep(SETTLE).await;

    let kib_to_mib = |kib: u64| kib as f64 / 1024.0;
    let memory = Memory {
        peerpods: n,
        nodes: m,
        peerpod_ctrl_peak_rss_mib: kib_to_mib(peerpod_ctrl.peak_rss_kib()?),
        peerpod_ctrl_rss_mib: kib_to_mib(peerpod_ctrl.rss_kib()?),
        peer_pod_config_ctrl_peak_rss_mib: kib_to_mib(config_ctrl.peak_rss_kib()?),
        peer_pod_config_ctrl_rss_mib: kib_to_mib(config_ctrl.rss_kib()?),
    };
    config_ctrl.stop().await;
    peerpod_ctrl.stop().await;
    provider.stop().await;
    Ok(memory)
}
