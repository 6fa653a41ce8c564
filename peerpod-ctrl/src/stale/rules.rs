//! Pure decisions of stale-PeerPod reaping: which PeerPods of one Pod belong to an earlier sandbox of it. No
//! I/O here.

use kube::ResourceExt;

use crate::cleanup::rules::do_not_delete;
use peerpods_api::peerpod::PeerPod;

/// The UID of the owner marked `controller: true` (CAA sets it to the Pod). PeerPods without one are not
/// part of any "same pod" group.
pub fn controlling_owner_uid(peerpod: &PeerPod) -> Option<&str> {
    peerpod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

/// Among PeerPods of one controlling owner, the ones that are older than the newest and so belong to a dead
/// sandbox of the same Pod. Creation timestamps have one-second granularity: PeerPods created in the same
/// second are indistinguishable, so they are never deleted (a leftover VM is cheaper than killing a live one).
/// PeerPods already being deleted, without a creation timestamp or annotated do-not-delete are never returned.
pub fn stale_peerpods<'a>(group: &[&'a PeerPod]) -> Vec<&'a PeerPod> {
    let Some(newest) = group
        .iter()
        .filter_map(|p| p.metadata.creation_timestamp.as_ref())
        .max()
    else {
        return Vec::new();
    };
    group
        .iter()
        .copied()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && !do_not_delete(p))
        .filter(|p| {
            p.metadata
                .creation_timestamp
                .as_ref()
                .is_some_and(|t| t < newest)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{annotated, deleting, owned_by, peerpod};

    #[test]
    fn controlling_owner_is_the_controller_reference_only() {
        assert_eq!(controlling_owner_uid(&peerpod("a", 0)), None);
        assert_eq!(
            controlling_owner_uid(&owned_by(peerpod("a", 0), "pod-1", Some(true))),
            Some("pod-1")
        );
        assert_eq!(
            controlling_owner_uid(&owned_by(peerpod("a", 0), "pod-1", None)),
            None
        );
    }

    #[test]
    fn strictly_older_peerpods_of_the_same_owner_are_stale() {
        let old = peerpod("old", 0);
        let new = peerpod("new", 5);
        let stale = stale_peerpods(&[&new, &old]);
        assert_eq!(stale.len(), 1);
        assert_eq!(stale[0].name_any(), "old");
    }

    #[test]
    fn equal_creation_timestamps_never_delete() {
        let a = peerpod("a", 3);
        let b = peerpod("b", 3);
        assert!(stale_peerpods(&[&a, &b]).is_empty());
        let older = peerpod("older", 1);
        let names: Vec<_> = stale_peerpods(&[&a, &b, &older])
            .iter()
            .map(|p| p.name_any())
            .collect();
        assert_eq!(names, vec!["older"]);
    }

    #[test]
    fn single_deleting_or_timeless_peerpods_are_not_stale() {
        let only = peerpod("only", 0);
        assert!(stale_peerpods(&[&only]).is_empty());
        let old_deleting = deleting(peerpod("old", 0));
        let new = peerpod("new", 9);
        assert!(stale_peerpods(&[&old_deleting, &new]).is_empty());
        let mut timeless = peerpod("timeless", 0);
        timeless.metadata.creation_timestamp = None;
        assert!(stale_peerpods(&[&timeless, &new]).is_empty());
    }

    #[test]
    fn a_do_not_delete_peerpod_is_never_reaped_as_stale() {
        let old = annotated(peerpod("old", 0), "true");
        let new = peerpod("new", 5);
        assert!(stale_peerpods(&[&old, &new]).is_empty());
        let old = annotated(peerpod("old", 0), "false");
        assert_eq!(stale_peerpods(&[&old, &new]).len(), 1);
    }
}
