//! ECS instance ids, as cloud-api-adaptor writes them into `PeerPod.spec.instanceID`
//! (`RunInstances`' `InstanceIdSets.InstanceIdSet[0]`): `i-` followed by lowercase letters and
//! digits, e.g. `i-bp67acfmxazb4ph3xxxx` or the older `i-23v3vf8h2`.

/// Fewest and most characters ECS ids carry after `i-` (older ids are shorter).
const MIN_LEN: usize = 6;
const MAX_LEN: usize = 32;

/// Why `instance_id` is not an ECS instance id (user-facing, names no secret).
pub fn problem(instance_id: &str) -> Option<String> {
    if instance_id.is_empty() {
        return Some("must not be empty".to_owned());
    }
    let Some(rest) = instance_id.strip_prefix("i-") else {
        return Some("must start with \"i-\"".to_owned());
    };
    if !(MIN_LEN..=MAX_LEN).contains(&rest.len()) {
        return Some(format!(
            "must be \"i-\" followed by {MIN_LEN} to {MAX_LEN} lowercase letters or digits, got {} characters after \"i-\"",
            rest.len()
        ));
    }
    if !rest
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Some("must contain only lowercase letters and digits after \"i-\"".to_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ecs_ids() {
        for good in [
            "i-bp67acfmxazb4ph3xxxx",
            "i-2zeh9atclduxvf1zabcd",
            "i-23v3vf8h2",
        ] {
            assert_eq!(problem(good), None, "{good}");
        }
    }

    #[test]
    fn rejects_everything_else_with_a_reason() {
        for bad in [
            "",
            "i-",
            "bp67acfmxazb4ph3xxxx",
            "i-bp67acfmxazb4p****",
            "i-BP67ACFMXAZB4PH3",
            "i-abc",
            "i-bp67acfmxazb4ph3xxxx ",
            "i-bp67acfmxazb4ph3xxxx-extra",
            "eni-bp67acfmxazb4ph3",
            "i-0123456789abcdef0123456789abcdef0",
        ] {
            assert!(problem(bad).is_some(), "{bad:?} should be rejected");
        }
        assert_eq!(problem("").as_deref(), Some("must not be empty"));
    }
}
