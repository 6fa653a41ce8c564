//! Provider configuration: cloud-api-adaptor's keys (`CLOUD_PROVIDER`, `AWS_REGION`,
//! `LIBVIRT_URI`, ...) read from directories of files (the mounted `peer-pods-cm` ConfigMap and
//! `peer-pods-secret` Secret), with the process environment as fallback.
//!
//! Values are never logged: `Debug` shows keys only, and secrets are handed out as
//! [`SecretString`], which redacts itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use secrecy::{ExposeSecret, SecretString};

use crate::Error;

/// A snapshot of the configuration. Two snapshots compare equal when every value is equal, which
/// is how a reload tells whether anything changed.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ProviderConfig {
    files: BTreeMap<String, String>,
    env: BTreeMap<String, String>,
    /// Local development: the embedded defaults (libvirt's in-memory test driver) may stand in for
    /// a real cloud. Never from a file or the environment of the snapshot itself: the service's own
    /// switch sets it ([`ProviderConfig::for_development`]).
    development: bool,
}

impl std::fmt::Debug for ProviderConfig {
    // Keys only: any value may be a credential.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("files", &self.files.keys().collect::<Vec<_>>())
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("development", &self.development)
            .finish()
    }
}

impl ProviderConfig {
    /// A config of exactly these keys and values (no environment fallback).
    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        ProviderConfig {
            files: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            env: BTreeMap::new(),
            development: false,
        }
    }

    /// The same configuration with development mode on or off. In development mode, backends may
    /// fall back to embedded defaults that only simulate a cloud (libvirt's `test:` driver); outside
    /// it they refuse them, so a production install never answers from a fake backend.
    pub fn for_development(mut self, development: bool) -> Self {
        self.development = development;
        self
    }

    /// Whether development mode is on (see [`ProviderConfig::for_development`]).
    pub fn is_development(&self) -> bool {
        self.development
    }

    /// Reads every regular file of `dirs` (later directories win) with the process environment as
    /// fallback. File names are keys; a trailing newline is not part of the value. Names starting
    /// with `.` are skipped: Kubernetes keeps its atomic-update bookkeeping (`..data`) there.
    pub fn load(dirs: &[PathBuf]) -> Result<Self, Error> {
        let mut files = BTreeMap::new();
        for dir in dirs {
            read_dir_into(dir, &mut files)?;
        }
        Ok(ProviderConfig {
            files,
            env: std::env::vars().filter(|(k, _)| is_config_key(k)).collect(),
            development: false,
        })
    }

    /// The value of `key`, or `None` when it is unset or empty (cloud-api-adaptor treats an
    /// empty value as "use the default"). Surrounding whitespace is trimmed.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.files
            .get(key)
            .or_else(|| self.env.get(key))
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    /// The value of a credential key, wrapped so it cannot end up in a log by accident.
    pub fn secret(&self, key: &str) -> Option<SecretString> {
        self.get(key).map(|v| SecretString::from(v.to_owned()))
    }
}

/// Environment variables that may configure a provider: upper-case names with an underscore,
/// like cloud-api-adaptor's. This keeps unrelated variables (`PATH`, `HOME`) out of the snapshot.
fn is_config_key(key: &str) -> bool {
    key.contains('_')
        && key
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

fn read_dir_into(dir: &Path, into: &mut BTreeMap<String, String>) -> Result<(), Error> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
        let name = entry.file_name();
        let Some(key) = name.to_str() else { continue };
        if key.starts_with('.') {
            continue;
        }
        let path = entry.path();
        // `metadata` follows symlinks: ConfigMap keys are symlinks into `..data/`.
        let meta = std::fs::metadata(&path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        if !meta.is_file() {
            continue;
        }
        let bytes = std::fs::read(&path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        let value = String::from_utf8(bytes).map_err(|_| Error::Config {
            key: key.to_owned(),
            message: "value is not UTF-8".into(),
        })?;
        into.insert(
            key.to_owned(),
            value.trim_end_matches(['\n', '\r']).to_owned(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_values_count_as_unset() {
        let config = ProviderConfig::from_pairs([("A_B", " "), ("C_D", "x\n")]);
        assert_eq!(config.get("A_B"), None);
        assert_eq!(config.get("C_D"), Some("x"));
        assert_eq!(config.get("E_F"), None);
    }

    #[test]
    fn debug_shows_keys_but_never_values() {
        let config = ProviderConfig::from_pairs([("AWS_SECRET_ACCESS_KEY", "hunter2")]);
        let shown = format!("{config:?} {:?}", config.secret("AWS_SECRET_ACCESS_KEY"));
        assert!(shown.contains("AWS_SECRET_ACCESS_KEY"));
        assert!(!shown.contains("hunter2"));
    }

    #[test]
    fn files_override_and_skip_kubernetes_bookkeeping() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("LIBVIRT_URI"), "test:///default\n").unwrap();
        std::fs::write(dir.path().join("..data"), "ignored").unwrap();
        let config = ProviderConfig::load(&[dir.path().to_owned()]).unwrap();
        assert_eq!(config.get("LIBVIRT_URI"), Some("test:///default"));
        assert!(!format!("{config:?}").contains("..data"));
    }
}
