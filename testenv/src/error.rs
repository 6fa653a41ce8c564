use std::path::PathBuf;

/// What can go wrong while starting or talking to the local control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("building the control plane with `go build` failed (is Go installed?): {0}")]
    Build(String),
    #[error("starting {path}: {source}")]
    Spawn {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the control plane exited before it was ready; last lines of {log}:\n{tail}")]
    Exited { log: PathBuf, tail: String },
    #[error("the control plane was not ready within {0:?}")]
    Timeout(std::time::Duration),
    #[error("reading the kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("building a client: {0}")]
    Client(#[from] kube::Error),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("the node: {0}")]
    Node(String),
    #[error("this control plane keeps no audit log (start it with Options {{ audit: true, .. }})")]
    AuditOff,
    #[error("reading the audit log: {0}")]
    AuditLog(serde_json::Error),
}
