//! Syntax of the instance ids cloud-api-adaptor records in `PeerPod.spec.instanceID` (pure).

use peerpods_provider_core::Error;

/// Why `id` is not a VPC instance id, or `None` when it is one. VPC instance ids are zonal:
/// a four-character zone code, `_`, and a lowercase UUID, e.g.
/// `0717_e21b7391-2ca2-4ab5-84a8-b92157a633b0`.
pub fn vpc_problem(id: &str) -> Option<String> {
    if id.is_empty() {
        return Some("must not be empty".into());
    }
    let Some((zone, uuid)) = id.split_once('_') else {
        return Some(
            "expected <zone code>_<uuid>, like 0717_e21b7391-2ca2-4ab5-84a8-b92157a633b0".into(),
        );
    };
    if zone.len() != 4
        || !zone
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    {
        return Some("the zone code before '_' must be 4 lowercase letters or digits".into());
    }
    if !is_uuid(uuid) || uuid.chars().any(|c| c.is_ascii_uppercase()) {
        return Some("the part after '_' must be a lowercase UUID (8-4-4-4-12 hex digits)".into());
    }
    None
}

/// Why `id` is not a Power Virtual Server instance id (a UUID), or `None` when it is one.
pub fn powervs_problem(id: &str) -> Option<String> {
    if id.is_empty() {
        return Some("must not be empty".into());
    }
    (!is_uuid(id)).then(|| {
        "expected a PowerVS instance UUID (8-4-4-4-12 hex digits), like 2f9d7c66-0c1e-4b7e-9e38-5c2a8f1d3b4a".into()
    })
}

pub use peerpods_provider_core::is_uuid;

/// The refusal of an instance id in which [`vpc_problem`] or [`powervs_problem`] found
/// `problem`, if any; `kind` names what it must be (`an IBM Cloud VPC`).
pub fn check(kind: &str, problem: Option<String>) -> Result<(), Error> {
    match problem {
        None => Ok(()),
        Some(problem) => Err(Error::invalid(
            "instance_id",
            format!("not {kind} instance id: {problem}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vpc_ids_are_zone_code_and_uuid() {
        assert_eq!(
            vpc_problem("0717_e21b7391-2ca2-4ab5-84a8-b92157a633b0"),
            None
        );
        assert_eq!(
            vpc_problem("02u7_e21b7391-2ca2-4ab5-84a8-b92157a633b0"),
            None
        );
        for bad in [
            "",
            "e21b7391-2ca2-4ab5-84a8-b92157a633b0",
            "717_e21b7391-2ca2-4ab5-84a8-b92157a633b0",
            "0717_E21B7391-2CA2-4AB5-84A8-B92157A633B0",
            "0717_e21b7391-2ca2-4ab5-84a8",
            "0717_e21b7391-2ca2-4ab5-84a8-b92157a633b0/../x",
            "i-0123456789abcdef0",
        ] {
            assert!(vpc_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn powervs_ids_are_uuids() {
        assert_eq!(
            powervs_problem("2f9d7c66-0c1e-4b7e-9e38-5c2a8f1d3b4a"),
            None
        );
        for bad in [
            "",
            "0717_e21b7391-2ca2-4ab5-84a8-b92157a633b0",
            "2f9d7c66-0c1e-4b7e-9e38",
            "2f9d7c66-0c1e-4b7e-9e38-5c2a8f1d3b4g",
            "podvm-nginx-1234abcd",
        ] {
            assert!(powervs_problem(bad).is_some(), "{bad:?}");
        }
    }
}
