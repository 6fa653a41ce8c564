//! Pure decisions of the orphan scan: which listed VMs no PeerPod refers to, which carry a do-not-delete tag,
//! and whether a scan may delete the rest. No I/O here.

use std::collections::HashSet;
use std::time::Duration;

use peerpods_proto::marks_do_not_delete;
use peerpods_protocol::decide::DeveloperMode;

use crate::instance::instance_key;
use peerpods_api::peerpod::{CleanedReason, DO_NOT_DELETE, EventReason, PeerPod};

/// Whether a VM's tags (as `ListInstances` reports them) carry `peerpods.io/do-not-delete` or its
/// spelling every cloud allows, `peerpods-do-not-delete` (GCP labels, Azure tags and IBM user tags
/// allow no `/`): the keys provider-service refuses to delete a VM for.
pub fn tags_do_not_delete<'a>(tags: impl IntoIterator<Item = (&'a String, &'a String)>) -> bool {
    tags.into_iter().any(|(k, v)| {
        (k == DO_NOT_DELETE || k == peerpods_proto::DO_NOT_DELETE_PORTABLE)
            && marks_do_not_delete(v)
    })
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
            DeletionRefused::CacheNotSynced => EventReason::PeerPodCacheNotSynced.as_str(),
            // The same hold as a PeerPod's cleanup held by developer mode, in the same word.
            DeletionRefused::DeveloperMode => CleanedReason::DeveloperMode.as_str(),
            DeletionRefused::OverCap { .. } => EventReason::OrphanDeleteCapExceeded.as_str(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{peerpod, time};

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
}
