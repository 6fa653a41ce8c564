//! Idle: CPU and memory of all three services at rest in a cluster of N PeerPods and M Nodes (peerpod-ctrl with
//! every PeerPod cached, peer-pod-config-ctrl with a PeerPodConfig selecting the M nodes and their capacity
//! written, provider-service answering both), measured over a window in which nothing changes. These are the
//! figures the chart's requests stand for: what each service takes when nothing happens.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use peerpods_api::peerpod::PeerPod;
use peerpods_api::peerpodconfig::{PeerPodConfig, PeerPodConfigSpec};
use serde::Serialize;

use crate::Error;
use crate::cluster::Cluster;
use crate::options::Options;
use crate::procs::Service;

const NAMESPACE: &str = "bench-idle";
const LABEL: &str = "bench.peerpods.io/idle";
/// Time after both controllers caught up before the window starts (caches, queues and first scans settle).
const SETTLE: Duration = Duration::from_secs(10);
/// The window idle CPU is averaged over.
const WINDOW: Duration = Duration::from_secs(30);
/// Clock ticks per second of `/proc/<pid>/stat`'s utime and stime: USER_HZ, 100 on Linux whatever the kernel's
/// own tick rate (it is part of the /proc ABI).
const TICKS_PER_SECOND: f64 = 100.0;

#[derive(Debug, Serialize)]
pub struct Idle {
    /// PeerPods in the cluster (all namespaces: peerpod-ctrl holds every one) and Nodes in it, and how many of
    /// those the PeerPodConfig selects.
    pub peerpods: usize,
    pub nodes: usize,
    pub selected_nodes: usize,
    pub window_seconds: f64,
    pub services: Vec<IdleService>,
}

#[derive(Debug, Serialize)]
pub struct IdleService {
    pub name: String,
    /// CPU over the idle window, in millicores (1000 = one core busy).
    pub cpu_millicores: f64,
    /// CPU time from the start until the window began: taking in the cluster (lists, first reconciles).
    pub catch_up_cpu_seconds: f64,
    /// Resident set at the end of the window.
    pub rss_mib: f64,
    /// Peak resident set since the start (catching up included).
    pub peak_rss_mib: f64,
}

pub async fn run(options: &Options, cluster: &Cluster) -> Result<Idle, Error> {
    let (n, m) = (options.memory_peerpods, options.memory_nodes);
    cluster.namespace(NAMESPACE).await?;
    // The cluster may hold another scenario's PeerPods already (memory's stay behind): add only what is missing
    // for N in all, which is what peerpod-ctrl holds.
    let peerpods: Api<PeerPod> = Api::all(cluster.client.clone());
    let existing = super::count(&peerpods).await?;
    let ids: Vec<String> = (0..n.saturating_sub(existing))
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    cluster
        .create_peerpods(NAMESPACE, "idle", "libvirt", &ids, true)
        .await?;
    let labels = BTreeMap::from([(LABEL.to_string(), "yes".to_string())]);
    cluster.create_nodes("bench-idle", m, &labels).await?;
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
    let in_cluster = super::count(&peerpods).await?;
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let node_count = super::count(&nodes).await?;

    let (provider, provider_addr, _config) = super::start_provider(options, "idle", None).await?;
    let peerpod_ctrl = super::start_peerpod_ctrl(options, "idle", cluster, provider_addr).await?;
    let config_ctrl = super::start_config_ctrl(options, "idle", cluster, NAMESPACE).await?;

    super::wait_cached(cluster, &peerpod_ctrl, options.timeout).await?;
    super::convergence::wait_spread(&nodes, &format!("{LABEL}=yes"), total, options.timeout)
        .await?;
    tokio::time::sleep(SETTLE).await;

    let services = [
        ("provider-service", &provider),
        ("peerpod-ctrl", &peerpod_ctrl),
        ("peer-pod-config-ctrl", &config_ctrl),
    ];
    let before: Vec<u64> = services
        .iter()
        .map(|(_, s)| cpu_ticks(s))
        .collect::<Result<_, _>>()?;
    let started = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let window = started.elapsed().as_secs_f64();
    let kib_to_mib = |kib: u64| kib as f64 / 1024.0;
    let mut measured = Vec::new();
    for ((name, service), before) in services.iter().zip(before) {
        let ticks = cpu_ticks(service)?.saturating_sub(before);
        measured.push(IdleService {
            name: (*name).to_owned(),
            cpu_millicores: ticks as f64 / TICKS_PER_SECOND / window * 1000.0,
            catch_up_cpu_seconds: before as f64 / TICKS_PER_SECOND,
            rss_mib: kib_to_mib(service.rss_kib()?),
            peak_rss_mib: kib_to_mib(service.peak_rss_kib()?),
        });
    }
    config_ctrl.stop().await;
    peerpod_ctrl.stop().await;
    provider.stop().await;
    Ok(Idle {
        peerpods: in_cluster,
        nodes: node_count,
        selected_nodes: m,
        window_seconds: window,
        services: measured,
    })
}

/// CPU time the service used so far (user and system), in clock ticks (`/proc/<pid>/stat`).
fn cpu_ticks(service: &Service) -> Result<u64, Error> {
    let pid = service
        .pid()
        .ok_or_else(|| Error::setup("a service is gone"))?;
    let path = format!("/proc/{pid}/stat");
    let stat =
        std::fs::read_to_string(&path).map_err(|e| Error::io(format!("reading {path}"), e))?;
    parse_cpu_ticks(&stat).ok_or_else(|| Error::setup(format!("no utime/stime in {path}")))
}

/// utime + stime of a `/proc/<pid>/stat` line. The command name (field 2) may hold spaces and parentheses, so
/// fields are counted after its closing parenthesis: utime and stime are fields 14 and 15.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state).
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_read_after_the_command_name() {
        let stat = "4242 (peer pod) ctl) S 1 4242 4242 0 -1 4194560 1200 0 0 0 731 269 0 0 20 0 9 0 1000 1 2";
        assert_eq!(parse_cpu_ticks(stat), Some(731 + 269));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }
}
