//! The one error type of this crate. `reason()` is stable: it is used in logs.

use std::path::PathBuf;

/// What stopped the plugin (a bad request never does: it is answered, see [`crate::claims`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A socket file could not be created, removed or listened on; `action` says which step.
    #[error("{action} {}: {source}", path.display())]
    Socket {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Something that is not a socket is where a socket goes: the plugin removes stale sockets of its own, never
    /// other files.
    #[error("{} exists and is not a socket; not removing it", path.display())]
    NotASocket { path: PathBuf },

    /// A gRPC server stopped with an error; `server` names which.
    #[error("{server} server: {source}")]
    Serve {
        server: &'static str,
        #[source]
        source: tonic::transport::Error,
    },
}

impl peerpods_runtime::service::StopReason for Error {
    fn reason(&self) -> &'static str {
        Error::reason(self)
    }
}

impl Error {
    /// A stable, short name of the variant, for logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Socket { .. } => "Socket",
            Error::NotASocket { .. } => "NotASocket",
            Error::Serve { .. } => "Serve",
        }
    }
}
