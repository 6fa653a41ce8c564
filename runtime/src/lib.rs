//! Shared runtime of the peer-pods services (provider-service and the controllers).
//!
//! - [`telemetry`]: logs, OTLP traces, W3C trace context over gRPC metadata.
//! - [`args`]: the command-line argument groups every binary shares (admin and telemetry, provider-service
//!   client, leader election).
//! - [`binary`]: what every controller binary's `main` does (CRD printing, telemetry, admin server, exit code).
//! - [`admin`]: `/healthz`, `/readyz` and `/metrics` on the admin port.
//! - [`health`]: liveness and readiness of a controller from its watches' progress.
//! - [`backoff`]: the per-object retry policy of the controllers.
//! - [`shutdown`]: one cancellation token for SIGTERM/SIGINT.
//! - [`watch`]: backoff for a failing watch that only progress resets.
//! - [`client`]: the provider-service client (TLS, ServiceAccount token, trace context).
//! - [`leader`]: leader election on a Lease; work runs only while leading.
//! - [`tls`]: the TLS listener of the services' ports (handshakes never block accepting) and the TLS version
//!   and cipher settings upstream's webhook takes from its environment.
//! - [`Error`]: the one error type, with a stable `reason()`.

pub mod admin;
pub mod args;
pub mod backoff;
pub mod binary;
pub mod client;
mod error;
pub mod health;
pub mod leader;
pub mod metrics;
pub mod shutdown;
pub mod telemetry;
pub mod tls;
pub mod watch;

pub use error::Error;
