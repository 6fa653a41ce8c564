//! The byom provider's integration tests, one binary: the backend through its `Provider` API against
//! the local control plane, the pool ConfigMap written as cloud-api-adaptor writes it.

mod byom;
mod byom_engine;
mod byom_errors;
mod byom_support;
