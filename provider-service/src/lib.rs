//! provider-service: the only holder of cloud credentials in a peer-pods cluster.
//!
//! - [`provider`]: the domain — the `Provider` trait, its types and the registry of backends.
//! - [`libvirt`]: one module per cloud backend; each registers in `provider::build_backend`.
//! - [`config`]: cloud-api-adaptor-style configuration from files and env.
//! - [`metrics`]: Prometheus metrics.
//! - [`Error`]: the one error type, with a stable `reason()`.

pub mod config;
mod error;
pub mod libvirt;
pub mod metrics;
pub mod provider;
// Cloud backends: one module each (declared here), one line each in `provider::build_backend`.

pub use error::Error;
