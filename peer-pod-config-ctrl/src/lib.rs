//! peer-pod-config-ctrl: one `PeerPodConfig` stands up peer pods on a cluster.
//!
//! Watch → decide → act → record:
//! - The `PeerPodConfig` type and its CRD are the API's ([`peerpods_api::peerpodconfig`]).
//! - Watch: [`controller`] (watches, triggers, wiring, leader election, health).
//! - Decide (pure): [`validate`] (which PeerPodConfig is acted on, and why one is invalid), [`plan`] (desired node
//!   capacity from the spec, the nodes and the provider's free capacity), [`spread`] (node capacity values),
//!   [`objects`] (owned DaemonSet, webhook objects), [`cert`] (webhook serving certificate and its rotation),
//!   [`status`] (conditions), [`dra`] (capacityMode dra: the pool of slots, its DeviceClass, ResourceSlices and
//!   kubelet plugin DaemonSet), and the pure halves of [`nodes`] (which nodes need a capacity patch) and
//!   [`capacity`] (free VMs from provider-service figures).
//! - Act and record: the modules that write to the API server or call provider-service. [`reconcile`] drives
//!   them: the finalizer, owned objects through [`apply`] (server-side apply only when something differs), the
//!   DRA pool's objects, the webhook's entry in the chart's webhook configuration, status, Events and metrics.
//!   [`nodes`] merge-patches capacity on nodes/status, [`hold`] writes the DeletionHeld condition while peer pods
//!   still run, [`capacity`] asks provider-service for its figures. [`caches`] keeps what the watches saw and
//!   what was written since; [`metrics`] the controller's own.

pub mod apply;
pub mod caches;
pub mod capacity;
pub mod cert;
pub mod controller;
pub mod dra;
mod error;
pub mod hold;
pub mod metrics;
mod name;
pub mod nodes;
pub mod objects;
pub mod plan;
pub mod reconcile;
pub mod spread;
pub mod status;
pub mod validate;

pub use error::Error;
pub use name::FIELD_MANAGER;
