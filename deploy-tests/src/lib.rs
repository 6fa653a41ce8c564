//! Support for the deployment tests (the Helm chart under `deploy/chart`, the images, the Tiltfile).
//!
//! - [`rbac`]: the chart's RBAC as single permissions, and which of them the workloads' requests (from the API
//!   server's audit log) never needed.
//! - [`schemas`]: JSON schemas for kubeconform, made from the API server's own OpenAPI document, so objects
//!   are checked offline against exactly the Kubernetes version (and CRDs) the tests run.

pub mod rbac;
pub mod schemas;

/// What went wrong turning an OpenAPI document into schemas.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The document is not an OpenAPI v2 document with `definitions`.
    #[error("not an OpenAPI v2 document: {0}")]
    NotOpenApi(String),
    /// A `$ref` points at a definition the document does not have.
    #[error("definition {0} is referenced but missing")]
    MissingDefinition(String),
}

impl Error {
    /// Stable, short name of the failure.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::NotOpenApi(_) => "NotOpenApi",
            Error::MissingDefinition(_) => "MissingDefinition",
        }
    }
}
