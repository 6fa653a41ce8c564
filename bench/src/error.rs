use std::path::PathBuf;

use peerpods_runtime::{Cause, with_cause};

/// Everything that can stop a scenario. [`Error::Missing`] makes the scenario report "skipped"; the rest "failed".
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Something the scenario needs is not installed. `hint` says how to install it (quoting the error that
    /// showed it missing); `source` is that error (the failed spawn of moto's Python or of `go`), if any.
    #[error("{what} is not available ({hint})")]
    Missing {
        what: String,
        hint: String,
        #[source]
        source: Option<Cause>,
    },
    /// A process (moto, a service) could not be started; `message` names the program.
    #[error("starting {name}: {}", with_cause(message, source))]
    Start {
        name: String,
        message: String,
        #[source]
        source: Option<Cause>,
    },
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
    /// An EC2 call failed. The whole chain of the SDK's error is in the text: its top level alone says only
    /// "service error".
    #[error("EC2 (moto): {}", with_chain(message, source))]
    Ec2 {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    #[error("gRPC: {}", with_cause(message, source))]
    Grpc {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    #[error("libvirt: {}", with_cause(message, source))]
    Libvirt {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    #[error("provider-service: {}", with_cause(message, source))]
    Provider {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// Arranging a scenario failed.
    #[error("{}", with_cause(message, source))]
    Setup {
        message: String,
        #[source]
        source: Option<Cause>,
    },
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
            Error::Ec2 { .. } => "Ec2",
            Error::Grpc { .. } => "Grpc",
            Error::Libvirt { .. } => "Libvirt",
            Error::Provider { .. } => "Provider",
            Error::Io { .. } => "Io",
            Error::Setup { .. } => "Setup",
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

    /// [`Error::Setup`] without a cause.
    pub fn setup(message: impl Into<String>) -> Self {
        Error::Setup {
            message: message.into(),
            source: None,
        }
    }

    /// [`Error::Setup`]: `message` says what was being arranged, `source` why it failed.
    pub fn setup_from(message: impl Into<String>, source: impl Into<Cause>) -> Self {
        Error::Setup {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// [`Error::Grpc`] without a cause (an answer that is not the one expected).
    pub fn grpc(message: impl Into<String>) -> Self {
        Error::Grpc {
            message: message.into(),
            source: None,
        }
    }

    /// [`Error::Grpc`]: `message` names the call (empty: the cause says it all), `source` is its error.
    pub fn grpc_from(message: impl Into<String>, source: impl Into<Cause>) -> Self {
        Error::Grpc {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// [`Error::Provider`] without a cause.
    pub fn provider(message: impl Into<String>) -> Self {
        Error::Provider {
            message: message.into(),
            source: None,
        }
    }

    /// [`Error::Provider`]: provider-service (or a backend called directly) failed with `source`.
    pub fn provider_from(message: impl Into<String>, source: impl Into<Cause>) -> Self {
        Error::Provider {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// [`Error::Libvirt`]: `message` names the libvirt call, `source` is its error.
    pub fn libvirt_from(message: impl Into<String>, source: impl Into<Cause>) -> Self {
        Error::Libvirt {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// [`Error::Ec2`]: `message` names the EC2 call, `source` is the SDK's error.
    pub fn ec2_from(message: impl Into<String>, source: impl Into<Cause>) -> Self {
        Error::Ec2 {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

/// `message`, then the text of the cause and of every cause under it, each after `: `.
fn with_chain(message: &str, source: &Option<Cause>) -> String {
    let mut text = message.to_owned();
    let mut next: Option<&(dyn std::error::Error + 'static)> = source.as_deref().map(|s| s as _);
    while let Some(cause) = next {
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    /// An error with a cause of its own, as the AWS SDK's are: its text alone says little.
    #[derive(Debug, thiserror::Error)]
    #[error("service error")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn a_wrapped_error_is_the_source_and_the_text_is_unchanged() {
        let setup = Error::setup_from("building GET /metrics", std::io::Error::other("bad URI"));
        assert_eq!(setup.to_string(), "building GET /metrics: bad URI");
        assert_eq!(
            setup.source().map(ToString::to_string).as_deref(),
            Some("bad URI")
        );
        let grpc = Error::grpc_from("", std::io::Error::other("connection refused"));
        assert_eq!(grpc.to_string(), "gRPC: connection refused");
        assert!(grpc.source().is_some());
        assert!(Error::setup("a service is gone").source().is_none());
    }

    #[test]
    fn an_ec2_error_shows_its_whole_chain() {
        let e = Error::ec2_from(
            "RunInstances",
            Outer(std::io::Error::other("InvalidAMIID.NotFound")),
        );
        assert_eq!(
            e.to_string(),
            "EC2 (moto): RunInstances: service error: InvalidAMIID.NotFound"
        );
        assert_eq!(
            e.source().map(ToString::to_string).as_deref(),
            Some("service error")
        );
    }
}
