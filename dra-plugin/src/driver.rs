//! The DRA driver name. It names the plugin's files under the kubelet directory, so it is checked before it is
//! used in a path: Kubernetes' own rule for `ResourceSlice.spec.driver` (a DNS subdomain of at most 63
//! characters), which also rules out `/` and `..`.

use std::fmt;

/// The driver the plugin registers; peer-pod-config-ctrl publishes the pool's ResourceSlices under it.
pub const DEFAULT_DRIVER: &str = "vm.peerpods.io";

/// Longest driver name the API server accepts in a ResourceSlice or DeviceClass.
const MAX_LEN: usize = 63;

/// A driver name that passed [`DriverName::parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverName(String);

impl DriverName {
    /// Checks `name` against the API server's rule for driver names: lowercase letters, digits, `-` and `.`,
    /// each dot-separated label starting and ending with a letter or digit, 63 characters at most.
    pub fn parse(name: &str) -> Result<Self, String> {
        if name.is_empty() {
            return Err("a driver name is required".into());
        }
        if name.len() > MAX_LEN {
            return Err(format!(
                "{name:?} is longer than {MAX_LEN} characters (Kubernetes' limit for a DRA driver name)"
            ));
        }
        let label_ok = |label: &str| {
            let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
            label.starts_with(alnum)
                && label.ends_with(alnum)
                && label.chars().all(|c| alnum(c) || c == '-')
        };
        if !name.split('.').all(label_ok) {
            return Err(format!(
                "{name:?} is not a DNS subdomain (lowercase letters, digits, '-' and '.', as Kubernetes requires of a DRA driver name)"
            ));
        }
        Ok(DriverName(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DriverName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_the_driver_peer_pod_config_ctrl_publishes_under() {
        assert_eq!(DEFAULT_DRIVER, peerpods_api::keys::DRA_DRIVER);
    }

    #[test]
    fn the_default_and_other_subdomains_are_driver_names() {
        for name in [DEFAULT_DRIVER, "gpu.example.com", "a", "x-1.y"] {
            assert_eq!(DriverName::parse(name).unwrap().as_str(), name);
        }
    }

    #[test]
    fn names_that_would_escape_or_break_the_kubelet_directory_are_refused() {
        for name in [
            "",
            "../etc",
            "vm/peerpods.io",
            "VM.peerpods.io",
            "vm..peerpods.io",
            ".vm",
            "vm.",
            "-vm",
            "vm_peerpods",
            &"a".repeat(64),
        ] {
            assert!(DriverName::parse(name).is_err(), "{name:?} accepted");
        }
        assert!(DriverName::parse(&"a".repeat(63)).is_ok());
    }
}
