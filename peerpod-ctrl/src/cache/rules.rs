//! Pure decisions of the cache: what is kept of a watched PeerPod, and which of its changes need a reconcile.
//! No I/O here.

use std::collections::BTreeSet;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;

use crate::cleanup::rules::do_not_delete;
use peerpods_api::peerpod::{DO_NOT_DELETE, PeerPod, RELEASE};

/// The parts of a PeerPod whose change may need a reconcile: spec (generation), deletion, finalizers and
/// owners. Status is left out on purpose: our own condition updates must not trigger another pass, or a
/// failing cleanup would loop as fast as the API server answers.
pub fn reconcile_trigger_hash(peerpod: &PeerPod) -> u64 {
    let mut hasher = DefaultHasher::new();
    peerpod.metadata.generation.hash(&mut hasher);
    peerpod
        .metadata
        .deletion_timestamp
        .is_some()
        .hash(&mut hasher);
    peerpod.finalizers().hash(&mut hasher);
    // Removing the hold must start the cleanup it held back.
    do_not_delete(peerpod).hash(&mut hasher);
    // Asking for a release (or correcting its value) must act on it.
    peerpod.release_ask().hash(&mut hasher);
    let owners: BTreeSet<&str> = peerpod
        .owner_references()
        .iter()
        .map(|o| o.uid.as_str())
        .collect();
    owners.hash(&mut hasher);
    hasher.finish()
}

/// Whether a PeerPod seen on the watch needs a reconcile, given the version the cache held until then: always
/// when it is new (or recreated under the same name), otherwise only when [`reconcile_trigger_hash`] changed.
/// Comparing with the cached version replaces a predicate filter, which would keep a key and a hash of every
/// PeerPod a second time.
pub fn needs_reconcile(cached: Option<&PeerPod>, seen: &PeerPod) -> bool {
    cached.is_none_or(|cached| {
        cached.metadata.uid != seen.metadata.uid
            || reconcile_trigger_hash(cached) != reconcile_trigger_hash(seen)
    })
}

/// Whether a reconcile of `peerpod` can do anything, given whether another PeerPod shares its controlling
/// owner: a live PeerPod's reconcile only reaps older PeerPods of its Pod and answers a release asked of it,
/// so a live PeerPod alone with its Pod and asked nothing needs none. At a start that is nearly every PeerPod:
/// queued anyway, 10,000 of them filled the controller's queue (a map and a timer wheel that never shrink) for
/// reconciles that did nothing. When a second PeerPod of the Pod comes, its own reconcile reaps the group.
pub fn can_act(peerpod: &PeerPod, shares_owner: bool) -> bool {
    peerpod.metadata.deletion_timestamp.is_some() || peerpod.release_ask().is_some() || shares_owner
}

/// Drops what the controller never reads from a PeerPod before it is cached: managedFields (the largest part),
/// labels and annotations but `peerpods.io/do-not-delete` and `peerpods.io/release` (kubectl's last-applied copy among them; CAA sets
/// none), generateName and selfLink,
/// and of the owner references all but the controlling owner's UID (the Pod's, which groups the PeerPods of one
/// Pod; its kind and name would be three more strings per PeerPod). Taken as `None`, not emptied, so no
/// allocation is kept: with 10,000 PeerPods in the cache, every byte per object is 10 kB.
pub fn keep_what_is_read(peerpod: &mut PeerPod) {
    let meta = &mut peerpod.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    meta.annotations = meta
        .annotations
        .take()
        .map(|mut all| {
            [DO_NOT_DELETE, RELEASE]
                .into_iter()
                .filter_map(|key| all.remove_entry(key))
                .collect::<std::collections::BTreeMap<_, _>>()
        })
        .filter(|kept| !kept.is_empty());
    meta.generate_name = None;
    meta.self_link = None;
    meta.owner_references = meta
        .owner_references
        .take()
        .and_then(|owners| owners.into_iter().find(|o| o.controller == Some(true)))
        .map(|owner| {
            vec![OwnerReference {
                uid: owner.uid,
                controller: Some(true),
                ..OwnerReference::default()
            }]
        });
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::cleanup::rules::{Cleanup, DeveloperMode, Hold, Plan, ReleaseAsk, cleanup, plan};
    use crate::fixtures::{annotated, deleting, owned_by, peerpod};
    use crate::stale::rules::controlling_owner_uid;
    use peerpods_api::peerpod::FINALIZER;

    #[test]
    fn the_cache_keeps_the_hold_and_adding_or_removing_it_triggers() {
        let mut p = annotated(deleting(peerpod("a", 0)), "true");
        p.metadata
            .annotations
            .as_mut()
            .expect("annotated")
            .insert("other".into(), "x".into());
        let before = reconcile_trigger_hash(&p);
        keep_what_is_read(&mut p);
        assert_eq!(
            p.metadata.annotations,
            Some(std::collections::BTreeMap::from([(
                DO_NOT_DELETE.to_string(),
                "true".to_string()
            )]))
        );
        assert_eq!(cleanup(&p), Cleanup::Held);
        assert_eq!(reconcile_trigger_hash(&p), before);
        let mut lifted = p.clone();
        lifted.metadata.annotations = None;
        assert!(needs_reconcile(Some(&p), &lifted));
    }

    #[test]
    fn a_reconcile_acts_on_a_peerpod_being_deleted_asked_for_a_release_or_sharing_its_pod() {
        let live = peerpod("a", 0);
        assert!(!can_act(&live, false), "alone, live, asked nothing");
        assert!(can_act(&live, true), "another PeerPod of its Pod");
        assert!(can_act(&deleting(live.clone()), false));
        let mut asked = live.clone();
        asked.metadata.annotations = Some(std::collections::BTreeMap::from([(
            RELEASE.to_string(),
            "operator".to_string(),
        )]));
        assert!(can_act(&asked, false));
        // What a reconcile of the one left out plans is indeed nothing but looking for older PeerPods.
        assert_eq!(
            plan(&live, None, None, Instant::now(), DeveloperMode::Off),
            Plan::ReapStale
        );
    }

    #[test]
    fn the_release_annotation_is_cached_triggers_and_releases_without_a_delete() {
        let mut p = deleting(peerpod("a", 0));
        let asked = |p: &PeerPod, value: &str| {
            let mut p = p.clone();
            p.metadata
                .annotations
                .get_or_insert_default()
                .insert(RELEASE.into(), value.into());
            p
        };
        let mut operator = asked(&p, "operator");
        assert!(needs_reconcile(Some(&p), &operator));
        assert!(needs_reconcile(Some(&operator), &asked(&p, "oprator")));
        keep_what_is_read(&mut operator);
        assert_eq!(operator.release_ask(), Some(ReleaseAsk::Operator));
        let now = Instant::now();
        assert!(matches!(
            plan(&operator, None, None, now, DeveloperMode::On),
            Plan::ReleaseByOperator { .. }
        ));
        assert_eq!(
            plan(&asked(&p, "oprator"), None, None, now, DeveloperMode::Off),
            Plan::Hold(Hold::UnknownRelease("oprator".into()))
        );
        keep_what_is_read(&mut p);
        assert_eq!(p.release_ask(), None);
        assert!(matches!(
            plan(&p, None, None, now, DeveloperMode::Off),
            Plan::Delete { .. }
        ));
    }

    #[test]
    fn status_only_changes_do_not_trigger() {
        let mut p = peerpod("a", 0);
        let before = reconcile_trigger_hash(&p);
        p.status = Some(peerpods_api::peerpod::PeerPodStatus {
            cleand: true,
            ..Default::default()
        });
        assert_eq!(reconcile_trigger_hash(&p), before);
        let p = deleting(p);
        assert_ne!(reconcile_trigger_hash(&p), before);
    }

    #[test]
    fn the_cache_keeps_what_cleanup_reads() {
        let mut p: PeerPod = serde_json::from_value(serde_json::json!({
            "apiVersion": "confidentialcontainers.org/v1alpha1",
            "kind": "PeerPod",
            "metadata": {
                "name": "web-resource-abcde", "namespace": "default", "uid": "u1",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"a": "b"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "finalizers": [FINALIZER],
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "pod-1", "controller": true}],
                "managedFields": [{"manager": "cloud-api-adaptor", "operation": "Update", "apiVersion": "v1"}]
            },
            "spec": {"cloudProvider": "aws", "instanceID": "i-0123456789abcdef0"}
        }))
        .expect("PeerPod");
        let before = reconcile_trigger_hash(&p);
        keep_what_is_read(&mut p);
        assert!(
            p.metadata.managed_fields.is_none()
                && p.metadata.labels.is_none()
                && p.metadata.annotations.is_none()
        );
        assert_eq!(controlling_owner_uid(&p), Some("pod-1"));
        assert_eq!(p.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(p.spec.instance_id, "i-0123456789abcdef0");
        assert_eq!(p.finalizers(), [FINALIZER.to_string()]);
        assert!(p.metadata.creation_timestamp.is_some());
        assert_eq!(
            reconcile_trigger_hash(&p),
            before,
            "nothing the trigger reads is dropped"
        );
    }

    #[test]
    fn of_the_owners_only_the_controlling_uid_is_kept() {
        let mut p = owned_by(peerpod("a", 0), "pod-1", Some(true));
        let mut owners = p.metadata.owner_references.take().expect("owned");
        owners.insert(
            0,
            OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: "rs".into(),
                uid: "rs-1".into(),
                controller: Some(false),
                block_owner_deletion: None,
            },
        );
        p.metadata.owner_references = Some(owners);
        let decision = cleanup(&deleting(p.clone()));
        keep_what_is_read(&mut p);
        assert_eq!(
            p.owner_references(),
            [OwnerReference {
                uid: "pod-1".into(),
                controller: Some(true),
                ..OwnerReference::default()
            }]
        );
        assert_eq!(cleanup(&deleting(p.clone())), decision);

        let mut unowned = owned_by(peerpod("b", 0), "rs-1", None);
        keep_what_is_read(&mut unowned);
        assert!(unowned.metadata.owner_references.is_none());
    }

    #[test]
    fn new_changed_and_recreated_peerpods_need_a_reconcile_status_updates_do_not() {
        let cached = owned_by(peerpod("a", 0), "pod-1", Some(true));
        assert!(needs_reconcile(None, &cached), "first seen");
        assert!(!needs_reconcile(Some(&cached), &cached), "unchanged");

        let mut status_only = cached.clone();
        status_only.metadata.resource_version = Some("2".into());
        status_only.status = Some(peerpods_api::peerpod::PeerPodStatus {
            cleand: true,
            ..Default::default()
        });
        assert!(!needs_reconcile(Some(&cached), &status_only));

        assert!(needs_reconcile(Some(&cached), &deleting(cached.clone())));
        let mut released = cached.clone();
        released.metadata.finalizers = None;
        assert!(needs_reconcile(Some(&cached), &released));
        let moved = owned_by(peerpod("a", 0), "pod-2", Some(true));
        assert!(needs_reconcile(Some(&cached), &moved));
        let mut recreated = cached.clone();
        recreated.metadata.uid = Some("uid-a-2".into());
        assert!(needs_reconcile(Some(&cached), &recreated));
    }
}
