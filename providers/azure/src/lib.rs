//! The Azure backend: Azure Resource Manager through the official `azure_core` pipeline and
//! `azure_identity` credentials.
//!
//! [`AzureProvider`] is the [`Provider`](peerpods_provider_core::Provider) implementation; the
//! only public entry, with its settings ([`AzureSettings`], [`Credentials`]) and its
//! `cloud_provider` name ([`NAME`]).

/// What ARM's answers mean (pure): error bodies, async operations, failures as the crate error.
mod answer;
/// Every ARM call, authenticated, retried, counted.
mod arm;
/// The deletion engine's ports: the ARM calls that look a VM up and delete it and its parts.
mod deletion;
/// Syntax of the VM's ARM resource id (cloud-api-adaptor's instance id).
mod instance_id;
/// [`AzureProvider`]: the `Provider` implementation over Azure Resource Manager.
mod provider;
/// Pure reading of ARM's resource bodies (VMs, network interfaces, usages).
mod resources;
/// Configuration keys (cloud-api-adaptor's names) → [`AzureSettings`].
mod settings;
/// The HTTP client under azure_core's pipeline.
mod transport;

pub use provider::AzureProvider;
pub use settings::{AzureSettings, Credentials, NAME};
