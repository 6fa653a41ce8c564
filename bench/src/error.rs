use std::path::PathBuf;

/// Everything that can stop a scenario. [`Error::Missing`] makes the scenario report "skipped"; the rest "failed".
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what} is not available ({hint})")]
    Missing { what: String, hint: String },
    #[error("starting {name}: {message}")]
    Start { name: String, message: String },
    #[error("{name} exited before it was ready ({status}); last lines of {}:\n{tail}", log.display())]
    Exited {
        name: String,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("timed out after {seconds}s waiting for {what}")]
    Timeout { what: String, seconds: u64 },
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("local control plane: {0}")]
    ControlPlane(#[from] testenv::Error),
    #[error("EC2 (moto): {0}")]
    Ec2(String),
    #[error("gRPC: {0}")]
    Grpc(String),
    #[error("libvirt: {0}")]
    Libvirt(String),
    #[error("provider-service: {0}")]
    Provider(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Setup(String),
    #[error("encoding results: {0}")]
    Json(#[from] serde_json::Error),
    #[error("reading a metrics scrape: {0}")]
    Metrics(#[from] test_support::Error),
}

impl Error {
    /// A stable, machine-readable name of the error.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Missing { .. } => "Missing",
            Error::Start { .. } => "StartFailed",
            Error::Exited { .. } => "ExitedEarly",
            Error::Timeout { .. } => "Timeout",
            Error::Kube(_) => "KubeApi",
            Error::ControlPlane(_) => "ControlPlane",
            Error::Ec2(_) => "Ec2",
            Error::Grpc(_) => "Grpc",
            Error::Libvirt(_) => "Libvirt",
            Error::Provider(_) => "Provider",
            Error::Io { .. } => "Io",
            Error::Setup(_) => "Setup",
            Error::Json(_) => "Json",
            Error::Metrics(_) => "Metrics",
        }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}
