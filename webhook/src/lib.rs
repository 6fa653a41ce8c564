//! peerpods-webhook: the peer-pods mutating admission webhook. A pod of the peer-pods runtime class asks the node
//! for one `kata.peerpods.io/vm` instead of CPU and memory, and carries its size in annotations for the VM.
//!
//! Request → decide → answer:
//! - Decide (pure): [`mutation`] (which pods, what changes, as a JSON patch), [`quantity`] (Kubernetes
//!   quantities and upstream's roundings).
//! - Answer (pure): [`admission`] (AdmissionReview in, AdmissionReview out, malformed requests refused).
//! - Serve: [`server`] (the one way to start it: HTTPS port, health port, certificate polling), [`tls`] (the
//!   serving certificate and its reload), [`listen`] (Go-style listen addresses), [`metrics`].
//! - [`Error`]: the one error type, with a stable `reason()`.

pub mod admission;
mod error;
pub mod listen;
pub mod metrics;
pub mod mutation;
pub mod quantity;
pub mod server;
pub mod tls;

pub use error::Error;
