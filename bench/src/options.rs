//! Sizes and paths of one run. Defaults are the sizes of issue 7; small runs pass smaller ones.

use std::path::PathBuf;
use std::time::Duration;

/// The scenarios a run can select. `cloud_calls` is measured during the storm, so it comes with it.
pub const SCENARIOS: [&str; 7] = [
    "storm",
    "memory",
    "convergence",
    "grpc",
    "fault_storm",
    "load",
    "idle",
];

#[derive(Debug, Clone)]
pub struct Options {
    /// PeerPods (and moto instances) in the cleanup storm.
    pub storm: usize,
    /// PeerPods (and VMs) per cloud in the fault storm.
    pub fault_storm: usize,
    /// The clouds of the fault storm (names from `scenarios::fault_storm::CLOUDS`).
    pub fault_storm_clouds: Vec<String>,
    /// Whether the fault storm's lookups lag too (an instance hidden from lookups by id, and lookups
    /// flapping, after its create). The deletion engine believes the NotFound of a VM only once it is
    /// known older than the cloud's consistency window (model/: the assumption `lag_only_while_young`),
    /// so lagging lookups of the storm's new VMs make it wait, not release early.
    pub fault_storm_lookup_lag: bool,
    /// Parallel finalizer patches of the storm's floor (peerpod-ctrl's default --api-writes).
    pub floor_concurrency: usize,
    /// PeerPods in the cluster while peak RSS is measured.
    pub memory_peerpods: usize,
    /// Nodes in the cluster while peak RSS is measured.
    pub memory_nodes: usize,
    /// Nodes whose capacity the convergence scenario changes.
    pub convergence_nodes: usize,
    /// The capacity modes the convergence scenario measures, in this order, over the same nodes.
    pub convergence_modes: Vec<peerpods_api::peerpodconfig::CapacityMode>,
    /// How long API writes are counted once the nodes are right.
    pub steady_window: Duration,
    /// DeleteInstance calls timed each way in the gRPC scenario.
    pub grpc_calls: usize,
    /// Which scenarios run (names from [`SCENARIOS`]).
    pub scenarios: Vec<String>,
    /// Where the release binaries of provider-service, peerpod-ctrl and peer-pod-config-ctrl are.
    pub bin_dir: PathBuf,
    /// The Python that runs moto server.
    pub moto_python: PathBuf,
    /// Logs of every process the run starts.
    pub log_dir: PathBuf,
    /// Longest wait for any one condition (a storm draining, nodes converging).
    pub timeout: Duration,
}

impl Options {
    pub fn selected(&self, scenario: &str) -> bool {
        self.scenarios.iter().any(|s| s == scenario)
    }
}
