//! EC2 instance ids: `i-` followed by 8 (older accounts) or 17 lowercase hex digits.

/// Why an instance id is not an EC2 instance id (user-facing text, names no secret).
pub fn problem(instance_id: &str) -> Option<String> {
    if instance_id.is_empty() {
        return Some("must not be empty".to_owned());
    }
    let Some(hex) = instance_id.strip_prefix("i-") else {
        return Some("must start with \"i-\"".to_owned());
    };
    if !matches!(hex.len(), 8 | 17) {
        return Some(format!(
            "must be \"i-\" followed by 8 or 17 hex digits, got {} characters after \"i-\"",
            hex.len()
        ));
    }
    // EC2 prints ids in lowercase and rejects uppercase ones as malformed.
    if !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Some("must contain only lowercase hex digits after \"i-\"".to_owned());
    }
    None
}

/// Whether `instance_id` is a well-formed EC2 instance id.
pub fn is_valid(instance_id: &str) -> bool {
    problem(instance_id).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_short_and_long_ids() {
        assert!(is_valid("i-0123abcd"));
        assert!(is_valid("i-0123456789abcdef0"));
    }

    #[test]
    fn rejects_malformed_ids_with_a_reason() {
        for bad in [
            "",
            "i-",
            "0123456789abcdef0",
            "i-0123456789abcdef",
            "i-0123456789abcdef01",
            "i-0123ABCD",
            "i-0123abcg",
            "vm-0123abcd",
            "i-0123abcd ",
            "i-０123abcd",
        ] {
            assert!(problem(bad).is_some(), "{bad:?} should be rejected");
        }
        assert_eq!(problem("").as_deref(), Some("must not be empty"));
    }
}
