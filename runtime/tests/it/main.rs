//! runtime's integration tests, one binary: the admin server over real HTTP, leader fencing, the Event queue and
//! secure metrics against the local control plane, and telemetry end to end.
#![allow(clippy::unwrap_used)] // a test may unwrap (the workspace denies it elsewhere)

mod admin;
#[cfg(feature = "controller")] // the Event queue is behind it
mod events;
#[cfg(feature = "controller")] // the Lease manager is behind it
mod leader;
mod secure_metrics;
mod telemetry;
