//! Where the plugin's two sockets are, in the kubelet's layout (as the reference Go helper,
//! k8s.io/dynamic-resource-allocation/kubeletplugin, puts them):
//!
//! - `<kubelet dir>/plugins_registry/<driver>-reg.sock`: the kubelet's plugin watcher watches `plugins_registry`
//!   for new Unix sockets (names starting with `.` are ignored) and calls the registration API on each;
//! - `<kubelet dir>/plugins/<driver>/dra.sock`: the DRA API, at the path the registration answer names. The
//!   kubelet dials that path itself, so it must be the path as the kubelet sees it: the plugin's pod mounts both
//!   directories at the host's paths.
//!
//! A socket left by a plugin that was killed would make binding fail: it is removed first. Removing a socket is
//! also how the plugin deregisters (the watcher sees the file go).

use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use crate::Error;
use crate::driver::DriverName;

/// The two socket paths of a driver's plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    /// The registration socket in the kubelet's plugin registry.
    pub registration: PathBuf,
    /// The DRA socket the kubelet calls prepare and unprepare on.
    pub dra: PathBuf,
}

impl Paths {
    pub fn new(kubelet_dir: &Path, driver: &DriverName) -> Self {
        Paths {
            registration: kubelet_dir
                .join("plugins_registry")
                .join(format!("{driver}-reg.sock")),
            dra: kubelet_dir
                .join("plugins")
                .join(driver.as_str())
                .join("dra.sock"),
        }
    }
}

/// A socket's file, removed when this is dropped (on shutdown and on every error path alike).
#[derive(Debug)]
#[must_use = "the socket file is removed when this is dropped"]
pub struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_file(&self.0)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.0.display(), %error, "removing the socket failed");
        }
    }
}

/// Listens on `path`: creates its directory if needed, removes a stale socket there (and refuses to remove
/// anything else), binds.
pub fn bind(path: &Path) -> Result<(UnixListener, SocketFile), Error> {
    let socket_error = |action, source| Error::Socket {
        action,
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| socket_error("creating the directory of", e))?;
    }
    remove_stale(path)?;
    let listener = UnixListener::bind(path).map_err(|e| socket_error("listening on", e))?;
    Ok((listener, SocketFile(path.to_owned())))
}

fn remove_stale(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::Socket {
            action: "checking for a stale socket at",
            path: path.to_owned(),
            source: e,
        }),
        Ok(meta) if meta.file_type().is_socket() => {
            tracing::info!(path = %path.display(), "removing a stale socket");
            std::fs::remove_file(path).map_err(|e| Error::Socket {
                action: "removing the stale socket",
                path: path.to_owned(),
                source: e,
            })
        }
        Ok(_) => Err(Error::NotASocket {
            path: path.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_the_kubelets() {
        let driver = DriverName::parse("vm.peerpods.io").unwrap();
        let paths = Paths::new(Path::new("/var/lib/kubelet"), &driver);
        assert_eq!(
            paths.registration,
            Path::new("/var/lib/kubelet/plugins_registry/vm.peerpods.io-reg.sock")
        );
        assert_eq!(
            paths.dra,
            Path::new("/var/lib/kubelet/plugins/vm.peerpods.io/dra.sock")
        );
    }
}
