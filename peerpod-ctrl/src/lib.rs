//! peerpod-ctrl: deletes the cloud VM of every deleted PeerPod before its finalizer is released, deletes
//! PeerPods left behind by an earlier sandbox of the same Pod, and finds VMs that never got a PeerPod.
//!
//! - [`crd`]: the `PeerPod` type, wire-compatible with cloud-api-adaptor, and its CRD.
//! - [`decide`]: pure decisions (cleanup, finalizer patch, stale PeerPods, orphans, backoff).
//! - [`developer_mode`]: cloud-api-adaptor's developer mode, read from its ConfigMap (holds deletes while on).
//! - [`in_use`]: how many PeerPods hold the finalizer, published for the chart's uninstall protection.
//! - [`cache`]: what is kept of the watched PeerPods (store, owner index) and which changes need a reconcile.
//! - [`index`]: PeerPods by controlling owner UID.
//! - [`provider`]: the provider-service calls.
//! - [`breaker`]: the circuit breaker that holds provider-service calls back while it or a cloud is down.
//! - [`controller`]: the wiring of one leadership term, and how it runs (directly or under a Lease).
//! - [`reconcile`]: the reconciler (watch → decide → act → record).
//! - [`orphans`]: the periodic orphan-VM scan.
//! - [`adopt`]: cloud-api-adaptor's VM and PeerPod names, which tie an untracked VM to its live Pod.
//! - [`reverse`]: the periodic reverse scan: live PeerPods whose VM the cloud no longer has.
//! - [`metrics`]: Prometheus metrics.

pub mod adopt;
pub mod breaker;
pub mod cache;
pub mod controller;
pub mod crd;
pub mod decide;
pub mod developer_mode;
mod error;
pub mod in_use;
pub mod index;
pub mod metrics;
pub mod orphans;
pub mod provider;
pub mod reconcile;
pub mod reverse;

pub use controller::{DRAIN_GRACE, RECONCILE_LOOP, Settings, run, run_until};
pub use error::Error;
pub use reconcile::FIELD_MANAGER;
