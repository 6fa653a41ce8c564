//! What the plugin knows about the cluster, as plain values, and the pure decisions made from them: where
//! each PeerPod belongs ([`place`]) and which orphan reports still stand ([`findings`]).

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use peerpods_api::peerpod::{
    CONDITION_CLEANED, CONDITION_INSTANCE_PRESENT, CleanedReason, EventReason,
    INSTANCE_API_VERSION, PeerPodState,
};

/// Everything `status` and `orphans` show.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    pub peerpods: Vec<PeerPodFacts>,
    /// Events about Namespaces: the orphan scan records its findings there (see [`findings`]).
    pub scan_events: Vec<EventFacts>,
    /// Nodes that advertise the peer-pods extended resource.
    pub nodes: Vec<NodeCapacity>,
}

/// One PeerPod, as far as the plugin cares.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PeerPodFacts {
    pub namespace: String,
    pub name: String,
    pub provider: String,
    pub instance_id: String,
    /// `metadata.deletionTimestamp`: set once the PeerPod is being deleted.
    pub deleting_since: Option<Timestamp>,
    pub finalizers: Vec<String>,
    pub state: PeerPodState,
    pub reason: Option<String>,
    pub waiting_since: Option<Timestamp>,
    pub last_attempt: Option<Timestamp>,
    pub conditions: Vec<ConditionFacts>,
}

impl PeerPodFacts {
    pub fn condition(&self, type_: &str) -> Option<&ConditionFacts> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Since when this PeerPod has been in its place: how long the cleanup has waited (`status.waitingSince`),
    /// else the last recorded attempt, else when its condition last changed, else when its deletion began.
    pub fn since(&self) -> Option<Timestamp> {
        let condition = match place(self) {
            Place::ReverseOrphan => self.condition(CONDITION_INSTANCE_PRESENT),
            _ => self.condition(CONDITION_CLEANED),
        };
        self.waiting_since
            .or(self.last_attempt)
            .or(condition.and_then(|c| c.since))
            .or(self.deleting_since)
    }
}

/// One status condition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConditionFacts {
    pub type_: String,
    pub status: String,
    pub reason: String,
    /// For the Cleaned condition, what provider-service answered.
    pub message: String,
    pub since: Option<Timestamp>,
}

/// One Event (core/v1 view, which also shows those written through events.k8s.io/v1).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventFacts {
    pub namespace: String,
    pub type_: String,
    pub reason: String,
    pub message: String,
    /// The latest time the Event was observed.
    pub time: Option<Timestamp>,
    pub count: i32,
    /// The related object's `apiVersion` and `name`, if any (orphan Events name the VM there).
    pub related: Option<(String, String)>,
}

/// A Node's `kata.peerpods.io/vm` capacity and allocatable amounts, as Kubernetes quantities.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeCapacity {
    pub name: String,
    pub capacity: Option<String>,
    pub allocatable: Option<String>,
}

/// Where a PeerPod belongs in `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Place {
    /// In use; nothing wrong known.
    Live,
    /// Live, but the cloud confirmed its VM gone (peerpod-ctrl's reverse scan).
    ReverseOrphan,
    /// Being deleted, with nothing recorded by peerpod-ctrl yet (cloud-api-adaptor may still be at it), or
    /// released and about to disappear.
    Terminating,
    /// Being deleted; provider-service is deleting the VM, or the cloud does not show a new VM yet.
    InProgress,
    /// Being deleted; the cleanup failed or is held (see the reason).
    Stuck,
}

/// Where `pp` belongs: its deletion as peerpod-ctrl's Cleaned condition records it, else its state.
pub fn place(pp: &PeerPodFacts) -> Place {
    if pp.deleting_since.is_none() {
        return match pp.state {
            PeerPodState::InstanceMissing => Place::ReverseOrphan,
            _ => Place::Live,
        };
    }
    match pp.condition(CONDITION_CLEANED) {
        // peerpod-ctrl's pending reasons: the VM is not confirmed gone yet, and nobody needs to act.
        Some(c)
            if c.status == "False"
                && matches!(
                    CleanedReason::parse(&c.reason),
                    Some(CleanedReason::DeleteInProgress | CleanedReason::InstanceNotYetVisible)
                ) =>
        {
            Place::InProgress
        }
        Some(c) if c.status == "False" => Place::Stuck,
        _ => Place::Terminating,
    }
}

/// What the orphan scan reported about a VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FindingKind {
    /// No PeerPod refers to it.
    Orphan,
    /// No PeerPod refers to it, but its name is cloud-api-adaptor's for a live Pod: never deleted.
    Adoptable,
}

/// One VM the orphan scan reported, as it stands now.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub provider: String,
    pub instance_id: String,
    pub kind: FindingKind,
    pub last_reported: Option<Timestamp>,
    pub message: String,
}

/// The orphan scan's findings that still stand: per VM the latest report, except for VMs the scan deleted
/// after it and VMs a PeerPod refers to now. Events age out (an hour by default), so a finding older than
/// that is no longer shown.
pub fn findings(events: &[EventFacts], peerpods: &[PeerPodFacts]) -> Vec<Finding> {
    let tracked: BTreeSet<(&str, &str)> = peerpods
        .iter()
        .map(|p| (p.provider.as_str(), p.instance_id.as_str()))
        .collect();
    // Latest Event per VM; deletions count as the latest word too.
    let mut latest: BTreeMap<(String, String), &EventFacts> = BTreeMap::new();
    for event in events {
        let kind_known = matches!(
            EventReason::parse(&event.reason),
            Some(
                EventReason::OrphanInstanceFound
                    | EventReason::AdoptableInstanceFound
                    | EventReason::OrphanInstanceDeleted
            )
        );
        let Some((api_version, name)) = &event.related else {
            continue;
        };
        if !kind_known || api_version != INSTANCE_API_VERSION {
            continue;
        }
        let Some((provider, instance_id)) = name.split_once('/') else {
            continue;
        };
        let key = (provider.to_string(), instance_id.to_string());
        let newer = latest
            .get(&key)
            .is_none_or(|seen| (event.time, &event.reason) > (seen.time, &seen.reason));
        if newer {
            latest.insert(key, event);
        }
    }
    latest
        .into_iter()
        .filter(|((provider, id), _)| !tracked.contains(&(provider.as_str(), id.as_str())))
        .filter_map(|((provider, instance_id), event)| {
            let kind = match EventReason::parse(&event.reason)? {
                EventReason::OrphanInstanceFound => FindingKind::Orphan,
                EventReason::AdoptableInstanceFound => FindingKind::Adoptable,
                EventReason::ReleaseIgnored
                | EventReason::StalePeerPodDeleted
                | EventReason::OrphanInstanceDeleted
                | EventReason::InstanceMatchedByName
                | EventReason::PeerPodCacheNotSynced
                | EventReason::OrphanDeleteCapExceeded => return None,
            };
            Some(Finding {
                provider,
                instance_id,
                kind,
                last_reported: event.time,
                message: event.message.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Option<Timestamp> {
        Some(s.parse().unwrap())
    }

    fn deleting(reason: &str, status: &str) -> PeerPodFacts {
        PeerPodFacts {
            deleting_since: at("2026-01-01T00:00:00Z"),
            conditions: vec![ConditionFacts {
                type_: CONDITION_CLEANED.into(),
                status: status.into(),
                reason: reason.into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_deletion_is_placed_by_its_cleaned_condition() {
        assert_eq!(
            place(&deleting(CleanedReason::DeleteInProgress.as_str(), "False")),
            Place::InProgress
        );
        assert_eq!(
            place(&deleting(
                CleanedReason::InstanceNotYetVisible.as_str(),
                "False"
            )),
            Place::InProgress
        );
        assert_eq!(
            place(&deleting("ProviderUnavailable", "False")),
            Place::Stuck
        );
        assert_eq!(place(&deleting("DoNotDelete", "False")), Place::Stuck);
        assert_eq!(
            place(&deleting("InstanceDeleted", "True")),
            Place::Terminating
        );
        let mut fresh = deleting("", "");
        fresh.conditions.clear();
        assert_eq!(place(&fresh), Place::Terminating);
    }

    #[test]
    fn a_live_peerpod_whose_vm_is_gone_is_a_reverse_orphan() {
        let mut pp = PeerPodFacts::default();
        assert_eq!(place(&pp), Place::Live);
        pp.state = PeerPodState::InstanceMissing;
        assert_eq!(place(&pp), Place::ReverseOrphan);
    }

    #[test]
    fn since_prefers_waiting_since() {
        let mut pp = deleting("ProviderUnavailable", "False");
        pp.last_attempt = at("2026-01-01T00:05:00Z");
        assert_eq!(pp.since(), pp.last_attempt);
        pp.waiting_since = at("2026-01-01T00:01:00Z");
        assert_eq!(pp.since(), pp.waiting_since);
    }

    fn event(reason: &str, vm: &str, time: &str) -> EventFacts {
        EventFacts {
            reason: reason.into(),
            time: at(time),
            related: Some((INSTANCE_API_VERSION.into(), vm.into())),
            ..Default::default()
        }
    }

    #[test]
    fn a_finding_stands_until_deleted_or_tracked() {
        let events = [
            event(
                EventReason::OrphanInstanceFound.as_str(),
                "aws/i-1",
                "2026-01-01T00:00:00Z",
            ),
            event(
                EventReason::OrphanInstanceFound.as_str(),
                "aws/i-2",
                "2026-01-01T00:00:00Z",
            ),
            event(
                EventReason::OrphanInstanceDeleted.as_str(),
                "aws/i-2",
                "2026-01-01T00:01:00Z",
            ),
            event(
                EventReason::AdoptableInstanceFound.as_str(),
                "aws/i-3",
                "2026-01-01T00:00:00Z",
            ),
            event(
                EventReason::OrphanInstanceFound.as_str(),
                "aws/i-4",
                "2026-01-01T00:00:00Z",
            ),
            // Another controller's Event about a Namespace.
            EventFacts {
                reason: EventReason::OrphanInstanceFound.as_str().into(),
                related: Some(("v1".into(), "aws/i-5".into())),
                ..Default::default()
            },
        ];
        let tracked = [PeerPodFacts {
            provider: "aws".into(),
            instance_id: "i-4".into(),
            ..Default::default()
        }];
        let found: Vec<(String, FindingKind)> = findings(&events, &tracked)
            .into_iter()
            .map(|f| (f.instance_id, f.kind))
            .collect();
        assert_eq!(
            found,
            [
                ("i-1".to_string(), FindingKind::Orphan),
                ("i-3".to_string(), FindingKind::Adoptable)
            ]
        );
    }
}
