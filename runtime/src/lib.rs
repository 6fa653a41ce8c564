//! Shared runtime of the peer-pods services (provider-service and the controllers).
//!
//! - [`telemetry`]: logs, OTLP traces, W3C trace context over gRPC metadata.
//! - [`args`]: the command-line argument groups every binary shares (admin and telemetry, leader election,
//!   watch liveness).
//! - [`binary`]: what every controller binary's `main` does (CRD printing, telemetry, admin server, exit code).
//! - [`admin`]: `/healthz`, `/readyz` and `/metrics` on the admin port.
//! - [`secure_metrics`]: `/metrics` on a TLS port of its own behind TokenReview and SubjectAccessReview.
//! - [`health`]: liveness and readiness of a controller from its watches' progress.
//! - [`backoff`]: the per-object retry policy of the controllers.
//! - [`shutdown`]: one cancellation token for SIGTERM/SIGINT.
//! - [`watch`]: backoff for a failing watch that only progress resets.
//! - [`leader`]: leader election on a Lease; work runs only while leading.
//! - [`status`]: a controller's status writes, by server-side apply under a field manager per writer.
//! - [`events`]: Events queued and written behind the work they describe, as client-go's broadcaster does.
//! - [`tls`]: the TLS listener of the services' ports (handshakes never block accepting) and the TLS version
//!   and cipher settings upstream's webhook takes from its environment.
//! - [`Error`]: the one error type, with a stable `reason()`.
//!
//! The feature `controller` (on by default) adds what only a controller needs: [`leader`] (and with it the Lease
//! manager), the `peerpods_leader` gauge ([`metrics`]), [`status`], [`events`] and [`binary`]. The webhook and
//! provider-service turn it off. The provider-service client is the `peerpods-provider-client` crate.

pub mod admin;
pub mod args;
pub mod backoff;
#[cfg(feature = "controller")]
pub mod binary;
mod error;
#[cfg(feature = "controller")]
pub mod events;
pub mod health;
#[cfg(feature = "controller")]
pub mod leader;
#[cfg(feature = "controller")]
pub mod metrics;
pub mod secure_metrics;
pub mod service;
pub mod shutdown;
#[cfg(feature = "controller")]
pub mod status;
pub mod telemetry;
pub mod tls;
pub mod watch;

pub use error::{Cause, Error, with_cause};
