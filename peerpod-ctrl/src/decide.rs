//! Pure decisions: what to do with a PeerPod, how to release the finalizer, which PeerPods are stale, which
//! VMs are orphans. No I/O here, so every rule has a plain unit test. How long to wait before retrying is the
//! runtime's [`Backoff`], shared with peer-pod-config-ctrl.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashSet};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use json_patch::jsonptr::PointerBuf;
use json_patch::{Patch, PatchOperation, RemoveOperation, TestOperation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;

use peerpods_protocol::InstanceKey;
use peerpods_protocol::decide::{self as kernel, Gone, PeerPodFacts, Progress};

pub use peerpods_protocol::decide::{RELEASE, ReleaseAsk};

pub use peerpods_protocol::decide::DeveloperMode;

use crate::crd::{DO_NOT_DELETE, FINALIZER, PeerPod};
use crate::provider::Deleted;
use peerpods_proto::marks_do_not_delete;

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
        release_ask(peerpod).as_ref(),
    )
}

/// What the PeerPod's `peerpods.io/release` annotation asks for, if it carries one.
pub fn release_ask(peerpod: &PeerPod) -> Option<ReleaseAsk> {
    peerpod
        .annotations()
        .get(RELEASE)
        .map(|v| ReleaseAsk::parse(v))
}

/// The key of cloud-api-adaptor's ConfigMap that turns its developer mode on (CAA keeps a failed pod's VM).
pub const DEVELOPER_MODE_KEY: &str = "PODVM_DEVELOPER_MODE";

/// cloud-api-adaptor's developer mode from its ConfigMap (`None`: there is none). A missing ConfigMap or key, or
/// an empty value, is off: CAA's default. A value is read as Go's `strconv.ParseBool` reads it, as CAA does; any
/// other value is unknown (CAA would not start with it), and unknown holds every delete not yet asked for.
pub fn developer_mode(config_map: Option<&k8s_openapi::api::core::v1::ConfigMap>) -> DeveloperMode {
    let value = config_map
        .and_then(|cm| cm.data.as_ref())
        .and_then(|data| data.get(DEVELOPER_MODE_KEY))
        .map(|v| v.trim());
    match value {
        None | Some("") => DeveloperMode::Off,
        Some("1" | "t" | "T" | "TRUE" | "true" | "True") => DeveloperMode::On,
        Some("0" | "f" | "F" | "FALSE" | "false" | "False") => DeveloperMode::Off,
        Some(_) => DeveloperMode::Unknown,
    }
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

/// Whether a VM's tags (as `ListInstances` reports them) carry `peerpods.io/do-not-delete` or its
/// spelling every cloud allows, `peerpods-do-not-delete` (GCP labels, Azure tags and IBM user tags
/// allow no `/`): the keys provider-service refuses to delete a VM for.
pub fn tags_do_not_delete<'a>(tags: impl IntoIterator<Item = (&'a String, &'a String)>) -> bool {
    tags.into_iter().any(|(k, v)| {
        (k == DO_NOT_DELETE || k == peerpods_proto::DO_NOT_DELETE_PORTABLE)
            && marks_do_not_delete(v)
    })
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

/// Key identifying a VM across PeerPods and `ListInstances`: provider plus the id in the cloud's canonical
/// form ([`InstanceKey`]: one comparison rule per cloud, the same everywhere an instance is compared). An
/// unknown provider's ids compare as written (trimmed).
pub fn instance_key(provider: &str, instance_id: &str) -> (String, String) {
    match InstanceKey::parse(provider, instance_id) {
        Some(key) => (key.provider().as_str().to_owned(), key.id().to_owned()),
        None => (provider.trim().to_owned(), instance_id.trim().to_owned()),
    }
}

/// The VMs some PeerPod (live or being deleted) refers to.
pub fn tracked_instances<'a>(
    peerpods: impl IntoIterator<Item = &'a PeerPod>,
) -> HashSet<(String, String)> {
    peerpods
        .into_iter()
        .filter(|p| !p.spec.instance_id.trim().is_empty())
        .map(|p| instance_key(&p.spec.cloud_provider, &p.spec.instance_id))
        .collect()
}

/// A VM as `ListInstances` reports it, with the time we use as its age: the cloud's creation time, or when
/// the provider does not know it, the time this controller first saw the VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vm {
    pub provider: String,
    pub instance_id: String,
    pub name: String,
    pub since: jiff::Timestamp,
    /// Tagged `peerpods.io/do-not-delete`: reported when orphaned, never deleted.
    pub do_not_delete: bool,
}

/// VMs older than `grace` that no PeerPod refers to. The grace period covers cloud-api-adaptor's window
/// between creating a VM and creating its PeerPod.
pub fn orphans<'a>(
    vms: &'a [Vm],
    tracked: &HashSet<(String, String)>,
    now: jiff::Timestamp,
    grace: Duration,
) -> Vec<&'a Vm> {
    vms.iter()
        .filter(|vm| !tracked.contains(&instance_key(&vm.provider, &vm.instance_id)))
        .filter(|vm| {
            now.duration_since(vm.since)
                .try_into()
                .is_ok_and(|age: Duration| age >= grace)
        })
        .collect()
}

/// How many orphan VMs one scan of one provider may delete. A scan finding more deletes none of them: when
/// "everything looks orphaned", the likelier cause is a wrong view of the PeerPods (another cluster's VMs
/// under the same tag, a CRD reinstalled, a watch on the wrong API server), not that many crashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrphanCap {
    /// At most this many.
    pub max: usize,
    /// At most this percentage of the VMs the provider listed with this cluster's tag (0-100).
    pub max_percent: u8,
}

impl Default for OrphanCap {
    /// 10 VMs and half of those listed: a few crashed creations are cleaned, a wholesale misjudgement is not.
    fn default() -> Self {
        OrphanCap {
            max: 10,
            max_percent: 50,
        }
    }
}

/// Why an orphan scan deleted nothing. Not an error of this crate: the scan worked and chose to stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeletionRefused {
    /// The PeerPod cache has not completed its first list: every VM would look orphaned.
    CacheNotSynced,
    /// cloud-api-adaptor's developer mode is on (or unknown): it keeps failed pods' VMs for debugging, some
    /// perhaps before it wrote their PeerPod, so no VM is deleted as an orphan.
    DeveloperMode,
    /// More orphans than the cap allows.
    OverCap {
        orphans: usize,
        known: usize,
        cap: OrphanCap,
    },
}

impl std::fmt::Display for DeletionRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeletionRefused::CacheNotSynced => f.write_str(
                "the PeerPod cache is not synced yet (initial list not done); no VM is deleted before it is",
            ),
            DeletionRefused::DeveloperMode => f.write_str(
                "cloud-api-adaptor's developer mode is on or cannot be read: it keeps failed pods' VMs for \
                 debugging, so no orphan VM is deleted until it is known to be off",
            ),
            DeletionRefused::OverCap {
                orphans,
                known,
                cap,
            } => write!(
                f,
                "{orphans} of {known} listed VMs look orphaned, more than the cap allows (at most {} and {}% \
                 per scan): deleting none in this scan; check that this controller sees this cluster's \
                 PeerPods, or raise --orphan-delete-max / --orphan-delete-max-percent",
                cap.max, cap.max_percent
            ),
        }
    }
}

impl DeletionRefused {
    /// Stable reason for the Event, the log and the metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            DeletionRefused::CacheNotSynced => "PeerPodCacheNotSynced",
            DeletionRefused::DeveloperMode => "DeveloperMode",
            DeletionRefused::OverCap { .. } => "OrphanDeleteCapExceeded",
        }
    }
}

/// Whether a scan may delete `to_delete` orphan VMs out of `known` listed ones: only with a synced PeerPod
/// cache, developer mode known to be off, and within both limits of `cap`. Deleting nothing is always allowed.
pub fn orphan_deletions_allowed(
    synced: bool,
    developer_mode: DeveloperMode,
    to_delete: usize,
    known: usize,
    cap: OrphanCap,
) -> Result<(), DeletionRefused> {
    if to_delete == 0 {
        return Ok(());
    }
    if !synced {
        return Err(DeletionRefused::CacheNotSynced);
    }
    if developer_mode != DeveloperMode::Off {
        return Err(DeletionRefused::DeveloperMode);
    }
    let over_percent =
        to_delete.saturating_mul(100) > usize::from(cap.max_percent).saturating_mul(known);
    if to_delete > cap.max || over_percent {
        return Err(DeletionRefused::OverCap {
            orphans: to_delete,
            known,
            cap,
        });
    }
    Ok(())
}

/// The retry policy lives in the runtime, shared with peer-pod-config-ctrl.
pub use peerpods_runtime::backoff::{Backoff, seed};

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
    release_ask(peerpod).hash(&mut hasher);
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

/// Whether a PeerPod still exists after we remove our finalizer from `finalizers` (another one holds it).
pub fn outlives_release(finalizers: &[String]) -> bool {
    finalizers.iter().any(|f| f != FINALIZER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::PeerPodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn time(secs: i64) -> Time {
        Time(jiff::Timestamp::from_second(1_700_000_000 + secs).expect("valid"))
    }

    fn peerpod(name: &str, created: i64) -> PeerPod {
        let mut p = PeerPod::new(
            name,
            PeerPodSpec {
                cloud_provider: "libvirt".into(),
                instance_id: format!("id-{name}"),
            },
        );
        p.metadata.uid = Some(format!("uid-{name}"));
        p.metadata.creation_timestamp = Some(time(created));
        p.metadata.finalizers = Some(vec![FINALIZER.into()]);
        p
    }

    fn owned_by(mut p: PeerPod, uid: &str, controller: Option<bool>) -> PeerPod {
        p.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: "pod".into(),
            uid: uid.into(),
            controller,
            block_owner_deletion: Some(true),
        }]);
        p
    }

    fn deleting(mut p: PeerPod) -> PeerPod {
        p.metadata.deletion_timestamp = Some(time(100));
        p
    }

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

    fn vm(id: &str, since: i64) -> Vm {
        Vm {
            provider: "libvirt".into(),
            instance_id: id.into(),
            name: format!("podvm-{id}"),
            since: time(since).0,
            do_not_delete: false,
        }
    }

    #[test]
    fn nothing_is_deleted_before_the_cache_is_synced() {
        let cap = OrphanCap::default();
        assert_eq!(
            orphan_deletions_allowed(false, DeveloperMode::Off, 1, 100, cap),
            Err(DeletionRefused::CacheNotSynced)
        );
        assert_eq!(
            orphan_deletions_allowed(false, DeveloperMode::Off, 0, 100, cap),
            Ok(())
        );
        assert_eq!(
            orphan_deletions_allowed(true, DeveloperMode::Off, 1, 100, cap),
            Ok(())
        );
        for mode in [DeveloperMode::On, DeveloperMode::Unknown] {
            let refused = orphan_deletions_allowed(true, mode, 1, 100, cap);
            assert_eq!(refused, Err(DeletionRefused::DeveloperMode));
            assert_eq!(orphan_deletions_allowed(true, mode, 0, 100, cap), Ok(()));
        }
    }

    #[test]
    fn more_orphans_than_either_cap_delete_none() {
        let cap = OrphanCap {
            max: 3,
            max_percent: 50,
        };
        assert_eq!(
            orphan_deletions_allowed(true, DeveloperMode::Off, 3, 6, cap),
            Ok(())
        );
        // Absolute: 4 > 3 even though 4 of 100 is few.
        let refused =
            orphan_deletions_allowed(true, DeveloperMode::Off, 4, 100, cap).expect_err("over max");
        assert_eq!(refused.reason(), "OrphanDeleteCapExceeded");
        assert!(refused.to_string().contains("4 of 100"), "{refused}");
        // Percent: 3 of 5 is 60% > 50%.
        assert!(orphan_deletions_allowed(true, DeveloperMode::Off, 3, 5, cap).is_err());
        // Everything looks orphaned.
        assert!(orphan_deletions_allowed(true, DeveloperMode::Off, 1, 1, cap).is_err());
        // 100% lifts the percentage check.
        let lenient = OrphanCap {
            max: 3,
            max_percent: 100,
        };
        assert_eq!(
            orphan_deletions_allowed(true, DeveloperMode::Off, 2, 2, lenient),
            Ok(())
        );
    }

    #[test]
    fn one_instance_has_one_key_in_every_comparison() {
        // ARM answers an Azure id in another case than CAA wrote it: still the same VM (reverse collection
        // must not flag the live PeerPod as missing, nor an orphan scan its VM).
        assert_eq!(
            instance_key(
                "azure",
                "/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachines/VM"
            ),
            instance_key(
                " azure ",
                "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachines/vm"
            )
        );
        // EC2 ids are exact.
        assert_ne!(instance_key("aws", "i-0ABC"), instance_key("aws", "i-0abc"));
        // Unknown providers compare as written.
        assert_eq!(
            instance_key(" nimbus", " X "),
            ("nimbus".to_string(), "X".to_string())
        );
    }

    #[test]
    fn orphans_are_old_untracked_vms() {
        let tracked = tracked_instances([&peerpod("a", 0)]);
        let vms = vec![vm("ID-A", 0), vm("lost", 0), vm("young", 95)];
        let found = orphans(&vms, &tracked, time(100).0, Duration::from_secs(10));
        let ids: Vec<_> = found.iter().map(|v| v.instance_id.as_str()).collect();
        assert_eq!(ids, vec!["lost"]);
        // Exactly at the grace boundary counts as old enough.
        let found = orphans(&vms, &tracked, time(105).0, Duration::from_secs(10));
        assert_eq!(found.len(), 2);
    }

    #[test]
    fn a_vm_of_another_provider_with_the_same_id_is_not_tracked() {
        let tracked = tracked_instances([&peerpod("a", 0)]);
        let mut other = vm("id-a", 0);
        other.provider = "aws".into();
        let found = orphans(
            std::slice::from_ref(&other),
            &tracked,
            time(100).0,
            Duration::ZERO,
        );
        assert_eq!(found.len(), 1);
    }

    fn named(mut p: PeerPod, provider: &str, instance_id: &str) -> PeerPod {
        p.metadata.namespace = Some("ns".into());
        p.spec.cloud_provider = provider.into();
        p.spec.instance_id = instance_id.into();
        p
    }

    fn annotated(mut p: PeerPod, value: &str) -> PeerPod {
        p.metadata.annotations = Some(std::collections::BTreeMap::from([(
            DO_NOT_DELETE.to_string(),
            value.to_string(),
        )]));
        p
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
    fn a_do_not_delete_peerpod_is_never_reaped_as_stale() {
        let old = annotated(peerpod("old", 0), "true");
        let new = peerpod("new", 5);
        assert!(stale_peerpods(&[&old, &new]).is_empty());
        let old = annotated(peerpod("old", 0), "false");
        assert_eq!(stale_peerpods(&[&old, &new]).len(), 1);
    }

    #[test]
    fn vm_tags_mark_do_not_delete() {
        let tags = |pairs: &[(&str, &str)]| -> std::collections::HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(tags_do_not_delete(&tags(&[(DO_NOT_DELETE, "true")])));
        assert!(tags_do_not_delete(&tags(&[
            ("a", "b"),
            (DO_NOT_DELETE, "")
        ])));
        assert!(!tags_do_not_delete(&tags(&[(DO_NOT_DELETE, "FALSE")])));
        assert!(!tags_do_not_delete(&tags(&[("a", "b")])));
        let portable = peerpods_proto::DO_NOT_DELETE_PORTABLE;
        assert!(tags_do_not_delete(&tags(&[(portable, "true")])));
        assert!(tags_do_not_delete(&tags(&[
            (DO_NOT_DELETE, "false"),
            (portable, "yes")
        ])));
        assert!(!tags_do_not_delete(&tags(&[(portable, "False")])));
    }

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
        assert_eq!(release_ask(&operator), Some(ReleaseAsk::Operator));
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
        assert_eq!(release_ask(&p), None);
        assert!(matches!(
            plan(&p, None, None, now, DeveloperMode::Off),
            Plan::Delete { .. }
        ));
    }

    #[test]
    fn status_only_changes_do_not_trigger() {
        let mut p = peerpod("a", 0);
        let before = reconcile_trigger_hash(&p);
        p.status = Some(crate::crd::PeerPodStatus {
            cleand: true,
            ..Default::default()
        });
        assert_eq!(reconcile_trigger_hash(&p), before);
        let p = deleting(p);
        assert_ne!(reconcile_trigger_hash(&p), before);
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
        status_only.status = Some(crate::crd::PeerPodStatus {
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
    fn developer_mode_is_read_as_caa_reads_it() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let cm = |value: Option<&str>| ConfigMap {
            data: value.map(|v| {
                std::collections::BTreeMap::from([(DEVELOPER_MODE_KEY.to_string(), v.to_string())])
            }),
            ..ConfigMap::default()
        };
        assert_eq!(developer_mode(None), DeveloperMode::Off, "no ConfigMap");
        assert_eq!(
            developer_mode(Some(&cm(None))),
            DeveloperMode::Off,
            "no key"
        );
        for on in ["true", "1", "t", "T", "TRUE", "True", " true "] {
            assert_eq!(
                developer_mode(Some(&cm(Some(on)))),
                DeveloperMode::On,
                "{on:?}"
            );
        }
        for off in ["", "false", "0", "f", "F", "FALSE", "False"] {
            assert_eq!(
                developer_mode(Some(&cm(Some(off)))),
                DeveloperMode::Off,
                "{off:?}"
            );
        }
        for odd in ["yes", "on", "tRUE"] {
            assert_eq!(
                developer_mode(Some(&cm(Some(odd)))),
                DeveloperMode::Unknown,
                "{odd:?}"
            );
        }
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
