//! provider-service: the holder of the controllers' cloud credential (CAA keeps its own, to create VMs).
//!
//! - [`provider`]: the domain (the `Provider` trait and its types), from `peerpods-provider-core`;
//!   each cloud is a crate of its own under `providers/`.
//! - [`backends`]: which backends this binary has (cargo features) and how a name becomes one;
//!   [`registry`]: the configured backends by name, swapped whole on reload.
//! - [`grpc`]: the thin gRPC layer (input limits, conversion, status codes); [`deletes`]: every
//!   delete runs to its end in a detached task, de-duplicated per instance.
//! - [`service`]: the one way to start the whole service (`main.rs`, tests, bench).
//! - [`load`]: the bound on calls in flight (load shedding); [`cache`]: capacity and health
//!   answers cached, one cloud call in flight.
//! - [`server`]: tonic server with health and reflection; [`auth`]: TokenReview + per-method
//!   grants; [`placement`]: callers bound to their node delete only their node's instances;
//!   [`tls`]: rustls with certificate reload.
//! - [`config`] and [`reload`]: cloud-api-adaptor-style configuration from files and env,
//!   reloaded on change.
//! - [`metrics`]: Prometheus metrics. [`Error`]: the one error type (a backend's error or the
//!   server's own: authentication, TLS, nothing to serve), with a stable `reason()`.
//!
//! Modules depend one way: `service` → `server` → `auth`, `grpc` → `registry` → `backends`;
//! `auth` and `grpc` share only [`error`] (the status mapping) and never import each other back.

pub mod auth;
pub mod backends;
pub mod cache;
pub mod deletes;
pub mod error;
pub mod grpc;
pub mod load;
pub mod metrics;
pub mod placement;
pub mod registry;
pub mod reload;
pub mod server;
pub mod service;
pub mod tls;
pub mod token_cache;

pub use error::Error;
pub use peerpods_provider_core::{config, provider};
