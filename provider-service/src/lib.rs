//! provider-service: the only holder of cloud credentials in a peer-pods cluster.
//!
//! - [`provider`]: the domain — the `Provider` trait, its types and the registry of backends.
//! - [`libvirt`]: one module per cloud backend; each registers in `provider::build_backend`.
//! - [`grpc`]: the thin gRPC layer (input limits, conversion, status codes).
//! - [`service`]: the one way to start the whole service (`main.rs`, tests, bench).
//! - [`server`]: tonic server with health and reflection; [`auth`]: TokenReview + per-method
//!   grants;
//!   [`tls`]: rustls with certificate reload.
//! - [`config`] and [`reload`]: cloud-api-adaptor-style configuration from files and env,
//!   reloaded on change.
//! - [`metrics`]: Prometheus metrics. [`Error`]: the one error type, with a stable `reason()`.

pub mod auth;
pub mod aws;
pub mod config;
mod error;
pub mod grpc;
pub mod libvirt;
pub mod metrics;
pub mod provider;
pub mod reload;
pub mod server;
pub mod service;
pub mod tls;
// Cloud backends: one module each (declared here), one line each in `provider::build_backend`.

pub use error::Error;
