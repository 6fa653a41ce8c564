//! Pure decisions of the cleanup: the one plan for a PeerPod (the protocol's decision kernel, fed with the
//! PeerPod's facts), how to release the finalizer, when to ask provider-service again about a delete in
//! progress. No I/O here, so every rule has a plain unit test. How long to wait before retrying is the
//! runtime's [`Backoff`], shared with peer-pod-config-ctrl.

use std::time::{Duration, Instant};

use json_patch::jsonptr::PointerBuf;
use json_patch::{Patch, PatchOperation, RemoveOperation, TestOperation};
use kube::ResourceExt;
use peerpods_proto::marks_do_not_delete;
use peerpods_protocol::decide::{self as kernel, Gone, PeerPodFacts, Progress};
use peerpods_runtime::backoff::Backoff;

pub use peerpods_protocol::decide::DeveloperMode;
pub use peerpods_protocol::decide::{RELEASE, ReleaseAsk};

use crate::provider::Deleted;
use peerpods_api::peerpod::{DO_NOT_DELETE, FINALIZER, PeerPod};

/// What a PeerPod needs from this controller right now: the protocol's decision kernel, which
/// the model checker runs too.
pub use peerpods_protocol::decide::{Cleanup, Hold};

/// The one thing a reconcile does for a PeerPod, decided once from what is known before it acts (see
/// [`peerpods_protocol::decide::Plan`]). `reconcile` carries the plan out; it never asks again between its
/// own acts.
pub type Plan = peerpods_protocol::decide::Plan<Instant>;

/// The facts of `peerpod` the decision kernel reads.
pub fn facts(peerpod: &PeerPod) -> PeerPodFacts {
    PeerPodFacts {
        uid: peerpod.metadata.uid.clone(),
        name: format!(
            "{}/{}",
            peerpod.namespace().unwrap_or_default(),
            peerpod.name_any()
        ),
        deleting: peerpod.metadata.deletion_timestamp.is_some(),
        finalizer: peerpod.finalizers().iter().any(|f| f == FINALIZER),
        do_not_delete: do_not_delete(peerpod),
        cloud_provider: peerpod.spec.cloud_provider.clone(),
        instance_id: peerpod.spec.instance_id.clone(),
    }
}

/// The cleanup of one PeerPod from its own state ([`kernel::cleanup`]).
pub fn cleanup(peerpod: &PeerPod) -> Cleanup {
    kernel::cleanup(&facts(peerpod))
}

/// [`cleanup`], refined by what else the cache holds: a VM that a live PeerPod (`live_namesakes`, see
/// [`is_live_namesake`]) still names is never deleted; the PeerPod being deleted is released without it.
pub fn cleanup_among<'a>(
    peerpod: &PeerPod,
    live_namesakes: impl IntoIterator<Item = &'a PeerPod>,
) -> Cleanup {
    let others: Vec<PeerPodFacts> = live_namesakes.into_iter().map(facts).collect();
    kernel::cleanup_among(&facts(peerpod), &others)
}

/// Whether `other` is a different PeerPod, not being deleted, that names the same VM as `peerpod` (the same
/// [`InstanceKey`]).
pub fn is_live_namesake(peerpod: &PeerPod, other: &PeerPod) -> bool {
    // Cheap refusals first: this runs over the whole cache for each PeerPod being deleted.
    other.metadata.deletion_timestamp.is_none()
        && !other.spec.instance_id.trim().is_empty()
        && kernel::is_live_namesake(&facts(peerpod), &facts(other))
}

/// A delete provider-service answered "still in progress" for, as this controller remembers it between passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InProgress {
    pub provider: String,
    pub instance_id: String,
    /// When provider-service first answered in progress: the condition says since when it deletes.
    pub since: jiff::Timestamp,
    /// Consecutive in-progress answers, for the backoff.
    pub asks: u32,
    /// Not before this is provider-service asked again.
    pub ask_again_at: Instant,
}

impl InProgress {
    fn progress(&self) -> Progress<Instant> {
        Progress {
            provider: self.provider.clone(),
            instance_id: self.instance_id.clone(),
            ask_again_at: self.ask_again_at,
        }
    }
}

/// The plan for `peerpod` (see [`Plan`]). `live_namesake` is a live PeerPod naming the same VM, if the cache
/// holds one ([`is_live_namesake`]); `progress` what this controller remembers of a delete in progress;
/// `mode` cloud-api-adaptor's developer mode, which holds a delete not yet asked for
/// ([`kernel::under_developer_mode`]).
pub fn plan(
    peerpod: &PeerPod,
    live_namesake: Option<&PeerPod>,
    progress: Option<&InProgress>,
    now: Instant,
    mode: DeveloperMode,
) -> Plan {
    let plan = kernel::plan(
        &facts(peerpod),
        live_namesake.map(facts).as_ref(),
        progress.map(InProgress::progress).as_ref(),
        now,
    );
    // The operator's release comes last: it answers for the VM whatever held the cleanup.
    kernel::under_release_ask(
        kernel::under_developer_mode(plan, mode),
        &facts(peerpod),
        peerpod.release_ask().as_ref(),
    )
}

/// What to remember after provider-service answered "still in progress" at `now`: when to ask again, by the
/// backoff over the consecutive in-progress answers, never sooner than provider-service's `retry_after`.
#[allow(clippy::too_many_arguments)]
pub fn after_in_progress(
    previous: Option<&InProgress>,
    provider: &str,
    instance_id: &str,
    retry_after: Option<Duration>,
    backoff: &Backoff,
    seed: u64,
    now: Instant,
    wall_clock: jiff::Timestamp,
) -> InProgress {
    let previous = previous.filter(|p| p.progress().is_for(provider, instance_id));
    let asks = previous.map_or(1, |p| p.asks.saturating_add(1));
    InProgress {
        provider: provider.to_string(),
        instance_id: instance_id.to_string(),
        since: previous.map_or(wall_clock, |p| p.since),
        asks,
        ask_again_at: now + backoff.delay(asks, false, retry_after, seed),
    }
}

/// How a confirmed end is reported: "already gone" after provider-service said it was deleting the VM is the
/// end of that delete, not a VM someone else removed.
pub fn confirmed(answer: Deleted, in_progress: bool) -> Deleted {
    let gone = match answer {
        Deleted::Deleted => Gone::Deleted,
        Deleted::AlreadyGone => Gone::AlreadyGone,
    };
    match kernel::confirmed(gone, in_progress) {
        Gone::Deleted => Deleted::Deleted,
        Gone::AlreadyGone => Deleted::AlreadyGone,
    }
}

/// Whether the PeerPod carries the `peerpods.io/do-not-delete` annotation (any value but `false`).
pub fn do_not_delete(peerpod: &PeerPod) -> bool {
    peerpod
        .annotations()
        .get(DO_NOT_DELETE)
        .is_some_and(|v| marks_do_not_delete(v))
}

/// A JSON patch removing every `peer.pod/finalizer` entry and nothing else. Each removal is guarded by a
/// `test` of the same index, so the patch fails as a whole when the list changed under us (CAA released the
/// object, someone inserted a finalizer before ours) instead of removing somebody else's finalizer.
/// Indices go from the back so earlier removals do not shift later ones. `None` when there is nothing to remove.
pub fn release_finalizer_patch(finalizers: &[String]) -> Option<Patch> {
    let mut ops = Vec::new();
    for (index, _) in finalizers
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, f)| *f == FINALIZER)
    {
        let path = PointerBuf::from_tokens(["metadata", "finalizers", &index.to_string()]);
        ops.push(PatchOperation::Test(TestOperation {
            path: path.clone(),
            value: serde_json::Value::String(FINALIZER.to_string()),
        }));
        ops.push(PatchOperation::Remove(RemoveOperation { path }));
    }
    (!ops.is_empty()).then_some(Patch(ops))
}

/// Whether a PeerPod still exists after we remove our finalizer from `finalizers` (another one holds it).
pub fn outlives_release(finalizers: &[String]) -> bool {
    finalizers.iter().any(|f| f != FINALIZER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{annotated, deleting, named, peerpod, time};

    #[test]
    fn live_peerpod_needs_no_cleanup() {
        assert_eq!(cleanup(&peerpod("a", 0)), Cleanup::Live);
    }

    #[test]
    fn deleting_with_finalizer_deletes_the_instance() {
        assert_eq!(
            cleanup(&deleting(peerpod("a", 0))),
            Cleanup::DeleteInstance {
                provider: "libvirt".into(),
                instance_id: "id-a".into()
            }
        );
    }

    #[test]
    fn deleting_without_our_finalizer_was_released_by_caa() {
        let mut p = deleting(peerpod("a", 0));
        p.metadata.finalizers = Some(vec!["example.com/other".into()]);
        assert_eq!(cleanup(&p), Cleanup::AlreadyReleased);
        p.metadata.finalizers = None;
        assert_eq!(cleanup(&p), Cleanup::AlreadyReleased);
    }

    #[test]
    fn empty_provider_or_id_is_invalid_not_deleted() {
        let mut p = deleting(peerpod("a", 0));
        p.spec.instance_id = "  ".into();
        assert!(matches!(cleanup(&p), Cleanup::Invalid(m) if m.contains("instanceID")));
        p.spec.instance_id = "x".into();
        p.spec.cloud_provider = String::new();
        assert!(matches!(cleanup(&p), Cleanup::Invalid(m) if m.contains("cloudProvider")));
    }

    #[test]
    fn release_patch_tests_and_removes_only_our_finalizer() {
        let finalizers = vec![
            "a/first".to_string(),
            FINALIZER.to_string(),
            "b/last".to_string(),
        ];
        let patch = release_finalizer_patch(&finalizers).expect("has ours");
        assert_eq!(
            serde_json::to_value(&patch).expect("serializes"),
            serde_json::json!([
                {"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ])
        );
        let mut doc = serde_json::json!({"metadata": {"finalizers": finalizers}});
        json_patch::patch(&mut doc, &patch).expect("applies");
        assert_eq!(
            doc["metadata"]["finalizers"],
            serde_json::json!(["a/first", "b/last"])
        );
    }

    #[test]
    fn release_patch_fails_when_the_list_changed_concurrently() {
        let read = vec!["a/first".to_string(), FINALIZER.to_string()];
        let patch = release_finalizer_patch(&read).expect("has ours");
        // CAA removed every finalizer in the meantime.
        let mut released = serde_json::json!({"metadata": {}});
        assert!(json_patch::patch(&mut released, &patch).is_err());
        // Someone removed the finalizer before ours, so ours moved to index 0.
        let mut shifted = serde_json::json!({"metadata": {"finalizers": [FINALIZER, "z/new"]}});
        assert!(json_patch::patch(&mut shifted, &patch).is_err());
        assert_eq!(
            shifted["metadata"]["finalizers"],
            serde_json::json!([FINALIZER, "z/new"])
        );
    }

    #[test]
    fn release_patch_removes_duplicates_from_the_back() {
        let finalizers = vec![
            FINALIZER.to_string(),
            "x".to_string(),
            FINALIZER.to_string(),
        ];
        let patch = release_finalizer_patch(&finalizers).expect("has ours");
        let mut doc = serde_json::json!({"metadata": {"finalizers": finalizers}});
        json_patch::patch(&mut doc, &patch).expect("applies");
        assert_eq!(doc["metadata"]["finalizers"], serde_json::json!(["x"]));
        assert!(release_finalizer_patch(&["x".to_string()]).is_none());
    }

    #[test]
    fn a_vm_a_live_peerpod_still_names_is_released_without_deleting_it() {
        let deleted = deleting(named(peerpod("restored-from", 0), "libvirt", "vm-1"));
        let live = named(peerpod("restored-to", 5), "libvirt", " VM-1 ");
        assert_eq!(
            cleanup_among(&deleted, [&live]),
            Cleanup::StillReferenced {
                provider: "libvirt".into(),
                instance_id: "vm-1".into(),
                by: "ns/restored-to".into()
            }
        );
        // Without the live one, the VM is deleted as before.
        assert_eq!(
            cleanup_among(&deleted, []),
            Cleanup::DeleteInstance {
                provider: "libvirt".into(),
                instance_id: "vm-1".into()
            }
        );
    }

    #[test]
    fn only_a_different_live_peerpod_of_the_same_provider_keeps_the_vm() {
        let deleted = deleting(named(peerpod("a", 0), "libvirt", "vm-1"));
        let also_deleted = deleting(named(peerpod("b", 0), "libvirt", "vm-1"));
        let other_cloud = named(peerpod("c", 0), "aws", "vm-1");
        let other_vm = named(peerpod("d", 0), "libvirt", "vm-2");
        let mut itself = named(peerpod("a", 0), "libvirt", "vm-1");
        itself.metadata.deletion_timestamp = None;
        for other in [&also_deleted, &other_cloud, &other_vm, &itself] {
            assert!(!is_live_namesake(&deleted, other), "{}", other.name_any());
        }
        assert!(matches!(
            cleanup_among(&deleted, [&also_deleted, &other_cloud, &other_vm, &itself]),
            Cleanup::DeleteInstance { .. }
        ));
    }

    #[test]
    fn do_not_delete_holds_the_cleanup_and_false_does_not() {
        for value in ["true", "", "yes"] {
            let held = annotated(deleting(peerpod("a", 0)), value);
            assert_eq!(cleanup(&held), Cleanup::Held, "{value:?}");
            // The hold wins over a live namesake too: an operator asked to keep everything as it is.
            let live = named(peerpod("b", 0), "libvirt", "id-a");
            assert_eq!(cleanup_among(&held, [&live]), Cleanup::Held);
        }
        let released = annotated(deleting(peerpod("a", 0)), " False ");
        assert!(matches!(cleanup(&released), Cleanup::DeleteInstance { .. }));
        // Without our finalizer there is nothing to hold.
        let mut gone = annotated(deleting(peerpod("a", 0)), "true");
        gone.metadata.finalizers = None;
        assert_eq!(cleanup(&gone), Cleanup::AlreadyReleased);
    }

    #[test]
    fn only_other_finalizers_keep_the_object() {
        assert!(!outlives_release(&[FINALIZER.to_string()]));
        assert!(!outlives_release(&[]));
        assert!(outlives_release(&[
            "example.com/keep".to_string(),
            FINALIZER.to_string()
        ]));
    }

    fn in_progress(p: &PeerPod, ask_again_at: Instant) -> InProgress {
        InProgress {
            provider: p.spec.cloud_provider.clone(),
            instance_id: p.spec.instance_id.clone(),
            since: time(100).0,
            asks: 1,
            ask_again_at,
        }
    }

    #[test]
    fn one_plan_per_peerpod_from_what_is_known() {
        let now = Instant::now();
        assert_eq!(
            plan(&peerpod("a", 0), None, None, now, DeveloperMode::Off),
            Plan::ReapStale
        );
        let mut released = deleting(peerpod("a", 0));
        released.metadata.finalizers = None;
        assert_eq!(
            plan(&released, None, None, now, DeveloperMode::Off),
            Plan::Nothing
        );
        let doomed = deleting(named(peerpod("a", 0), "libvirt", "vm-1"));
        assert_eq!(
            plan(&doomed, None, None, now, DeveloperMode::Off),
            Plan::Delete {
                provider: "libvirt".into(),
                instance_id: "vm-1".into(),
                in_progress: false
            }
        );
        let live = named(peerpod("b", 5), "libvirt", "vm-1");
        assert_eq!(
            plan(&doomed, Some(&live), None, now, DeveloperMode::Off),
            Plan::Release {
                provider: "libvirt".into(),
                instance_id: "vm-1".into(),
                by: "ns/b".into()
            }
        );
        assert_eq!(
            plan(
                &annotated(doomed.clone(), "true"),
                None,
                None,
                now,
                DeveloperMode::Off
            ),
            Plan::Hold(Hold::DoNotDelete)
        );
        let nameless = deleting(named(peerpod("c", 0), "libvirt", " "));
        assert!(matches!(
            plan(&nameless, None, None, now, DeveloperMode::Off),
            Plan::Hold(Hold::Invalid(_))
        ));
        assert!(!Plan::ReapStale.is_cleanup() && !Plan::Nothing.is_cleanup());
        assert!(Plan::Hold(Hold::DoNotDelete).is_cleanup());
    }

    #[test]
    fn a_delete_in_progress_waits_for_its_time_then_asks_again() {
        let now = Instant::now();
        let doomed = deleting(named(peerpod("a", 0), "azure", "vm-1"));
        let later = now + Duration::from_secs(5);
        assert_eq!(
            plan(
                &doomed,
                None,
                Some(&in_progress(&doomed, later)),
                now,
                DeveloperMode::Off
            ),
            Plan::Wait {
                provider: "azure".into(),
                instance_id: "vm-1".into(),
                until: later
            }
        );
        // Due: ask again, knowing provider-service was deleting it.
        assert_eq!(
            plan(
                &doomed,
                None,
                Some(&in_progress(&doomed, now)),
                now,
                DeveloperMode::Off
            ),
            Plan::Delete {
                provider: "azure".into(),
                instance_id: "vm-1".into(),
                in_progress: true
            }
        );
        // What is remembered of another VM (the spec changed) counts for nothing.
        let other = deleting(named(peerpod("a", 0), "azure", "vm-2"));
        assert!(matches!(
            plan(
                &other,
                None,
                Some(&in_progress(&doomed, later)),
                now,
                DeveloperMode::Off
            ),
            Plan::Delete {
                in_progress: false,
                ..
            }
        ));
        // A live namesake and a hold still win over a running delete.
        let live = named(peerpod("b", 5), "azure", "vm-1");
        assert!(matches!(
            plan(
                &doomed,
                Some(&live),
                Some(&in_progress(&doomed, later)),
                now,
                DeveloperMode::Off
            ),
            Plan::Release { .. }
        ));
        assert_eq!(
            plan(
                &annotated(doomed.clone(), "true"),
                None,
                Some(&in_progress(&doomed, later)),
                now,
                DeveloperMode::Off
            ),
            Plan::Hold(Hold::DoNotDelete)
        );
    }

    #[test]
    fn developer_mode_holds_the_delete_of_a_vm_not_yet_asked_for() {
        let now = Instant::now();
        let doomed = deleting(named(peerpod("a", 0), "libvirt", "vm-1"));
        assert_eq!(
            plan(&doomed, None, None, now, DeveloperMode::On),
            Plan::Hold(Hold::DeveloperMode)
        );
        assert_eq!(
            plan(&doomed, None, None, now, DeveloperMode::Unknown),
            Plan::Hold(Hold::DeveloperModeUnknown)
        );
        // A delete provider-service is already running goes on.
        assert!(matches!(
            plan(
                &doomed,
                None,
                Some(&in_progress(&doomed, now)),
                now,
                DeveloperMode::On
            ),
            Plan::Delete {
                in_progress: true,
                ..
            }
        ));
        // The do-not-delete hold keeps its own reason.
        assert_eq!(
            plan(
                &annotated(doomed, "true"),
                None,
                None,
                now,
                DeveloperMode::On
            ),
            Plan::Hold(Hold::DoNotDelete)
        );
    }

    #[test]
    fn in_progress_answers_back_off_and_honour_the_retry_advice() {
        let backoff = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        };
        let now = Instant::now();
        let first = after_in_progress(
            None,
            "azure",
            "vm-1",
            Some(Duration::from_secs(7)),
            &backoff,
            0,
            now,
            time(100).0,
        );
        assert_eq!(first.asks, 1);
        assert_eq!(first.since, time(100).0);
        assert!(
            first.ask_again_at >= now + Duration::from_secs(7),
            "advice honoured"
        );
        let seed = 999_999; // the draw near the top of the range: the exponential shows
        let mut previous = first;
        for expected_asks in 2..=8 {
            let next = after_in_progress(
                Some(&previous),
                "azure",
                "vm-1",
                None,
                &backoff,
                seed,
                now,
                time(200).0,
            );
            assert_eq!(next.asks, expected_asks);
            assert_eq!(next.since, time(100).0, "since the first answer");
            previous = next;
        }
        assert!(previous.ask_again_at > now + Duration::from_secs(59));
        assert!(previous.ask_again_at <= now + backoff.cap, "capped");
        // Another VM starts over.
        let other = after_in_progress(
            Some(&previous),
            "azure",
            "vm-2",
            None,
            &backoff,
            seed,
            now,
            time(300).0,
        );
        assert_eq!((other.asks, other.since), (1, time(300).0));
    }

    #[test]
    fn already_gone_after_in_progress_is_the_delete_finishing() {
        assert_eq!(confirmed(Deleted::AlreadyGone, true), Deleted::Deleted);
        assert_eq!(confirmed(Deleted::AlreadyGone, false), Deleted::AlreadyGone);
        assert_eq!(confirmed(Deleted::Deleted, false), Deleted::Deleted);
    }
}
