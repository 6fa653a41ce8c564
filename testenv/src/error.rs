use std::path::PathBuf;

/// What can go wrong while starting or talking to the local control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("building the control plane with `go build` failed (is Go installed?): {0}")]
    Build(String),
    #[error(
        "building the control plane with `go build` failed (is Go installed?): running go: {source}"
    )]
    RunGo {
        #[source]
        source: std::io::Error,
    },
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
    /// A step of the node's set-up failed because `source` did; `context` (may be empty) says which step.
    #[error("the node: {}", with_context(context, source))]
    NodeStep {
        context: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("this control plane keeps no audit log (start it with Options {{ audit: true, .. }})")]
    AuditOff,
    #[error("reading the audit log: {0}")]
    AuditLog(#[source] serde_json::Error),
}

/// `context: source`, or the source alone without a context.
fn with_context(context: &str, source: &impl std::fmt::Display) -> String {
    if context.is_empty() {
        source.to_string()
    } else {
        format!("{context}: {source}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn wrapped_errors_keep_their_source_and_their_text() {
        let go = Error::RunGo {
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no go here"),
        };
        assert_eq!(
            go.to_string(),
            "building the control plane with `go build` failed (is Go installed?): running go: no go here"
        );
        assert_eq!(
            go.source().map(|s| s.to_string()).as_deref(),
            Some("no go here")
        );

        let step = |context| Error::NodeStep {
            context,
            source: Box::new(std::io::Error::other("bad kind")),
        };
        assert_eq!(
            step("manifest document").to_string(),
            "the node: manifest document: bad kind"
        );
        assert_eq!(step("").to_string(), "the node: bad kind");
        assert!(step("").source().is_some());

        let audit = Error::AuditLog(serde_json::from_str::<u8>("x").unwrap_err());
        assert!(audit.source().is_some(), "{audit}");
    }
}
