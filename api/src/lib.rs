//! The Kubernetes API of peer pods, shared by every component that reads or writes it.
//!
//! - [`peerpod`]: the `PeerPod` type cloud-api-adaptor writes (one per pod VM), its finalizer, the reasons of
//!   its Cleaned condition and their states, and its CRD.
//! - [`peerpodconfig`]: the `PeerPodConfig` type peer-pod-config-ctrl acts on, and its CRD.
//! - [`keys`]: names more than one component spells: the extended resource, cloud-api-adaptor's ConfigMap, the
//!   webhook's path, the DRA driver.
//!
//! The controllers own what they do with these types; this crate owns only their shape on the wire.

pub mod keys;
pub mod peerpod;
pub mod peerpodconfig;

mod error;
pub use error::Error;
