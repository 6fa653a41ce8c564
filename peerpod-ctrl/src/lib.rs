//! peerpod-ctrl: deletes the cloud VM of every deleted PeerPod before its finalizer is released, deletes
//! PeerPods left behind by an earlier sandbox of the same Pod, and finds VMs that never got a PeerPod.
//!
//! Watch → decide → act → record, one folder per activity, each with its pure `rules` beside its acts:
//! - The `PeerPod` type, its finalizer and its reasons are the API's ([`peerpods_api::peerpod`]).
//! - Watch: [`controller`] (the wiring of one leadership term, directly or under a Lease), [`cache`] (what is
//!   kept of the watched PeerPods and which changes need a reconcile), [`index`] (PeerPods by controlling
//!   owner UID), [`developer_mode`] (cloud-api-adaptor's developer mode, which holds deletes while on).
//! - Reconcile: [`reconcile`] (one PeerPod's plan, carried out by its activity), [`context`] (what the
//!   reconciles of a term share), [`cleanup`] (a deleted PeerPod: its VM deleted, then its finalizer
//!   released), [`stale`] (older PeerPods of the same Pod deleted).
//! - Scans, each a pass every interval over the term's PeerPod cache (`periodic`): [`orphans`] (VMs no
//!   PeerPod refers to), [`adopt`] (cloud-api-adaptor's VM and PeerPod names, which tie an untracked VM to its
//!   live Pod), [`reverse`] (live PeerPods whose VM the cloud no longer has).
//! - Around them: [`provider`] (the provider-service calls, deletes behind provider-client's circuit breaker),
//!   [`instance`] (a VM's identity), [`in_use`] (how many PeerPods hold the finalizer, for the chart's uninstall
//!   protection), [`metrics`] (Prometheus metrics).

pub mod adopt;
pub mod cache;
pub mod cleanup;
pub mod context;
pub mod controller;
pub mod developer_mode;
mod error;
#[cfg(test)]
mod fixtures;
pub mod in_use;
pub mod index;
pub mod instance;
pub mod metrics;
pub mod orphans;
mod periodic;
pub mod provider;
pub mod reconcile;
pub mod reverse;
pub mod stale;

pub use cleanup::FIELD_MANAGER;
pub use controller::{DRAIN_GRACE, RECONCILE_LOOP, Settings, run, run_until};
pub use error::Error;
