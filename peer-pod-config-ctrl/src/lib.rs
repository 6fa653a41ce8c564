//! peer-pod-config-ctrl: one `PeerPodConfig` stands up peer pods on a cluster.
//!
//! Watch → decide → act → record:
//! - The `PeerPodConfig` type and its CRD are the API's ([`peerpods_api::peerpodconfig`]).
//! - Watch: [`controller`] (watches, triggers, wiring, leader election, health).
//! - Decide (pure): [`validate`] (which PeerPodConfig is acted on, and why one is invalid), [`plan`] (desired node
//!   capacity from the spec, the nodes and the provider's free capacity), [`spread`] (node capacity values),
//!   [`objects`] (owned DaemonSet, webhook objects), [`cert`] (webhook serving certificate and its rotation),
//!   [`nodes`] (which nodes need a capacity patch), [`status`] (conditions), [`capacity`] (free VMs from
//!   provider-service figures), [`dra`] (capacityMode dra: the pool of slots, its DeviceClass, ResourceSlices and
//!   kubelet plugin DaemonSet).
//! - Act and record: [`reconcile`] (the reconcile, finalizer cleanup, status, Events, metrics), [`apply`]
//!   (server-side apply only when something differs), [`nodes`] (JSON patches on nodes/status), [`hold`] (a
//!   deletion waits while peer pods still run).

pub mod apply;
pub mod caches;
pub mod capacity;
pub mod cert;
pub mod controller;
pub use peerpods_api::peerpodconfig as crd;
pub mod dra;
mod error;
pub mod hold;
pub mod metrics;
pub mod nodes;
pub mod objects;
pub mod plan;
pub mod reconcile;
pub mod spread;
pub mod status;
pub mod validate;

pub use error::Error;

/// Field manager for every write this controller makes.
pub const FIELD_MANAGER: &str = "peer-pod-config-ctrl";
