//! The steps of a delete the VPC and PowerVS backends take alike: before the DELETE, the ownership check on
//! the instance's user tags; after it, the bounded wait until a later lookup confirms the instance gone.

use std::collections::BTreeMap;
use std::future::Future;

use peerpods_provider_core::{Error, OwnerTag};

use crate::cloud::Cloud;
use crate::settings::CallPolicy;
use crate::{tags, wait};

/// Refuses the delete unless `owner` accepts the instance's user tags, read from Global Tagging by its CRN
/// (none without one) on every configuration: an instance tagged do-not-delete is never deleted, and with a
/// cluster tag another cluster's (or an untagged) one is not ours.
pub async fn check_owner(
    cloud: &Cloud,
    tagging_url: &str,
    owner: &OwnerTag,
    instance_id: &str,
    crn: Option<&str>,
) -> Result<(), Error> {
    let tags = match crn {
        Some(crn) => tags::user_tags(cloud, tagging_url, crn).await?,
        None => BTreeMap::new(),
    };
    owner.check(instance_id, &tags)
}

/// Asks `gone` (a lookup of the instance) until it answers gone, within `policy`'s delete timeout (the
/// backend's `cloud.http.policy()`). The instance counts as deleted only once a later lookup says so: one still there at the bound is a
/// retryable `Unavailable` (`what` names the delete), and the next call follows the deletion until a lookup
/// confirms it.
pub async fn confirm_gone<F, Fut>(policy: &CallPolicy, what: &str, gone: F) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, Error>>,
{
    if wait::until_gone(policy.delete_timeout, policy.delete_poll, gone).await? {
        return Ok(());
    }
    Err(Error::unavailable(format!(
        "{what}: still deleting after {} s; ask again in {} s to confirm it gone",
        policy.delete_timeout.as_secs(),
        policy.delete_poll.as_secs().max(1)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn policy(timeout_ms: u64) -> CallPolicy {
        CallPolicy {
            delete_timeout: Duration::from_millis(timeout_ms),
            delete_poll: Duration::from_millis(1),
            ..CallPolicy::default()
        }
    }

    #[tokio::test]
    async fn gone_once_a_lookup_says_so_else_retryable_naming_the_delete() {
        let mut lookups = 0;
        let confirmed = confirm_gone(&policy(10_000), "deleting instance i-1", || {
            lookups += 1;
            let gone = lookups >= 2;
            async move { Ok(gone) }
        })
        .await;
        assert!(confirmed.is_ok(), "{confirmed:?}");
        assert_eq!(lookups, 2);

        let still_there = confirm_gone(&policy(0), "deleting instance i-1", || async { Ok(false) })
            .await
            .expect_err("still there at the bound");
        assert_eq!(
            still_there.to_string(),
            "cloud unavailable: deleting instance i-1: still deleting after 0 s; ask again in 1 s to confirm it gone"
        );
    }
}
