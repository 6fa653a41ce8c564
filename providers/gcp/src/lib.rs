//! The Google Cloud backend: Compute Engine through the official `google-cloud-compute-v1`
//! client, with `google-cloud-auth` credentials.
//!
//! [`GcpProvider`] is the [`Provider`](peerpods_provider_core::Provider) implementation; the only
//! public entry, with its settings ([`GcpSettings`], [`CredentialSource`]), the settings of its
//! deletions ([`DELETE_POLL_SETTING`], [`NOT_FOUND_WINDOW_SETTING`]) and its `cloud_provider` name
//! ([`NAME`]).

/// Every Compute Engine call, bounded, retried, counted.
mod compute;
/// A service-account key (or another credentials file) or ADC → `google-cloud-auth` credentials.
mod credentials;
/// What a Compute Engine error answer means.
mod failure;
/// Syntax of the instance id (the instance name).
mod instance_name;
/// The label filter of `instances.list` (pure).
mod labels;
/// Reading zone operations (pure).
mod operation;
/// The delete operations this process started and has not seen end.
mod pending;
/// The deletion engine's ports (lookup, delete request); the engine decides what "deleted" means.
mod ports;
/// [`GcpProvider`]: the `Provider` implementation over Compute Engine.
mod provider;
/// Capacity from region quotas (pure).
mod quota;
/// Configuration keys (cloud-api-adaptor's names) → [`GcpSettings`].
mod settings;

pub use provider::{DELETE_POLL_SETTING, GcpProvider, NOT_FOUND_WINDOW_SETTING};
pub use settings::{CredentialSource, GcpSettings, NAME};
