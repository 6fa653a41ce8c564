//! A local emulator of the Compute Engine endpoints the GCP backend calls, for tests.
//!
//! An axum server on 127.0.0.1 (port 0) on its own thread and tokio runtime, so it outlives
//! any single test runtime and works from sync code; dropping it stops it. It serves exactly:
//!
//! - `DELETE /compute/v1/projects/{project}/zones/{zone}/instances/{instance}` (`instances.delete`)
//! - `GET    /compute/v1/projects/{project}/zones/{zone}/instances/{instance}` (`instances.get`)
//! - `GET    /compute/v1/projects/{project}/zones/{zone}/instances` (`instances.list`: label
//!   filter, `maxResults`, `pageToken`)
//! - `GET    /compute/v1/projects/{project}/zones/{zone}/operations/{operation}` (`zoneOperations.get`)
//! - `GET    /compute/v1/projects/{project}/regions/{region}` (`regions.get`, with quotas)
//!
//! with the resource, `Operation` and error shapes of the published Compute Engine API (the
//! JSON files in `fixtures/`, see the README). Every request must carry what a service-account
//! key produces: a self-signed RS256 JWT; the emulator verifies its signature against the key
//! in `fixtures/service-account-key.json` and answers 401 otherwise, so the real credential
//! code of `google-cloud-auth` runs.

/// The emulated project and the handler that answers each call from it.
mod cloud;
/// [`GcpEmulator`]: the server on its own thread, and what a test makes it do.
mod emulator;
/// `instances.list`'s label filter.
mod filter;
/// The published shapes the emulator answers with, and the keys it trusts.
mod fixtures;
/// Verifying the self-signed RS256 JWT a service-account key makes.
mod jwt;
/// The project, zone and machine type the emulator serves.
mod project;
#[cfg(test)]
mod visibility_tests;

pub use cloud::{OperationFailure, RateRefusal};
pub use emulator::GcpEmulator;
pub use project::{PROJECT, REGION, VCPUS_PER_VM, ZONE};
