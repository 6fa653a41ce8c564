//! Syntax of the instance id cloud-api-adaptor records for GCP: the instance *name* (it creates
//! the VM with a generated name and stores `instance.GetName()` in `PeerPod.spec.instanceID`).
//! Compute Engine names follow RFC 1035: `[a-z]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.

/// Longest instance name Compute Engine accepts.
pub const MAX_LEN: usize = 63;

/// Why `name` cannot be a Compute Engine instance name, or `None` when it can.
pub fn problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("is empty".into());
    }
    if name.len() > MAX_LEN {
        return Some(format!(
            "is {} characters long, at most {MAX_LEN} allowed",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Some(format!(
            "contains {bad:?}: only lowercase letters, digits and hyphens are allowed (RFC 1035)"
        ));
    }
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Some("must start with a lowercase letter (RFC 1035)".into());
    }
    if name.ends_with('-') {
        return Some("must not end with a hyphen (RFC 1035)".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caa_generated_names_are_valid() {
        assert_eq!(problem("podvm-nginx-7f9c4d-a1b2c3d4"), None);
        assert_eq!(problem("a"), None);
        assert_eq!(problem(&"a".repeat(63)), None);
    }

    #[test]
    fn everything_else_is_refused_with_the_reason() {
        assert_eq!(problem(""), Some("is empty".into()));
        assert!(problem(&"a".repeat(64)).is_some_and(|p| p.contains("64 characters")));
        assert!(problem("Podvm").is_some_and(|p| p.contains("'P'")));
        assert!(problem("podvm_1").is_some_and(|p| p.contains("'_'")));
        assert!(problem("1podvm").is_some_and(|p| p.contains("start")));
        assert!(problem("-podvm").is_some_and(|p| p.contains("start")));
        assert!(problem("podvm-").is_some_and(|p| p.contains("end")));
        // A full resource path is not what CAA stores, and a slash would change the URL.
        assert!(problem("projects/p/zones/z/instances/podvm").is_some());
        assert!(problem("i-0123456789abcdef0").is_none()); // syntactically a name, like on GCP
    }
}
