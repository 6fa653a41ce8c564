//! The PeerPodConfig status, computed from what a reconcile observed (pure).
//!
//! Here: the condition types (the API's), and what one reconcile observed ([`Observed`]). The computations from
//! it (`verdicts`): the status ([`compute`]), the DRA plugin's verdict ([`dra_plugin_verdict`]) and the note of
//! a developer mode change ([`developer_mode_change`]).

mod verdicts;

pub use verdicts::{compute, developer_mode_change, dra_plugin_verdict};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};

use crate::validate::Invalid;
use peerpods_api::peerpodconfig::FailureReason;

pub use peerpods_api::peerpodconfig::condition_type::{
    CAPACITY_ADVERTISED, DAEMONSET_READY, DRA_PLUGIN_READY, INVALID, READY, WEBHOOK_READY,
};

/// Why every selected node takes at most [`NodeCeiling::PER_NODE`] VMs whatever the limit asks: cloud-api-adaptor's
/// own per-node default in its developer mode (docs/capacity.md). Decided by `crate::plan::node_ceiling`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeCeiling {
    /// `PODVM_DEVELOPER_MODE` is on in CAA's ConfigMap.
    DeveloperMode,
    /// Whether it is on cannot be told (not a boolean, or the ConfigMap cannot be read): as if on (fail closed).
    DeveloperModeUnknown,
}

impl NodeCeiling {
    /// VMs per selected node: CAA's default per-node limit in developer mode.
    pub const PER_NODE: u32 = 1;
}

/// The kubelet plugin as one reconcile saw it.
#[derive(Clone, Debug)]
pub enum DraPlugin {
    /// capacityMode dra: the DaemonSet as applied (its status from the cache).
    Serving(Option<Box<DaemonSet>>),
    /// capacityMode node: kept for `claims` allocated ResourceClaims.
    Draining { claims: usize },
}

/// Node capacity figures of one reconcile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    pub requested: u64,
    pub provider_free: Option<u64>,
    pub effective: u64,
    pub selected_nodes: u32,
    pub per_node_min: Option<u32>,
    pub per_node_max: Option<u32>,
    /// capacityMode dra: the pool published instead of node capacity.
    pub pool: Option<Pool>,
    /// Every selected node takes at most one VM (the pool at most one device per selected node), and why.
    pub ceiling: Option<NodeCeiling>,
}

/// The DRA pool of one reconcile (capacityMode dra).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pool {
    /// Devices published.
    pub size: u64,
    /// Devices of the pool allocated to ResourceClaims.
    pub allocated: u64,
}

/// How far the node patches of a rebalance are: `done` of `of` nodes changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applying {
    pub done: u32,
    pub of: u32,
}

/// What one reconcile saw and did.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub generation: Option<i64>,
    pub invalid: Option<Invalid>,
    pub capacity: Option<Capacity>,
    /// Asking provider-service failed (the requested total was used).
    pub provider_problem: Option<String>,
    /// Every owned object exists as desired.
    pub objects_applied: bool,
    pub daemonset: Option<DaemonSet>,
    pub webhook: Option<Deployment>,
    /// Why the webhook's entry is not in the webhook configuration (reason, message), e.g. the configuration the
    /// chart creates does not exist.
    pub webhook_configuration_problem: Option<(FailureReason, String)>,
    /// Node patches still going (paced, see `nodes::PatchRate`): what `capacity` asks for is not on every node yet.
    pub applying: Option<Applying>,
    /// The DRA kubelet plugin, where one is kept (see [`DRA_PLUGIN_READY`]).
    pub dra_plugin: Option<DraPlugin>,
}
