//! Provider configuration: cloud-api-adaptor's keys (`CLOUD_PROVIDER`, `AWS_REGION`,
//! `LIBVIRT_URI`, ...) read from directories of files (the mounted `peer-pods-cm` ConfigMap and
//! `peer-pods-secret` Secret), with the process environment as fallback.
//!
//! Values are never logged: `Debug` shows keys only, and secrets are handed out as
//! [`SecretString`], which redacts itself.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

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

    // Typed getters: every backend reads its numbers, durations and switches through these, so a bad value
    // is refused the same way on every cloud, with an error naming the key and the value. `Ok(None)` is
    // "unset" (the backend's default applies). A value quoted in an error is a number or a switch, never a
    // credential: credentials are read with [`ProviderConfig::secret`].

    /// A whole number of type `T` (`u32`, `u64`, `usize`, ...): digits only, no sign, no unit.
    pub fn number<T: FromStr>(&self, key: &str) -> Result<Option<T>, Error> {
        self.get(key)
            .map(|value| whole_number(key, value, "a whole number"))
            .transpose()
    }

    /// A whole number greater than zero (a count, a rate, a limit that cannot be zero).
    pub fn positive<T: FromStr + Default + PartialEq>(
        &self,
        key: &str,
    ) -> Result<Option<T>, Error> {
        self.get(key)
            .map(|value| {
                let n: T = whole_number(key, value, "a whole number greater than zero")?;
                if n == T::default() {
                    return Err(bad_value(key, value, "a whole number greater than zero"));
                }
                Ok(n)
            })
            .transpose()
    }

    /// A whole number from `range`'s start to its end, both included.
    pub fn number_in<T>(&self, key: &str, range: RangeInclusive<T>) -> Result<Option<T>, Error>
    where
        T: FromStr + PartialOrd + Display,
    {
        let expected = || format!("a whole number from {} to {}", range.start(), range.end());
        self.get(key)
            .map(|value| {
                let n: T = whole_number(key, value, &expected())?;
                if !range.contains(&n) {
                    return Err(bad_value(key, value, &expected()));
                }
                Ok(n)
            })
            .transpose()
    }

    /// A duration given as a whole number of milliseconds (keys ending in `_MS`); zero is allowed.
    pub fn duration_ms(&self, key: &str) -> Result<Option<Duration>, Error> {
        self.get(key)
            .map(|value| {
                whole_number(key, value, "a whole number of milliseconds")
                    .map(Duration::from_millis)
            })
            .transpose()
    }

    /// A duration given as a whole number of seconds (keys ending in `_SECS` or `_SECONDS`); zero is allowed.
    pub fn duration_secs(&self, key: &str) -> Result<Option<Duration>, Error> {
        self.get(key)
            .map(|value| {
                whole_number(key, value, "a whole number of seconds").map(Duration::from_secs)
            })
            .transpose()
    }

    /// A duration of whole milliseconds greater than zero (an interval to wait between polls, a timeout).
    pub fn positive_duration_ms(&self, key: &str) -> Result<Option<Duration>, Error> {
        Ok(self
            .positive_with(key, "a whole number of milliseconds greater than zero")?
            .map(Duration::from_millis))
    }

    /// A duration of whole seconds greater than zero.
    pub fn positive_duration_secs(&self, key: &str) -> Result<Option<Duration>, Error> {
        Ok(self
            .positive_with(key, "a whole number of seconds greater than zero")?
            .map(Duration::from_secs))
    }

    /// A switch, spelt as Go's `strconv.ParseBool` accepts it (cloud-api-adaptor reads its switches so):
    /// `1`, `t`, `T`, `true`, `TRUE`, `True`, and the same for false.
    pub fn flag(&self, key: &str) -> Result<Option<bool>, Error> {
        self.get(key)
            .map(|value| match value {
                "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
                "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
                _ => Err(bad_value(key, value, "true or false")),
            })
            .transpose()
    }

    fn positive_with(&self, key: &str, expected: &str) -> Result<Option<u64>, Error> {
        self.get(key)
            .map(|value| match whole_number::<u64>(key, value, expected)? {
                0 => Err(bad_value(key, value, expected)),
                n => Ok(n),
            })
            .transpose()
    }
}

/// A backend's own settings problem, made from the key a typed getter refused and why.
pub trait SettingsRefusal {
    fn refused(key: &'static str, reason: String) -> Self;
}

/// A typed getter's answer for `key` (`config.number(key)`, `config.positive_duration_ms(key)`,
/// ...) with its refusal as the backend's settings problem `P`: the key and the getter's message.
pub fn typed<T, P: SettingsRefusal>(
    key: &'static str,
    got: Result<Option<T>, Error>,
) -> Result<Option<T>, P> {
    got.map_err(|error| P::refused(key, error.into_config_reason()))
}

/// `value` as a whole number; `FromStr` of the integer types also takes a leading `+`, which no
/// cloud-api-adaptor setting is written with.
fn whole_number<T: FromStr>(key: &str, value: &str, expected: &str) -> Result<T, Error> {
    if !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad_value(key, value, expected));
    }
    value.parse().map_err(|_| bad_value(key, value, expected))
}

/// The error of a typed getter: the key, what it takes, and the value it was given.
fn bad_value(key: &str, value: &str, expected: &str) -> Error {
    Error::config(
        key.to_owned(),
        format!("expected {expected}, got {value:?}"),
    )
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
        let value = String::from_utf8(bytes)
            .map_err(|e| Error::config(key.to_owned(), "value is not UTF-8").with_source(e))?;
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

    /// The message of the getter's error, which must name `key`.
    fn refusal<T: std::fmt::Debug>(result: Result<Option<T>, Error>, key: &str) -> String {
        match result {
            Err(Error::Config {
                key: k, message, ..
            }) if k == key => message,
            other => panic!("expected a config error naming {key}, got {other:?}"),
        }
    }

    #[test]
    fn numbers_are_whole_and_unset_is_none() {
        let config = ProviderConfig::from_pairs([
            ("A_N", "42"),
            ("A_EMPTY", " "),
            ("A_SIGNED", "-1"),
            ("A_PLUS", "+3"),
            ("A_UNIT", "5s"),
            ("A_BIG", "4294967296"),
        ]);
        assert_eq!(config.number::<u32>("A_N").unwrap(), Some(42));
        assert_eq!(config.number::<u32>("A_EMPTY").unwrap(), None);
        assert_eq!(config.number::<u32>("A_UNSET").unwrap(), None);
        assert_eq!(
            refusal(config.number::<u32>("A_SIGNED"), "A_SIGNED"),
            r#"expected a whole number, got "-1""#
        );
        assert_eq!(
            refusal(config.number::<u64>("A_PLUS"), "A_PLUS"),
            r#"expected a whole number, got "+3""#
        );
        assert_eq!(
            refusal(config.number::<u64>("A_UNIT"), "A_UNIT"),
            r#"expected a whole number, got "5s""#
        );
        assert_eq!(
            refusal(config.number::<u32>("A_BIG"), "A_BIG"),
            r#"expected a whole number, got "4294967296""#
        );
        assert_eq!(config.number::<u64>("A_BIG").unwrap(), Some(4_294_967_296));
    }

    #[test]
    fn positive_and_ranged_numbers_name_what_they_take() {
        let config = ProviderConfig::from_pairs([("A_ZERO", "0"), ("A_N", "7")]);
        assert_eq!(
            refusal(config.positive::<u32>("A_ZERO"), "A_ZERO"),
            r#"expected a whole number greater than zero, got "0""#
        );
        assert_eq!(config.positive::<usize>("A_N").unwrap(), Some(7));
        assert_eq!(config.number_in::<u32>("A_N", 1..=10).unwrap(), Some(7));
        assert_eq!(
            refusal(config.number_in::<u32>("A_N", 1..=5), "A_N"),
            r#"expected a whole number from 1 to 5, got "7""#
        );
        assert_eq!(config.number_in::<u32>("A_UNSET", 1..=5).unwrap(), None);
    }

    #[test]
    fn durations_in_their_unit() {
        let config = ProviderConfig::from_pairs([
            ("A_MS", "1500"),
            ("A_SECS", "30"),
            ("A_ZERO", "0"),
            ("A_TEXT", "1m"),
        ]);
        assert_eq!(
            config.duration_ms("A_MS").unwrap(),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            config.duration_secs("A_SECS").unwrap(),
            Some(Duration::from_secs(30))
        );
        assert_eq!(config.duration_ms("A_ZERO").unwrap(), Some(Duration::ZERO));
        assert_eq!(config.duration_secs("A_UNSET").unwrap(), None);
        assert_eq!(
            refusal(config.duration_ms("A_TEXT"), "A_TEXT"),
            r#"expected a whole number of milliseconds, got "1m""#
        );
        assert_eq!(
            refusal(config.duration_secs("A_TEXT"), "A_TEXT"),
            r#"expected a whole number of seconds, got "1m""#
        );
        assert_eq!(
            refusal(config.positive_duration_ms("A_ZERO"), "A_ZERO"),
            r#"expected a whole number of milliseconds greater than zero, got "0""#
        );
        assert_eq!(
            refusal(config.positive_duration_secs("A_ZERO"), "A_ZERO"),
            r#"expected a whole number of seconds greater than zero, got "0""#
        );
        assert_eq!(
            config.positive_duration_secs("A_SECS").unwrap(),
            Some(Duration::from_secs(30))
        );
    }

    #[test]
    fn flags_as_go_parses_them() {
        let config = ProviderConfig::from_pairs([("A_T", "True"), ("A_F", "0"), ("A_Y", "yes")]);
        assert_eq!(config.flag("A_T").unwrap(), Some(true));
        assert_eq!(config.flag("A_F").unwrap(), Some(false));
        assert_eq!(config.flag("A_UNSET").unwrap(), None);
        assert_eq!(
            refusal(config.flag("A_Y"), "A_Y"),
            r#"expected true or false, got "yes""#
        );
        // The whole message as a backend's caller sees it.
        assert_eq!(
            config.flag("A_Y").unwrap_err().to_string(),
            r#"config A_Y: expected true or false, got "yes""#
        );
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
