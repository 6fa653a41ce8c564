//! The configuration of the libvirt backend: its keys, their defaults, and what a `LIBVIRT_URI`
//! says about the host it names.

use std::time::Duration;

use peerpods_provider_core::Error;

/// `LIBVIRT_URI` when the configuration sets none, in development mode only
/// ([`ProviderConfig::is_development`](peerpods_provider_core::ProviderConfig::is_development)):
/// libvirt's in-process test driver, so the service runs locally without a hypervisor. Outside
/// development mode `LIBVIRT_URI` is required and `test:` URIs are refused: a simulated host would
/// answer "already gone" for VMs that still run.
pub const DEFAULT_URI: &str = "test:///default";

/// Defaults of `LIBVIRT_CALL_TIMEOUT_SECS` and `LIBVIRT_MAX_BLOCKING_CALLS`.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_MAX_BLOCKING_CALLS: usize = 8;
/// libvirt keepalive of remote connections: a probe every this many seconds...
pub const KEEPALIVE_INTERVAL_SECS: i32 = 5;
/// ...and the connection closed after this many unanswered.
pub const KEEPALIVE_COUNT: u32 = 3;

/// The setting of libvirt's not-found window (whole seconds).
pub const NOT_FOUND_WINDOW_SETTING: &str = "LIBVIRT_NOT_FOUND_WINDOW_SECS";
/// Its default: libvirt is strongly consistent, so a domain it does not know is gone at once.
pub const NOT_FOUND_WINDOW: Duration = Duration::ZERO;
/// The deletion engine's pace: libvirt answers synchronously, so a wait only spaces out the
/// lookups of a domain or volume that stays busy.
pub const PACE: Duration = Duration::from_millis(250);

/// A connection URI needs a scheme (`qemu:///system`, `qemu+ssh://host/system`, `test:///default`).
pub(crate) fn validate_uri(uri: &str) -> Result<(), Error> {
    let scheme_ok = uri.split_once(':').is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '-' || c == '.')
    });
    if scheme_ok {
        Ok(())
    } else {
        Err(Error::config(
            "LIBVIRT_URI",
            "not a libvirt connection URI (e.g. qemu:///system)",
        ))
    }
}

/// Whether `uri` opens libvirt's test driver (`test:///default`, `test:///path/to/host.xml`).
pub(crate) fn is_test_driver(uri: &str) -> bool {
    uri.split_once(':')
        .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("test"))
}

/// Whether `uri` reaches libvirt over a network transport (`qemu+ssh://`, `qemu+tcp://`,
/// `qemu+tls://`, or a URI naming a host), where keepalive matters.
pub(crate) fn is_remote(uri: &str) -> bool {
    let Some((scheme, rest)) = uri.split_once(':') else {
        return false;
    };
    scheme.contains('+')
        || rest
            .strip_prefix("//")
            .is_some_and(|r| !r.is_empty() && !r.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_need_a_scheme() {
        assert!(validate_uri("qemu+ssh://root@192.168.122.1/system?no_verify=1").is_ok());
        assert!(validate_uri("test:///default").is_ok());
        assert!(validate_uri("not a uri").is_err());
        assert!(validate_uri(":///x").is_err());
    }
}
