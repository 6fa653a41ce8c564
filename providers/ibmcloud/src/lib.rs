//! provider-service backends for IBM Cloud: VPC virtual servers (`ibmcloud`) and Power
//! Virtual Server (`ibmcloud-powervs`). IBM has no official Rust SDK: both speak IBM's
//! documented REST APIs through `reqwest` (rustls with ring).
//!
//! - [`IbmCloudVpcProvider`], [`PowerVsProvider`]: the [`Provider`] implementations; the only
//!   public entries, each built with `from_config`.
//! - `settings`: configuration keys (cloud-api-adaptor's names) → settings.
//! - `instance_id`: syntax of VPC and PowerVS instance ids.
//! - `iam`: API key → bearer token, cached and refreshed; shared by both backends.
//! - `http`: every call, bounded, retried, counted, its errors mapped and redacted.
//! - `cloud`: `http` with `iam`'s tokens (a refused token exchanged once).
//! - `tags`: user tags from the Global Tagging API.
//! - `search`: the VPC instances of a region with their tags, by Global Search queries.
//! - `backend`: what both backends are made of and the delete they run alike: the deletion
//!   engine's (`peerpods_provider_core::Deleter`), through each backend's lookup and DELETE.
//! - `timestamps`: the APIs' date-times.
//!
//! [`Provider`]: peerpods_provider_core::Provider

mod backend;
mod cloud;
mod http;
mod iam;
mod instance_id;
mod powervs;
mod search;
mod settings;
mod tags;
mod timestamps;
mod vpc;

pub use powervs::PowerVsProvider;
pub use vpc::IbmCloudVpcProvider;

/// The `cloud_provider` names of the two backends.
pub const VPC_NAME: &str = vpc::NAME;
pub const POWERVS_NAME: &str = powervs::NAME;
