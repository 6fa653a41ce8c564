//! peer-pod-config-ctrl: one `PeerPodConfig` stands up peer pods on a cluster.
//!
//! Watch → decide → act → record:
//! - [`crd`]: the `PeerPodConfig` type (and the CRD YAML generated from it).
//! - Decide (pure): [`spread`] (node capacity values), [`objects`] (owned DaemonSet, webhook objects),
//!   [`cert`] (webhook serving certificate and its rotation), [`nodes`] (which nodes need a capacity patch),
//!   [`status`] (conditions), [`capacity`] (free VMs from provider-service figures).
//! - Act: [`apply`] (server-side apply only when something differs), [`nodes`] (JSON patches on nodes/status).
//! - [`controller`]: the reconciler, its watches, finalizer cleanup and metrics.

pub mod apply;
pub mod capacity;
pub mod cert;
pub mod controller;
pub mod crd;
mod error;
pub mod metrics;
pub mod nodes;
pub mod objects;
pub mod spread;
pub mod status;

pub use error::Error;

/// Field manager for every write this controller makes.
pub const FIELD_MANAGER: &str = "peer-pod-config-ctrl";
