//! The byom ("bring your own machine") backend: a pool of pre-created machines whose addresses
//! cloud-api-adaptor hands out through a ConfigMap. "Deleting" an instance returns its machine to
//! the pool with CAA's own ConfigMap protocol, so CAA and provider-service can share the pool.
//!
//! [`ByomProvider`] is the [`Provider`](peerpods_provider_core::Provider) implementation; the only
//! public entry, with its settings ([`ByomSettings`], [`ConfigProblem`]), its instance id
//! ([`MachineAddress`]), the pool ConfigMap's key and operation names ([`STATE_KEY`],
//! [`GET_CONFIGMAP`], [`REPLACE_CONFIGMAP`]), a Kubernetes client that keeps the API server's
//! plain-text 429 with its wait ([`client_over`]) and its `cloud_provider` name ([`NAME`]).

/// What a Kubernetes API error means for this backend.
mod failure;
/// The instance id (a machine's IP address) as CAA parses and prints it.
mod machine_address;
/// Every Kubernetes API call on the pool ConfigMap, bounded, retried, counted.
mod pool_configmap;
/// CAA's allocation state JSON and the pure rules applied to it.
mod pool_state;
/// [`ByomProvider`]: the `Provider` implementation over the pool ConfigMap.
mod provider;
/// The deletion engine's ports: read the allocation, release it, confirm by a later read.
mod release;
/// Configuration keys (cloud-api-adaptor's names) → [`ByomSettings`].
mod settings;
/// The API server's plain-text 429, kept with its wait.
mod throttling;

pub use machine_address::MachineAddress;
pub use pool_configmap::{GET_CONFIGMAP, REPLACE_CONFIGMAP};
pub use pool_state::STATE_KEY;
pub use provider::ByomProvider;
pub use settings::{ByomSettings, ConfigProblem, NAME};
pub use throttling::client_over;
